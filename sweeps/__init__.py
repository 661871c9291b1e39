"""Sweeps: specs and generators, execution on Ray, the sweep store, resume/dedupe, next-round proposals.

    spec.py      YAML spec -> validated runs (grid, isoflop, ladder, random, points; seeds, axes,
                 data axes, WSD cooldown branches); run id = hash of the resolved config
    cooldowns.py WSD-S: stable runs and decay branches from their checkpoints (each its own run)
    dry_run.py   `sweep plan`, the dry run: table of N, D, C, layout, memory, time from measured throughput
    execute.py   one Ray Tune trial per unfinished run; retries resume from checkpoints; resume
                 after a dead driver from the store alone; multi-process runs as a TorchTrainer
    store.py     the on-disk store (atomic files), load_runs -> polars, cross-sweep dedupe and claims
    ray_reaper.py ends a local Ray cluster's processes when the driver that started it is killed
    status.py    runs by state, progress, losses, failures
    propose.py   fit -> backtest -> bootstrap interval at C* -> next round's spec (the closed loop)
    demo.py      `scalelab demo`: the whole loop on a laptop CPU

Store root: the directory holding sweep directories (the parent of `--out`). A run finished in any
sweep of the root is linked into a new sweep that contains it and never trained again.
"""
