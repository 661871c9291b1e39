"""Running a sweep on Ray: one Tune trial per run, retries that resume, dedupe, restart after a dead driver.

    from scalelab.sweeps.execution.execute import launch, resume
    summary = launch(load_sweep("isoflop.yaml"), "results/isoflop", spec_text=..., address=None)
    summary = resume("results/isoflop")          # after the driver died: same runs, same store

How a run is executed. Each run that is not finished becomes one Ray Tune trial of the function
trainable `sweep_trial`, which calls the one-run train function (`scalelab.train.loop.train_run`)
with `resume=True` into `<sweep>/runs/<run_id>/`. Resources per trial come from the run's layout:
`execution.cpus_per_run` CPUs (= `train.num_threads`) and `execution.gpus_per_run` GPUs for a
single-process run; a run whose `parallel.world_size > 1` runs as a Ray Train `TorchTrainer` inside
its trial (its workers request their own resources). `reuse_actors=True` keeps the trial actors
warm between runs (Tune's per-trial overhead drops from ~4 s to ~1.3 s).

Failures. `FailureConfig(max_failures)` retries a trial that raised or whose node died (Ray
notices a lost node within its health-check period); because the trial always
calls `train_run(resume=True)`, a retry continues from the run's latest checkpoint and (training
being deterministic) ends bit for bit where an uninterrupted run would. A per-run file lock
(`runs/<id>/.lock`, fcntl; a lease on object storage: scalelab.store.run_lock) makes a retry or a
resumed sweep wait until a previous process of the same run is gone, so two processes never write
one run. A multi-process run on object storage: the trial holds the lease only, and each of its
ranks trains in a copy on its own node and writes to the store under it (scalelab.store.rank_copy).
The run directory is the store root's one copy of the run (scalelab.store.claims.claim_run), so
the lock also covers sibling sweeps: a
trial whose run another sweep claimed waits for that sweep's trial (holding its Ray slot) and
then finds the run done, or resumes it if that trial died.

A multi-process run's TorchTrainer retries its worker group itself (the same `max_failures`): a
worker lost with its node, or ended by the step watchdog (`execution.hang_factor`,
scalelab.train.watchdog: a step far slower than the run's median, a stuck collective), restarts the
group, which resumes from the latest checkpoint. With `execution.elastic` the trainer asks for
between one replica and the full layout (Ray Train's elastic `num_workers=(min, max)`): after a
node loss the run continues at the dp that fits what is left, with the same global batch
(scalelab.train.elastic), and each attempt's layout is recorded in status.json (`layouts`).

Dedupe and resume: there is no hidden Tune state to restore. The store is the state: a run whose
status.json says done/diverged (here or in a sibling sweep of the store root, see
scalelab.store.claims) is skipped; anything else is started, and resumes from its checkpoints if it
has any. `resume(sweep_dir)` therefore works after any driver death, including SIGKILL.
Cooldown branches run in a second wave, after the stable runs they start from are done; on object
storage a branch first downloads its branch point (the stable run's checkpoint) from the bucket
beside its node-local copy (`_pull_branch_point`).

Every trial appends `start`/`end`/`fail` lines to `<sweep>/events.jsonl` (the node it ran on, the seconds spent in
training: wall `train_s` and, for a one-process run, CPU `train_cpu_s` (scalelab.train.train_clock), and on
`end`/`fail` the checkpoint step the attempt loaded, from the loop's
`loaded_steps` in status.json), which `sweep status` and bench/sweep_overhead.py read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalelab import store
from scalelab.config_tree import from_dict
from scalelab.errors import UsageError
from scalelab.parallel.config import ParallelConfig
from scalelab.store import ledger, objects
from scalelab.store.checkpoint_files import STEP_DIR, list_checkpoints, pull_checkpoint
from scalelab.store.lease import Lease
from scalelab.store.paths import check_run_id
from scalelab.store.run_lock import remove_stale_temp_files, run_lease, run_lock
from scalelab.store.sweep_dir import update_resolved
from scalelab.sweeps.execution import ray_reaper
from scalelab.sweeps.execution.ray_cluster import check_pass_env, local_ray_on_loopback, start_ray
from scalelab.sweeps.execution.ray_secrets import receive_secrets
from scalelab.sweeps.specs.spec import ExecutionConfig, Sweep
from scalelab.sweeps.tracking import early_stop, wandb_fit, wandb_runs
from scalelab.train.config import build_run_config, to_dict
from scalelab.train.elastic import min_world_size
from scalelab.train.identity import current_run_id, same_run
from scalelab.train.launch import ray_train_fn
from scalelab.train.local_paths import check_local_paths, given_paths, in_store, local_paths
from scalelab.train.loggers import WandbRun
from scalelab.train.loop import train_run
from scalelab.train.train_clock import TrainClock
from scalelab.train.watchdog import HangPolicy

Log = Callable[[str], None]
TRIAL_CPU = 0.01  # what the trial of a multi-process run holds itself (Ray rejects empty bundles)


# ---------------------------------------------------------------------------------------------
# The trial (runs inside a Ray worker)
# ---------------------------------------------------------------------------------------------


class InjectedFault(RuntimeError):
    """Raised by the fault-injection hook (tests and `--inject-fault`): a run crash mid-training."""


def _fault_callback(run_dir: Path, fail_at_step: int | None):
    if not fail_at_step:
        return None
    marker = run_dir / ".fault_injected"

    def cb(kind: str, record: dict) -> None:
        if kind == "step" and record["step"] >= fail_at_step and not marker.exists():
            marker.write_text(str(record["step"]))
            raise InjectedFault(f"injected fault at step {record['step']}")

    return cb


# Fault-injection tests: "STEP:PATH" holds every run at STEP (and after) while PATH exists, so a test
# can kill the driver while a run is mid-way without racing the run to its end. Unset in normal use.
_HOLD_ENV = "SCALELAB_TEST_HOLD"


def _hold_callback():
    spec = os.environ.get(_HOLD_ENV)
    if not spec:
        return None
    step, _, path = spec.partition(":")
    hold_step, hold_file = int(step), Path(path)

    def cb(kind: str, record: dict) -> None:
        while kind == "step" and record["step"] >= hold_step and hold_file.exists():
            time.sleep(0.1)

    return cb


def sweep_worker(config: dict[str, Any]) -> None:
    """A Ray Train worker of a sweep's multi-process run: ray_train_fn with the sweep's test hold,
    after the credentials named with --pass-env (scalelab.sweeps.execution.ray_secrets)."""
    receive_secrets()
    ray_train_fn(config, callbacks=[cb for cb in (_hold_callback(),) if cb])


@dataclass(kw_only=True, slots=True)
class TrialArgs:
    """What one Tune trial needs to train one run. It travels in Tune's param space as a plain
    dict (`asdict`; Tune keeps trial configs as JSON), rebuilt by the trial and the resource hook."""

    sweep_dir: str
    run_id: str
    config: dict[str, Any]  # the run's resolved config tree, as sweep.resolved.json holds it
    cpus_per_run: int  # a single-process run: its CPUs (= its torch threads)
    gpus_per_run: float
    cpus_per_worker: int  # a multi-process run: per Ray Train worker
    gpus_per_worker: float
    max_failures: int  # retries; a multi-process run's TorchTrainer restarts its workers this often
    elastic: bool  # a multi-process run may continue at a smaller dp after losing workers
    hang_factor: float  # the step watchdog (scalelab.train.watchdog); 0 = off
    hang_min_s: float
    fail_at_step: int | None = None  # testing: the run raises once at this step

    @classmethod
    def of(cls, trial_config: dict[str, Any]) -> TrialArgs:
        return cls(**trial_config["trial"])


def sweep_trial(trial_config: dict[str, Any]) -> None:
    """Tune function trainable: train one run of the store (resuming whatever is on disk)."""
    import ray
    from ray import tune

    receive_secrets()  # --pass-env credentials on a joined cluster, before the store is touched
    tc = TrialArgs.of(trial_config)
    sweep_dir, run_id = store.location(tc.sweep_dir), tc.run_id
    with _run_home(sweep_dir, tc) as (run_dir, lease):
        state = store.run_state(run_dir)
        if state in store.TERMINAL:  # finished by an earlier attempt whose driver died before seeing it
            tune.report({"status": state, "skipped": True})
            return
        cfg = same_run(tc.config, run_id)  # today's code must compute the stored run
        if lease is None:
            if objects.is_url(sweep_dir) and cfg.train.init_from:
                _pull_branch_point(sweep_dir, run_dir, cfg.train.init_from)
            os.chdir(run_dir)  # cooldown branches name their stable run's checkpoint relative to the run dir
        prev = (store.read_status(run_dir) or {}) if state != "pending" else {}
        attempt = int(prev.get("attempts", 0)) + 1
        store.append_event(sweep_dir, "start", run_id, attempt=attempt, node=ray.get_runtime_context().get_node_id())
        clock = TrainClock(in_process=cfg.parallel.world_size == 1)
        wb = wandb_runs.trial_context(sweep_dir, run_id, tc.config)  # group, tags, live prediction
        try:
            if cfg.parallel.world_size > 1:
                summary = _train_multiworker(tc, run_dir, cfg, wb, lease)
            else:
                fault = _fault_callback(run_dir, tc.fail_at_step)
                stop = early_stop.callback(sweep_dir, run_id, tc.config, run_dir=run_dir)
                cbs = [cb for cb in (fault, _hold_callback(), stop) if cb]
                summary = train_run(cfg, run_dir, resume=True, callbacks=cbs, hang=_hang_policy(tc), wandb=wb)
        except BaseException as e:
            store.append_event(
                sweep_dir,
                "fail",
                run_id,
                error=f"{type(e).__name__}: {e}",
                loaded_step=_loaded_step(run_dir, attempt),
                **clock.seconds(),
            )
            raise
        store.append_event(
            sweep_dir,
            "end",
            run_id,
            status=summary.get("status"),
            loaded_step=_loaded_step(run_dir, attempt),
            **clock.seconds(),
        )
    tune.report({k: v for k, v in summary.items() if isinstance(v, int | float | str) and v is not None})


def _pull_branch_point(sweep_url: str, run_dir: Path, init_from: str) -> None:
    """A cooldown branch on object storage: its `train.init_from` (`../<stable id>/checkpoints/step_N`,
    relative to the run directory) downloaded from the stable run's prefix (where that run lives in
    the store root) beside the branch's node-local copy, unless the branch resumes from its own
    checkpoints. Anything missing is left to the training loop, which names the checkpoint."""
    parts = Path(init_from).parts
    if len(parts) != 4 or parts[0] != ".." or parts[2] != "checkpoints" or not STEP_DIR.match(parts[3]):
        return
    if list_checkpoints(run_dir / "checkpoints"):
        return
    check_run_id(parts[1], f"{run_dir.name}: train.init_from names the run")
    dest = run_dir.parent / parts[1] / "checkpoints" / parts[3]
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        pull_checkpoint(objects.join(store.run_location(sweep_url, parts[1]), "checkpoints", parts[3]), dest)


@contextlib.contextmanager
def _run_home(sweep_dir: str | Path, tc: TrialArgs) -> Iterator[tuple[str | Path, Lease | None]]:
    """Where the trial trains its run, as the only process doing so: (the run's directory, None), or
    for a multi-process run on object storage (the run's URL, the lease its ranks write under)."""
    if objects.is_url(sweep_dir) and _world_size(tc.config) > 1:  # ranks on several nodes: scalelab.store.rank_copy
        with run_lease(sweep_dir, tc.run_id) as (run_url, lease):
            yield run_url, lease
        return
    with run_lock(sweep_dir, tc.run_id) as run_dir:
        remove_stale_temp_files(run_dir)
        yield run_dir, None


def _loaded_step(run_dir: str | Path, attempt: int) -> int | None:
    """The checkpoint step this trial's last attempt loaded, as the training loop recorded it in
    status.json (None: it started from step 0, or failed before it got that far). A TorchTrainer
    that restarted its workers inside the trial made more attempts than the trial's first."""
    loaded = (store.read_status(run_dir) or {}).get("loaded_steps") or []
    return loaded[-1] if len(loaded) >= attempt else None


def _hang_policy(tc: TrialArgs) -> HangPolicy | None:
    factor = float(tc.hang_factor or 0)
    return HangPolicy(factor=factor, min_s=float(tc.hang_min_s)) if factor else None


def _train_multiworker(
    tc: TrialArgs, run_dir: str | Path, cfg, wb: WandbRun | None = None, lease: Lease | None = None
) -> dict[str, Any]:
    """A multi-process run as a Ray Train TorchTrainer inside this trial.

    The trainer restarts its worker group after a worker failure (a lost node, the step watchdog)
    up to max_failures times; elastic: at whatever size between one replica and the layout fits.
    lease: the run is on object storage (run_dir its URL) and this trial holds its lease; every rank
    trains in a copy on its own node and writes to the store under it (scalelab.train.rank_copy)."""
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as TrainRunConfig
    from ray.train.torch import TorchTrainer

    from scalelab.sweeps.execution.ray_train_group import LoopbackTorchConfig  # imports Ray Train

    gpus = float(tc.gpus_per_worker)
    world = cfg.parallel.world_size
    policy = _hang_policy(tc)
    # Ray Train's own state: beside the run, or local to the trial for a run on object storage
    trainer_state = tempfile.mkdtemp(prefix="scalelab-train-") if lease else str(Path(run_dir) / ".ray_train")
    trainer = TorchTrainer(
        sweep_worker,
        torch_config=LoopbackTorchConfig(),  # on a cluster of this machine, the group listens on 127.0.0.1
        train_loop_config={
            "config": tc.config,
            "run_dir": str(run_dir),
            "resume": True,
            "hang": None if policy is None else {"factor": policy.factor, "min_s": policy.min_s},
            "wandb": wb,
            "object_store": None
            if lease is None
            else {
                "run_url": str(run_dir),
                "lease_url": lease.url,
                "holder": lease.holder,
                "generation": lease.generation,
                "ttl_s": lease.ttl_s,
            },
        },
        scaling_config=ScalingConfig(
            num_workers=(min_world_size(cfg.parallel), world) if tc.elastic else world,
            use_gpu=gpus > 0,
            # each worker gives up TRIAL_CPU of its share so the trial's own bundle still fits
            resources_per_worker={"CPU": float(tc.cpus_per_worker) - TRIAL_CPU} | ({"GPU": gpus} if gpus else {}),
        ),
        run_config=TrainRunConfig(
            name=f"train-{tc.run_id}",
            storage_path=trainer_state,
            failure_config=FailureConfig(max_failures=int(tc.max_failures)),
        ),
    )
    try:
        trainer.fit()
    finally:
        if lease is not None:
            shutil.rmtree(trainer_state, ignore_errors=True)
    return store.read_status(run_dir) or {"status": "failed"}


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


def check_runnable(runs: list[dict[str, Any]]) -> None:
    """Checks that need no Ray: a multi-process layout must fit its model and batch."""
    for r in runs:
        if _world_size(r["config"]) > 1:
            build_run_config(r["config"])  # validates the layout against the model and the batch


def _world_size(config: dict[str, Any]) -> int:
    """Processes of a resolved run config's layout (its ParallelConfig's product)."""
    return from_dict(ParallelConfig, config.get("parallel") or {}, "parallel").world_size


def _trial_resources(trial_config: dict[str, Any]):
    from ray.tune import PlacementGroupFactory

    tc = TrialArgs.of(trial_config)
    if _world_size(tc.config) > 1:
        return PlacementGroupFactory([{"CPU": TRIAL_CPU}])  # the TorchTrainer's workers hold the resources
    bundle = {"CPU": float(tc.cpus_per_run)}
    if tc.gpus_per_run:
        bundle["GPU"] = float(tc.gpus_per_run)
    return PlacementGroupFactory([bundle])


def _progress_callback(log: Log, sweep_dir: Path):
    """Progress lines; and a `retry` event when Tune retries a trial (the driver's view of a failure:
    a trial lost with its node never writes its own `fail` line)."""
    from ray.tune import Callback

    class Progress(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            log(f"  start  {trial.config['trial']['run_id']}")

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            loss = r.get("final_val_loss")
            extra = f"  val_loss={loss:.4f}" if isinstance(loss, float) else ""
            log(f"  {r.get('status', 'done'):6s} {trial.config['trial']['run_id']}{extra}")

        def on_trial_recover(self, iteration, trials, trial, **info):
            run_id = trial.config["trial"]["run_id"]
            store.append_event(sweep_dir, "retry", run_id)
            log(f"  retry  {run_id} (resumes from its latest checkpoint)")

        def on_trial_error(self, iteration, trials, trial, **info):
            log(f"  failed {trial.config['trial']['run_id']} (retries exhausted; see sweep status)")

    return Progress()


def _trial_args(sweep_dir, r: dict[str, Any], execution: ExecutionConfig, fault_steps) -> TrialArgs:
    """The Tune trial's arguments of run entry `r`."""
    return TrialArgs(
        sweep_dir=str(sweep_dir),
        run_id=r["run_id"],
        config=r["config"],
        cpus_per_run=execution.cpus_per_run,
        gpus_per_run=execution.gpus_per_run,
        cpus_per_worker=execution.cpus_per_run,
        gpus_per_worker=execution.gpus_per_run,
        fail_at_step=(fault_steps or {}).get(r["run_id"]),
        max_failures=execution.max_failures,
        elastic=execution.elastic,
        hang_factor=execution.hang_factor,
        hang_min_s=execution.hang_min_s,
    )


def _tune_wave(
    sweep_dir, trial_configs: list[dict[str, Any]], wave: int, execution: ExecutionConfig, *, max_concurrent, log: Log
) -> None:
    """One wave: a Tune trial per run, retried up to execution.max_failures times; returns when all end."""
    from ray import tune

    limit = max_concurrent or execution.max_concurrent or None
    with _tune_dir(sweep_dir) as tune_dir:
        tune.Tuner(
            tune.with_resources(sweep_trial, _trial_resources),
            param_space={"trial": tune.grid_search(trial_configs)},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=limit,
                reuse_actors=True,
                trial_name_creator=lambda t: t.config["trial"]["run_id"],
                trial_dirname_creator=lambda t: t.config["trial"]["run_id"],
            ),
            run_config=tune.RunConfig(
                name=f"wave{wave}-{time.strftime('%Y%m%d-%H%M%S')}",
                storage_path=str(tune_dir),
                failure_config=tune.FailureConfig(max_failures=execution.max_failures),
                verbose=0,
                callbacks=[_progress_callback(log, sweep_dir)],
            ),
        ).fit()


def _log_states(states: dict[str, str], t0: float, log: Log) -> None:
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s] = counts.get(s, 0) + 1
    log("states: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) + f"  ({time.time() - t0:.0f} s)")


def execute(
    sweep_dir: str | Path,
    runs: list[dict[str, Any]],
    execution: ExecutionConfig,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    fault_steps: dict[str, int] | None = None,
    pass_env: list[str] | tuple[str, ...] = (),
    given: frozenset[str] = frozenset(),
    log: Log = print,
) -> dict[str, Any]:
    """Train every unfinished run of `runs` (entries of sweep.resolved.json) into the sweep's store.

    given: the local paths the launcher's own spec names (scalelab.train.local_paths); a run naming
    another one is refused (UsageError) before anything starts, and a run stored in the root under
    another id is matched only when it names none but these.
    Returns {"states": {run_id: state}, "trained": [...], "skipped": [...], "wall_s": ...}.
    """
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our own progress lines instead of Tune's tables
    if not address:
        local_ray_on_loopback()
    import ray

    sweep_dir = store.location(sweep_dir)
    check_given_paths(runs, given, sweep_dir)
    t0 = time.time()
    by_id = {r["run_id"]: r for r in runs}

    def current_id(stored: dict[str, Any], run_id: str) -> str | None:  # a stored run's id today (store.claims)
        named = {str(value) for key, value in local_paths(stored) if not in_store(key, value)}
        return current_run_id(stored, run_id) if named <= given else None

    states = store.attach_runs(sweep_dir, list(by_id), current_id=current_id)
    wandb_runs.prepare(sweep_dir, runs, log)  # an online sweep that cannot reach W&B: one line, runs log offline
    skipped = [i for i, s in states.items() if s in store.TERMINAL]
    if skipped:
        log(f"{len(skipped)} of {len(runs)} run(s) already finished in the store; not trained again")
    started, reaper = False, None  # whether this call started (or joined) Ray, and the local reaper
    trained: list[str] = []
    wave = 0
    try:
        while True:
            todo = [r for r in runs if states[r["run_id"]] not in store.TERMINAL]
            ready = [r for r in todo if not r.get("depends_on") or states.get(r["depends_on"]) == "done"]
            # Longest first (LPT): the costliest runs do not start last and leave a CPU idle at the end.
            ready.sort(key=lambda r: -float(r.get("cost_flops") or 0.0))
            if not ready:
                blocked = [r["run_id"] for r in todo]
                if blocked:
                    log(f"{len(blocked)} run(s) blocked: the run they branch from did not finish")
                break
            if wave > 0 and set(r["run_id"] for r in ready) <= set(trained):
                break  # everything runnable was tried this launch and did not finish
            if not ray.is_initialized():
                reaper, started = start_ray(address, num_cpus, pass_env), True
            log(f"wave {wave}: {len(ready)} run(s) on Ray ({ray.cluster_resources().get('CPU', 0):g} CPUs)")
            trial_configs = [asdict(_trial_args(sweep_dir, r, execution, fault_steps)) for r in ready]
            _tune_wave(sweep_dir, trial_configs, wave, execution, max_concurrent=max_concurrent, log=log)
            trained += [r["run_id"] for r in ready]
            states = {i: store.run_state(store.run_location(sweep_dir, i)) for i in by_id}
            wave += 1
    finally:
        if started:
            ray_reaper.stop_reaper(reaper)
            ray.shutdown()
    # proposed runs that finished get their measured loss in the ledger (locally or on object storage)
    if scored := ledger.score(sweep_dir):
        log("ledger: measured losses recorded beside their predictions (scalelab sweep ledger)")
        wandb_fit.update_ledger(sweep_dir, scored, log=log)  # the rounds' W&B ledger tables
    _log_states(states, t0, log)
    return {"states": states, "trained": trained, "skipped": skipped, "wall_s": time.time() - t0}


def check_given_paths(runs: list[dict[str, Any]], given: frozenset[str], sweep_dir: str | Path) -> None:
    """Every local path the runs name is one the launcher's spec gave, or a branch point in the store
    (scalelab.train.local_paths); UsageError naming the first other one."""
    for r in runs:
        check_local_paths(r["config"], given, f"{store.SweepLayout(sweep_dir).resolved}: run {r['run_id']}")


@contextlib.contextmanager
def _tune_dir(sweep_dir: str | Path) -> Iterator[Path]:
    """Ray Tune's own state (the store is the sweep's state): beside the sweep, or for a sweep on
    object storage a temporary directory of the driver, removed when the wave ends."""
    if not objects.is_url(sweep_dir):
        yield Path(sweep_dir) / ".tune"
        return
    with tempfile.TemporaryDirectory(prefix="scalelab-tune-") as tmp:
        yield Path(tmp)


def check_object_store(url: str, spec_text: str, runs: list[dict[str, Any]]) -> None:
    """An s3:// store checked before the first object is written (UsageError): every layout, cooldown
    branches, early stopping and rounds run there, so only the address, the bucket and credentials."""
    objects.check_sweep(url, "--out")


def launch(
    sweep: Sweep,
    sweep_dir: str | Path,
    *,
    spec_text: str,
    spec_name: str = "sweep",
    address: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    fault_steps: dict[str, int] | None = None,
    pass_env: list[str] | tuple[str, ...] = (),
    given: frozenset[str] | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Record the sweep in the store (sweep.yaml, sweep.resolved.json) and train what is unfinished.

    given: the local paths the launcher's own spec names (default: those of `sweep`, the launcher's
    spec; a round proposed from the store's records passes the launcher's, scalelab.sweeps.closed_loop.rounds)."""
    check_pass_env(address, pass_env)
    entries = [r.to_dict() for r in sweep.runs]
    given = given_paths(r["config"] for r in entries) if given is None else given
    check_given_paths(entries, given, sweep_dir)
    check_runnable(entries)
    if objects.is_url(sweep_dir):
        check_object_store(sweep_dir, spec_text, entries)
    store.init_sweep(sweep_dir, spec_text, spec_name, entries, sweep.name)
    save_execution(sweep_dir, sweep.execution)
    return execute(
        sweep_dir,
        entries,
        sweep.execution,
        address=address,
        max_concurrent=max_concurrent,
        num_cpus=num_cpus,
        fault_steps=fault_steps,
        pass_env=pass_env,
        given=given,
        log=log,
    )


def resume(
    sweep_dir: str | Path,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    pass_env: list[str] | tuple[str, ...] = (),
    given: frozenset[str] = frozenset(),
    log: Log = print,
) -> dict[str, Any]:
    """Finish a sweep from its store alone (after the driver died): done runs stay done.

    given: the local paths of the launcher's own spec (`sweep resume --spec`); the store's records
    name no other (check_given_paths), before anything is built from them."""
    check_pass_env(address, pass_env)
    if objects.is_url(sweep_dir):
        objects.check_sweep(sweep_dir, "sweep_dir")
    else:
        sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    resolved = store.read_resolved(sweep_dir)
    if not resolved.get("runs"):
        raise UsageError(f"{sweep_dir}/sweep.resolved.json lists no runs; launch the spec again")
    execution = from_dict(ExecutionConfig, resolved.get("execution") or {})
    check_given_paths(resolved["runs"], given, sweep_dir)
    check_runnable(resolved["runs"])
    return execute(
        sweep_dir,
        resolved["runs"],
        execution,
        address=address,
        max_concurrent=max_concurrent,
        num_cpus=num_cpus,
        pass_env=pass_env,
        given=given,
        log=log,
    )


def save_execution(sweep_dir: str | Path, execution: ExecutionConfig) -> None:
    """Keep the spec's execution section in sweep.resolved.json (what `resume` runs with)."""

    def keep(resolved: dict[str, Any]) -> tuple[None, bool]:
        resolved["execution"] = to_dict(execution)
        return None, True

    update_resolved(sweep_dir, keep)
