"""WSD-S cooldown branches: one long stable run per size, decay branches from its checkpoints.

    cooldowns: {fractions: [0.25, 0.5], max_checkpoints: 32}     # in a sweep spec (WSD schedule)

Each generated run becomes the stable run of its size; for each fraction f a branch of ~f x D
tokens starts from the stable run's checkpoint at (or just before) the branch's own decay start
and decays over its last `schedule.decay_fraction`. Both runs share the absolute warmup
(`schedule.warmup_tokens`), so up to the branch point the lr, weights, optimizer state and data
order are identical (tests/test_sweep_spec.py checks a branch equals the standalone run bit for
bit). The stable run checkpoints every `interval` steps (at most `max_checkpoints` of them) and
keeps them all; branch points are multiples of the interval. A branch's `train.init_from` is
relative to its own run directory (`../<stable id>/checkpoints/step_N`), so the config, and hence
the run id, is the same in every sweep; its `cost_flops` counts only the steps after the branch point.
"""

from __future__ import annotations

import copy
from typing import Any

from scalelab.errors import ConfigError
from scalelab.sweeps.specs.runspec import RunSpec, run_spec_from_tree
from scalelab.sweeps.specs.spec_checks import as_list, check_keys, number


def expand_cooldowns(section: Any, runs: list[RunSpec]) -> list[RunSpec]:
    """Each run becomes a stable run (checkpoints kept at the branch points) plus its branches."""
    check_keys(section, ("fractions", "max_checkpoints"), "cooldowns")
    fracs = sorted(
        number(v, f"cooldowns.fractions[{i}]")
        for i, v in enumerate(as_list(section.get("fractions"), "cooldowns.fractions"))
    )
    if fracs[-1] >= 1:
        raise ConfigError("cooldowns.fractions", f"{fracs[-1]} >= 1", "fractions of the stable run's tokens, each < 1")
    max_ckpts = int(number(section.get("max_checkpoints", 32), "cooldowns.max_checkpoints"))
    out: list[RunSpec] = []
    for run in runs:
        cfg = run.config
        sched, tr = cfg["schedule"], cfg["train"]
        if sched["name"] != "wsd":
            raise ConfigError(
                "cooldowns",
                f"needs schedule.name: wsd (run {run.run_id} uses {sched['name']})",
                "set base.schedule.name: wsd",
            )
        tps = tr["global_batch_tokens"] // cfg["data"]["seq_len"] * cfg["data"]["seq_len"]
        main_steps = run.num_tokens // tps
        warmup = sched["warmup_tokens"] or int(sched["warmup_fraction"] * run.num_tokens)
        decay_frac = sched["decay_fraction"]
        main_decay_start = run.num_tokens - int(decay_frac * run.num_tokens)
        interval = max(1, main_steps // max_ckpts)
        branches = []
        for f in fracs:
            # branch of ~f*D tokens; it leaves the stable run at a checkpoint step at or before its decay start
            start = max(interval, int(f * (1 - decay_frac) * main_steps) // interval * interval)
            steps = start
            while steps * tps - int(decay_frac * steps * tps) < start * tps:
                steps += 1
            if start * tps < warmup or start * tps > main_decay_start or steps >= main_steps:
                raise ConfigError(
                    "cooldowns.fractions",
                    f"{f} puts a branch of run {run.run_id} at step {start}, "
                    "inside the warmup or the stable run's own decay",
                    "use fractions in (warmup, 1 - decay_fraction)",
                )
            branches.append((f, start, steps))
        main_over = dict(run.labels)
        stable_tree = copy.deepcopy(cfg)
        stable_tree["schedule"]["warmup_tokens"] = warmup
        stable_tree["checkpoint"]["interval_steps"] = interval
        stable_tree["checkpoint"]["keep_last"] = 0  # every branch point must survive
        main = run_spec_from_tree(stable_tree, dict(main_over, cooldown="stable"))
        out.append(main)
        for f, start, steps in branches:
            tree = copy.deepcopy(stable_tree)
            tree["train"]["num_tokens"] = steps * tps
            tree["train"]["init_from"] = f"../{main.run_id}/checkpoints/step_{start}"
            tree["checkpoint"]["keep_last"] = 2
            tree["checkpoint"]["interval_steps"] = cfg["checkpoint"]["interval_steps"]
            branch = run_spec_from_tree(
                tree,
                dict(main_over, cooldown="branch", branch_of=main.run_id, branch_fraction=f, branch_step=start),
            )
            branch.depends_on = main.run_id
            branch.cost_flops = branch.flops_6n * (steps - start) / steps
            out.append(branch)
    return out
