"""Sweeps: specs and generators, execution on Ray, the closed loop, studies, tracking.

Store root: the directory holding sweep directories (the parent of `--out`). A run finished in any sweep of the root
is linked into a new sweep that contains it and never trained again.

Where sub-packages import each other (modules never do: `python scripts/code_metrics.py`): specs/ and the owners of
the sections it parses (recipes/, tracking/, studies/), which check their sections with specs/' checks; and
closed_loop/'s `run_rounds`, which runs a study's rounds too, and studies/, which build on the loop's proposals. The
sub-packages:

    specs/        Sweep specs: a YAML file to validated runs, each addressed by the hash of its config.
    recipes/      The small-scale training recipe, its audit and the gates that check it.
    preview/      `scalelab sweep plan`: what a spec would run and cost, nothing started.
    execution/    Running a sweep on Ray: one Tune trial per run, retries that resume.
    tracking/     Watching runs as they train: loss curves, early stopping, W&B.
    closed_loop/  The closed loop: fit the store, check the gates, propose and launch the next round.
    studies/      Studies: arms crossed with one design, each compared with the baseline.
"""
