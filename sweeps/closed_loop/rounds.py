"""The closed loop as one call: launch a sweep, then fit -> gates -> propose -> launch, round after round.

    result = run_rounds(load_sweep("iso.yaml"), "results/iso", spec_text=text, rounds=3, target_flops=1e13)
    result.states                   # every run's state after the last launch
    result.proposals[-1].passed     # the last round's fit passed every identification gate
    result.transfer                 # the LR-transfer gate's outcome (a spec with `transfer:`)
    result.recipe_gate              # the recipe gate's table (a spec with `recipe_gate:`)

`scalelab sweep launch --rounds R` and `scalelab demo` both run this. In order:

1. The LR-transfer gate, when the spec has a `transfer:` section (scalelab.sweeps.recipes.transfer): its
   check trains into the sibling sweep <out>-transfer; a gate that fails refuses the ladder
   (`result.transfer.refused`, nothing of the ladder written) unless `force_transfer`; otherwise
   every run of the ladder takes the transferred LR.
2. The recipe gate, when the spec has a `recipe_gate:` section (scalelab.sweeps.recipes.recipe_gate): a
   design whose runs' LR and weight decay cost more loss than it allows is refused (`result.stopped`,
   nothing written) unless `force_recipe`; so is a later round's proposal (the loop stops there).
3. The sweep's own runs (scalelab.sweeps.execution.execute.launch).
4. Up to R - 1 rounds, each proposed from a fit of everything done so far
   (scalelab.sweeps.closed_loop.propose.propose_round: the runs of a passing fit, or those that would pass its
   failed gates) and launched into the same sweep as proposed - its runs resolved once, by the
   proposer. `until_passed` stops after launching the first round proposed from a passing fit;
   `reopen` first takes up the sweep's latest round when its runs are not all done (or it passed),
   so a loop run again continues where it stopped. No round is proposed after a launch that left
   a run unfinished (failed, its retries spent): `result.stopped` says so. A study (a spec with
   `study:` arms) proposes its rounds with scalelab.sweeps.studies.study_propose instead, at its own target;
   with `decide` every round is a remedy (an arm's gates fail) or the matched decisive measurement,
   which `until_passed` stops after; `reopen` relaunches its latest round when a run of it is not done.

A protocol that sets each round's budget itself (the closed-loop experiments: a round at 10x, then at
30x, the step from what the store has trained) passes `next_round(i, last)`: before round i is
proposed it returns that round's `budget_flops` and `step` (a mapping; a key left out keeps the
call's own), or None to stop; `last` is the round launched before it (None before the first).
`launch_design=False` continues a store grown earlier: the sweep's runs are in it already, so no
gate runs and nothing of the design is launched; the rounds start from the store's records. A
`before_launch` hook that returns False leaves its round unlaunched and stops the loop there (a
protocol that trains a round only when its fit passed).

Each round's fit, gates, proposals and ledger go to W&B as a fit run when W&B is on
(scalelab.sweeps.tracking.wandb_fit.log_rounds; `fit_images` draws its plots). Hooks let a caller print
between the steps: `before_fit(i)` before round i is fitted and proposed, `before_launch(i,
proposal)` before it is launched. `LaunchOptions.trainer` replaces the launcher (default
scalelab.sweeps.execution.execute.launch, Ray): a dry run or a test trains with a simulator of the same
signature (scalelab.analysis.synthetic.synthetic_trainer) through this same loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scalelab import store
from scalelab.errors import UsageError
from scalelab.store import files, objects
from scalelab.store.atomic import atomic_write_bytes
from scalelab.sweeps.closed_loop.proposal import Proposal, latest_round, read_round
from scalelab.sweeps.closed_loop.propose import propose_round
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.recipes.recipe_gate import RecipeGate, check_sweep, format_recipe_gate
from scalelab.sweeps.recipes.transfer import (
    GateResult,
    TransferPlan,
    evaluate_gate,
    format_gate,
    ladder_with_lr,
    plan_transfer,
    transfer_dir,
)
from scalelab.sweeps.specs.spec import Sweep, dump_spec
from scalelab.sweeps.studies.study_propose import is_study, open_study_round, propose_study_round
from scalelab.sweeps.tracking import wandb_fit
from scalelab.sweeps.tracking.wandb_fit import Images
from scalelab.train.local_paths import given_paths

Log = Callable[[str], None]


@dataclass(kw_only=True, slots=True)
class LaunchOptions:
    """Where and how the rounds' runs train (scalelab.sweeps.execution.execute.launch)."""

    address: str | None = None  # an existing Ray cluster; None: a local one
    max_concurrent: int | None = None
    num_cpus: int | None = None  # CPUs of the local Ray
    fault_steps: dict[str, int] = field(default_factory=dict)  # testing: run id -> step it raises once at
    pass_env: list[str] = field(default_factory=list)  # credentials forwarded to a joined cluster (--pass-env)
    trainer: Callable[..., dict] | None = None  # launch's stand-in (module docstring); None: execute.launch
    # the local paths the launcher's own spec names: rounds proposed from the store's records may
    # name no other (scalelab.train.local_paths); None: those of the sweep run_rounds is given
    given: frozenset[str] | None = None


@dataclass(kw_only=True, slots=True)
class TransferOutcome:
    gate: GateResult
    table: str  # format_gate's table (also <out>-transfer/gate.txt)
    refused: bool  # the gate failed and was not forced: the ladder was not launched


@dataclass(kw_only=True)
class RoundsResult:
    states: dict[str, str] = field(default_factory=dict)  # run id -> state after the last launch
    proposals: list[Proposal] = field(default_factory=list)  # the rounds launched, in order
    transfer: TransferOutcome | None = None
    recipe_gate: RecipeGate | None = None  # the last design the recipe gate checked
    stopped: str = ""  # why the loop stopped before its last round ("" when it did not)

    @property
    def ok(self) -> bool:
        """Every run of the last launch finished: done, diverged, or stopped early (store.TERMINAL)."""
        return all(s in store.TERMINAL for s in self.states.values())

    @property
    def transfer_refused(self) -> bool:
        """The LR-transfer gate refused the ladder (nothing of it was written)."""
        return self.transfer is not None and self.transfer.refused

    def recipe_refused(self, force: bool = False) -> bool:
        """The recipe gate refused the design (a refusal `force` overrides does not count)."""
        return self.recipe_gate is not None and not self.recipe_gate.ok and not force

    def exit_code(self, force: bool = False) -> int:
        """What `scalelab sweep launch` exits with: 2 where a gate refused, 0 where every run of the last
        launch finished, 1 where one did not."""
        if self.transfer_refused or self.recipe_refused(force):
            return 2
        return 0 if self.ok else 1


def run_rounds(
    sweep: Sweep,
    sweep_dir: str | Path,
    *,
    spec_text: str,
    spec_name: str = "sweep",
    rounds: int = 1,
    target_flops: float | None = None,
    budget_flops: float | None = None,
    step: float = 3.0,
    seeds: int = 1,
    until_passed: bool = False,
    reopen: bool = False,
    decide: bool = False,
    force_transfer: bool = False,
    force_recipe: bool = False,
    options: LaunchOptions | None = None,
    log: Log = print,
    before_fit: Callable[[int], None] | None = None,
    before_launch: Callable[[int, Proposal], bool | None] | None = None,
    fit_images: Images | None = None,
    next_round: Callable[[int, Proposal | None], dict | None] | None = None,
    launch_design: bool = True,
) -> RoundsResult:
    """Launch `sweep` into `sweep_dir` and run up to `rounds - 1` closed-loop rounds (module docstring).

    One piece: the gates, the design's launch and the rounds, in the module docstring's order, each
    step a call; split, the loop's stopping rules would be read in two places.

    Raises:
        UsageError: rounds < 1; rounds > 1 without a target (target_flops or the spec's
            fit.target_flops); a study's rounds on object storage. All before anything runs.
    """
    options = options or LaunchOptions()
    if options.given is None:
        options = dataclasses.replace(options, given=given_paths(r.config for r in sweep.runs))
    check, target = check_rounds(sweep, sweep_dir, rounds=rounds, target_flops=target_flops)
    out = sweep_dir if objects.is_url(sweep_dir) else Path(sweep_dir)
    result = RoundsResult()
    if not launch_design:
        check = None
    if check is not None:
        result.transfer = _transfer_gate(check, out, spec_name, options, force_transfer, log)
        if result.transfer.refused:
            result.stopped = "the LR-transfer gate refused the ladder"
            return result
        sweep = ladder_with_lr(check, result.transfer.gate.base_lr)
    if launch_design:
        if not _recipe_gate(result, sweep, "the design", force_recipe, log):
            return result
        launched = _launch(sweep, out, spec_text, spec_name, options, log, faults=True)
        result.states = launched["states"]
    for i in range(1, rounds):
        if any(s not in store.TERMINAL for s in result.states.values()):
            result.stopped = "a run did not finish"
            break
        asked = {} if next_round is None else next_round(i, result.proposals[-1] if result.proposals else None)
        if asked is None:
            break
        budget, step_i = asked.get("budget_flops", budget_flops), asked.get("step", step)
        if before_fit is not None:
            before_fit(i)
        if is_study(out):  # a study's round: narrowing runs, remedies, or the decisive measurement
            proposal = (open_study_round(out) if reopen else None) or propose_study_round(
                out, budget_flops=budget, step=step_i, decide=decide, log=log
            )
        else:
            proposal = (_open_round(out) if reopen else None) or propose_round(
                out, target_flops=target, budget_flops=budget, step=step_i, seeds=seeds, log=log
            )
        for wandb_id in wandb_fit.log_rounds(out, images=fit_images, log=log):  # when W&B is on
            log(f"W&B: fit run {wandb_id} (fit, gates, proposals, ledger, plots)")
        if before_launch is not None and before_launch(i, proposal) is False:
            break
        if not _recipe_gate(result, proposal.sweep, f"round {proposal.round}", force_recipe, log, raw=sweep.raw):
            break
        spec_text = files.read_text(proposal.spec_path)
        launched = _launch(proposal.sweep, out, spec_text, files.stem(proposal.spec_path), options, log)
        result.states = launched["states"]
        result.proposals.append(proposal)
        if until_passed and proposal.passed:
            break
    return result


def check_rounds(
    sweep: Sweep, sweep_dir: str | Path, *, rounds: int, target_flops: float | None
) -> tuple[TransferPlan | None, float | None]:
    """(the spec's LR-transfer check or None, the rounds' target C*), or UsageError before anything
    runs: rounds < 1, rounds > 1 without a target, a study's rounds on object storage."""
    if rounds < 1:
        raise UsageError("--rounds must be >= 1")
    check = plan_transfer(sweep.raw, sweep)  # the transfer section is validated here
    target = target_flops or sweep.fit.target_flops or None
    if sweep.study is not None:  # a study's rounds aim at its own target
        target = sweep.study.target_flops
    if rounds > 1 and not target:
        raise UsageError("--rounds > 1 needs --target-flops (or fit.target_flops in the spec)")
    if objects.is_url(sweep_dir) and sweep.study is not None and rounds > 1:
        raise UsageError(f"--out {sweep_dir}: a study's rounds need a local or shared POSIX store; give --rounds 1")
    return check, target


def _launch(sweep: Sweep, out, spec_text: str, spec_name: str, options: LaunchOptions, log: Log, faults=False):
    return (options.trainer or launch)(
        sweep,
        out,
        spec_text=spec_text,
        spec_name=spec_name,
        address=options.address,
        max_concurrent=options.max_concurrent,
        num_cpus=options.num_cpus,
        fault_steps=options.fault_steps if faults else None,
        pass_env=options.pass_env,
        given=options.given,
        log=log,
    )


def _open_round(sweep_dir: str | Path) -> Proposal | None:
    """The sweep's latest round unless its runs are all done and its fit failed (module docstring)."""
    k = latest_round(sweep_dir)
    if not k:
        return None
    last = read_round(sweep_dir, k)
    done = all(store.run_state(store.run_location(sweep_dir, r.run_id)) == "done" for r in last.runs)
    return None if done and not last.passed else last


def _recipe_gate(result: RoundsResult, sweep: Sweep, what: str, force: bool, log: Log, raw=None) -> bool:
    """Check `sweep`'s runs with the recipe gate of its spec (or of `raw`, the loop's spec, for a
    round's runs); False when the gate refuses them and is not forced (result.stopped says why)."""
    gate = check_sweep(sweep, raw=raw)
    if gate is None:
        return True
    result.recipe_gate = gate
    if gate.ok:
        return True
    if force:
        log(format_recipe_gate(gate))
        log(f"the recipe gate refuses {what}; launching it anyway (forced)")
        return True
    result.stopped = f"the recipe gate refused {what}: " + ", ".join(r.run_id for r in gate.over)
    return False


def _transfer_gate(
    check: TransferPlan, out: str | Path, spec_name: str, options: LaunchOptions, force: bool, log: Log
) -> TransferOutcome:
    """Train the LR-transfer check into <out>-transfer and judge it; the table goes to gate.txt."""
    check_dir = transfer_dir(out)
    log(f"LR-transfer check: {len(check.sweep.runs)} runs -> {check_dir}")
    for w in check.warnings:
        log(f"warning: {w}")
    _launch(check.sweep, check_dir, dump_spec(check.sweep.raw), f"{spec_name}-transfer", options, log)
    gate = evaluate_gate(check, store.load_runs(check_dir))
    table = format_gate(gate, check.spec.lrs, check.sweep.fit.loss)
    atomic_write_bytes(files.join(check_dir, "gate.txt"), (table + "\n").encode())
    refused = not gate.ok and not force
    if not refused:
        log(table)
        if not gate.ok:
            log("the gate fails; launching the ladder anyway (forced)")
    return TransferOutcome(gate=gate, table=table, refused=refused)
