"""One pretraining run: data → model → steps → evals → checkpoints → records.

    from scalelab.train.loop import train_run
    summary = train_run(cfg, run_dir, resume=True)

The same function runs a single-process CPU run, a rank of a `scalelab run` multi-process job, a
torchrun job, or a Ray Train worker (scalelab.train.launch starts them): everything distributed
comes from the process group that the launcher created and from `scalelab.parallel.parallelize`,
which the loop always calls (one device is a layout too: compile and activation checkpointing
apply there as well). Rank 0 writes the records.

One session reads top-down: `_start` (resume, or branch from another run's checkpoint), then per
step `_train_step`, `_log_step`, `_evaluate` and `_checkpoint`; the test-only hooks
(`stop_after_steps`, the fault-injection step delay) sit in `_SessionEnd`, outside the step.

Exact resume: model, optimizer, the sampler position and the RNG are restored from the latest
completed checkpoint, and records past that checkpoint are dropped, so an interrupted-and-resumed
run produces the same losses bit for bit as an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scalelab.parallel.layouts import layout_name
from scalelab.parallel.parallelize import Parallelized
from scalelab.store.atomic import atomic_write_json
from scalelab.store.records import RecordWriter, read_status, rows_through, write_status
from scalelab.train import checkpoint as ckpt
from scalelab.train.config import RunConfig, to_dict
from scalelab.train.data.bundle import build_data
from scalelab.train.elastic import WorkerLayout, micro_sequences
from scalelab.train.eval_model import autocast_for, evaluate
from scalelab.train.eval_tasks import load_tasks
from scalelab.train.identity import config_hash
from scalelab.train.loggers import WandbRun, eval_metrics, open_progress, open_wandb, step_metrics
from scalelab.train.optim import build_optimizer, set_lr
from scalelab.train.parallel_model import parallel_model
from scalelab.train.profiling import StepProfiler, region
from scalelab.train.run_summary import run_summary_fields
from scalelab.train.runtime import Runtime, make_runtime
from scalelab.train.schedule import schedule_for
from scalelab.train.stop_run import StopRun
from scalelab.train.watchdog import HangPolicy, StepWatchdog

Callback = Callable[[str, dict[str, Any]], None]

# Fault-injection tests (SIGKILL mid-run, driver kill) need runs slow enough to be caught between
# steps; this sleeps after every step. Unset (0) in normal use.
_STEP_DELAY_ENV = "SCALELAB_TEST_STEP_DELAY_S"


class Diverged(RuntimeError):
    pass


def _build_data(cfg: RunConfig, dp_rank: int = 0, dp_size: int = 1):
    return build_data(
        cfg.data,
        seed=cfg.data_order_seed,
        dp_rank=dp_rank,
        dp_size=dp_size,
        val_batch_size=cfg.eval.val_batch_sequences,
    )


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)


def _dp_mean(value: torch.Tensor) -> float:
    if dist.is_available() and dist.is_initialized():
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return float(value)


def train_run(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    callbacks: list[Callback] | None = None,
    stop_after_steps: int | None = None,
    layout: WorkerLayout | None = None,
    hang: HangPolicy | None = None,
    wandb: WandbRun | None = None,
    publish: ckpt.Publisher | None = None,
) -> dict[str, Any]:
    """Train one run into `run_dir`; returns the summary that status.json also holds.

    Args:
        cfg: the resolved run config.
        run_dir: where records and checkpoints go (created).
        resume: continue from the latest completed checkpoint in run_dir (if any).
        callbacks: called as cb(kind, record) with kind in {"step", "eval", "checkpoint"} (rank 0);
            one may raise StopRun to end the run early (single-process runs).
        stop_after_steps: stop (status stays "running") after this many steps of this session —
            for tests that simulate an interruption.
        layout: the layout this attempt trains under and its ranks' nodes (default cfg.parallel);
            an elastic attempt with fewer workers passes a smaller dp (scalelab.train.elastic).
        hang: the step watchdog's policy (scalelab.train.watchdog); None = no watchdog.
        wandb: what the launcher adds to the run's W&B record (group, tags, live prediction;
            scalelab.train.loggers); None = the config's W&B settings alone.
        publish: each rank's run_dir is its own and every rank uploads its checkpoint files to
            the store (a multi-process run on object storage, scalelab.train.rank_copy).
    """
    run_dir = Path(run_dir)
    runtime = make_runtime(cfg)
    callbacks = callbacks or []
    layout = layout or WorkerLayout(parallel=cfg.parallel)
    # Everything that can reject the inputs (data sources and their token budget, the checkpoint to
    # start from) runs before the run directory exists: a rejected run leaves nothing behind that
    # would block the corrected command.
    data = _build_data(cfg)
    data.sampler.check_budget(cfg.num_steps * cfg.tokens_per_step)
    if cfg.train.init_from and not (resume and ckpt.list_checkpoints(run_dir / "checkpoints")):
        ckpt.verify(cfg.train.init_from)
    if runtime.is_rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_dir / "config.json", to_dict(cfg))
    try:
        upload = publish.records if publish is not None else None  # the hang record, to the store
        with StepWatchdog(hang, run_dir, rank=runtime.rank, after_record=upload) as watchdog:
            hooks = _SessionEnd(stop_after_steps)
            return _train(cfg, run_dir, runtime, data, resume, callbacks, hooks, layout, watchdog, wandb, publish)
    except StopRun as stop:
        if runtime.is_rank0:
            write_status(run_dir, stop.status, **stop.record)
        return {"status": stop.status, **stop.record}
    except Diverged as e:
        summary = {"status": "diverged", "reason": str(e)}
        if runtime.is_rank0:
            write_status(run_dir, "diverged", reason=str(e))
        return summary
    except BaseException as e:
        if runtime.is_rank0:
            tb = traceback.format_exc(limit=8)
            write_status(run_dir, "failed", error=f"{type(e).__name__}: {e}", traceback=tb)
        raise


class _Interrupted(Exception):
    """A test hook ended the session between steps (status stays "running")."""


class _SessionEnd:
    """Test-only hooks run after each step, outside the step itself.

    stop_after_steps: end the session (status stays "running") after this many of its steps.
    SCALELAB_TEST_STEP_DELAY_S: sleep after every step, so that fault-injection tests (SIGKILL
    mid-run, driver kill) can catch a run between steps. Both are off in normal use.
    """

    def __init__(self, stop_after_steps: int | None):
        self.stop_after_steps = stop_after_steps
        self.delay_s = float(os.environ.get(_STEP_DELAY_ENV, "0") or 0)
        self.first_step = 0

    def after(self, step: int, last: bool) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.stop_after_steps is not None and step - self.first_step >= self.stop_after_steps and not last:
            raise _Interrupted(step)


@dataclass(kw_only=True)
class _Start:
    """Where a session starts: step 0, a resumed checkpoint of this run, or another run's (init_from)."""

    step: int = 0
    source: Path | None = None  # the checkpoint loaded, if any
    resumed: bool = False  # source is this run's own checkpoint
    skipped: list[tuple[str, str]] = field(default_factory=list)  # unreadable checkpoints passed over
    state: dict[str, Any] = field(default_factory=dict)  # the train state saved with the checkpoint


def _start(cfg: RunConfig, run_dir: Path, model, optimizer, data, resume: bool) -> _Start:
    """Load the latest complete checkpoint of this run (resume) or cfg.train.init_from, if any."""
    resume_from, skipped = None, []
    if resume:
        resume_from, skipped = ckpt.select_resume_checkpoint(run_dir / "checkpoints", log=_log)
    source = resume_from or (Path(cfg.train.init_from) if cfg.train.init_from else None)
    if source is None:
        return _Start(skipped=skipped)
    state = ckpt.load_checkpoint(source, model, optimizer, verified=True)  # verified in train_run
    data.sampler.load_state_dict(state["sampler"])
    return _Start(step=int(state["step"]), source=source, resumed=resume_from is not None, skipped=skipped, state=state)


@dataclass(kw_only=True)
class _Session:
    """One training session of a run: what the step, eval and checkpoint helpers share."""

    cfg: RunConfig
    run_dir: Path
    runtime: Runtime
    par: Parallelized
    optimizer: torch.optim.Optimizer
    data: Any
    writer: RecordWriter | None  # rank 0 only
    logger: Any
    callbacks: list[Callback]
    tasks: list
    static: dict[str, Any]
    best_loss: float
    micro_sequences: int  # sequences per forward/backward on this rank
    num_micro: int  # micro-batches per step on this rank
    publish: ckpt.Publisher | None = None  # each rank uploads its checkpoint files (object storage)

    @property
    def model(self):
        return self.par.model

    @property
    def flops_per_step(self) -> float:
        return self.static["flops_per_token_6n"] * self.cfg.tokens_per_step


def _train(
    cfg,
    run_dir: Path,
    runtime: Runtime,
    data,
    resume: bool,
    callbacks,
    hooks: _SessionEnd,
    layout: WorkerLayout,
    watchdog: StepWatchdog,
    wandb: WandbRun | None = None,
    publish: ckpt.Publisher | None = None,
) -> dict[str, Any]:
    _seed_everything(cfg.train.seed)
    par = parallel_model(cfg, runtime, layout.parallel, seed=cfg.train.seed, z_loss=cfg.optim.z_loss)
    if par.dp_size > 1:  # the layout is known now: this rank reads its slice of each batch
        data = _build_data(cfg, par.dp_rank, par.dp_size)
    optimizer = build_optimizer(par.model, cfg.optim, runtime.device.type)
    start = _start(cfg, run_dir, par.model, optimizer, data, resume)
    writer = RecordWriter(run_dir, resume_step=start.step if start.resumed else None) if runtime.is_rank0 else None
    if writer is not None and start.source is not None and not start.resumed:
        writer.metrics = _prefix_rows(start.source, start.step)
    static = run_summary_fields(cfg)
    # the configured layout's micro-batch: an elastic attempt with a smaller dp accumulates more of them
    micro = micro_sequences(cfg.parallel, cfg.global_batch_sequences, cfg.train.micro_batch_sequences)
    if runtime.is_rank0:
        _record_attempt(cfg, run_dir, start, par, layout, micro, static, lost=writer.lost if writer else [])
    s = _open_session(cfg, run_dir, runtime, par, optimizer, data, writer, callbacks, wandb, start, micro, static)
    s.publish = publish
    bar = open_progress(cfg, runtime, start.step)
    par.model.train()
    if hasattr(par.model, "set_moe_loss_scale"):  # MoE aux losses get the LM loss's 1/num_micro too
        par.model.set_moe_loss_scale(1.0 / s.num_micro)
    lr_of = schedule_for(cfg)
    hooks.first_step = start.step
    profiler = StepProfiler.open(cfg, run_dir, optimizer, runtime, meta={"layout": layout_name(cfg.parallel)})
    t_last = time.perf_counter()
    try:
        for step in range(start.step + 1, cfg.num_steps + 1):
            tokens_before = (step - 1) * cfg.tokens_per_step
            lr = lr_of(tokens_before)
            watchdog.step_begin(step)
            with profiler.step(step):  # a no-op unless cfg.profile.steps lists it
                loss_val, grad_norm = _train_step(s, lr)
            watchdog.step_end()
            now = time.perf_counter()
            tps = cfg.tokens_per_step / max(now - t_last, 1e-9)
            t_last = now
            _check_divergence(loss_val, s.best_loss, tokens_before, cfg)
            s.best_loss = min(s.best_loss, loss_val)
            _log_step(s, step, lr, loss_val, grad_norm, tps)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{tps:,.0f}")
            last = step == cfg.num_steps
            _evaluate_flush_checkpoint(s, step, last)
            hooks.after(step, last)
    except _Interrupted as stop:
        if writer is not None:
            writer.flush()
        _end_wandb(s, {"status": "running"})
        return {"status": "running", "step": stop.args[0]}
    except StopRun as stop:
        _end_wandb(s, {"status": stop.status, **stop.record})
        raise
    except BaseException as e:
        _end_wandb(s, {"status": "diverged" if isinstance(e, Diverged) else "failed"}, exit_code=1)
        raise
    finally:
        profiler.close()
        if bar is not None:
            bar.close()
    summary = _summary(cfg, run_dir, writer, static, s.best_loss) if writer is not None else {"status": "done"}
    if runtime.is_rank0:
        write_status(run_dir, "done", **summary)
    _end_wandb(s, dict(summary, status="done"))
    return dict(summary, status="done")


def _record_attempt(
    cfg, run_dir: Path, start, par, layout: WorkerLayout, micro: int, static: dict, lost: list[str]
) -> None:
    """Rank 0: status.json says `running`, with this attempt's loaded checkpoint and layout appended,
    and the records it found unreadable (`records_lost`: their rows before its step are gone)."""
    prev = read_status(run_dir) or {}
    attempt = int(prev.get("attempts", 0)) + 1
    # One entry per attempt: the step of the checkpoint that attempt loaded (None: it started
    # from step 0). Deterministic training makes a restart's losses equal a resume's, so this
    # record is what tells them apart.
    loaded_steps = ((prev.get("loaded_steps") or []) + [None] * attempt)[: attempt - 1]
    loaded_steps.append(start.step if start.source is not None else None)
    # One entry per attempt too: the layout it trained under from which step, and when (an
    # elastic attempt on fewer workers shows here as a smaller dp with more accumulation).
    layouts = ((prev.get("layouts") or []) + [None] * attempt)[: attempt - 1]
    layouts.append(
        dict(
            attempt=attempt,
            from_step=start.step,
            at=time.time(),
            world_size=par.dims.world_size,
            dp=par.dp_size,
            accumulation=cfg.global_batch_sequences // par.dp_size // micro,
            elastic=layout.parallel != cfg.parallel,
            nodes=layout.nodes,
        )
    )
    write_status(
        run_dir,
        "running",
        run_id=config_hash(cfg),
        started_steps=start.step,
        started_from=str(start.source) if start.source is not None else None,
        loaded_steps=loaded_steps,
        layouts=layouts,
        skipped_checkpoints=[f"{name}: {why}" for name, why in start.skipped],
        attempts=attempt,
        **({"records_lost": lost_records} if (lost_records := _lost(prev, lost, start.step, attempt)) else {}),
        **static,
    )


def _lost(prev: dict, lost: list[str], step: int, attempt: int) -> list[dict]:
    """status.json's `records_lost`, with this attempt's unreadable records appended."""
    return (prev.get("records_lost") or []) + [dict(file=f, before_step=step, attempt=attempt) for f in lost]


def _open_session(
    cfg,
    run_dir: Path,
    runtime: Runtime,
    par,
    optimizer,
    data,
    writer,
    callbacks,
    wandb,
    start,
    micro: int,
    static: dict,
) -> _Session:
    """The session's state: the model and optimizer, where records go, the tasks, the micro-batching."""
    local_sequences = cfg.global_batch_sequences // par.dp_size
    logger = open_wandb(cfg, run_dir, runtime, wandb)
    return _Session(
        cfg=cfg,
        run_dir=run_dir,
        runtime=runtime,
        par=par,
        optimizer=optimizer,
        data=data,
        writer=writer,
        logger=logger,
        callbacks=[*callbacks, logger.observe] if logger is not None else callbacks,
        tasks=load_tasks(cfg.eval.tasks, cfg.eval.task_limit or None) if cfg.eval.tasks else [],
        static=static,
        best_loss=float(start.state.get("best_loss", math.inf)),
        micro_sequences=micro,
        num_micro=local_sequences // micro,
    )


def _evaluate_flush_checkpoint(s: _Session, step: int, last: bool) -> None:
    """After a step: evaluate, flush the records, save a checkpoint, each when it is due, in this order."""
    cfg = s.cfg
    if last or (cfg.eval.interval_steps and step % cfg.eval.interval_steps == 0):
        _evaluate(s, step)
    if s.writer is not None and (last or step % max(cfg.logging.interval_steps, 10) == 0):
        s.writer.flush()
    if (last and cfg.checkpoint.final) or (cfg.checkpoint.interval_steps and step % cfg.checkpoint.interval_steps == 0):
        _checkpoint(s, step)


def _end_wandb(s: _Session, summary: dict[str, Any], exit_code: int = 0) -> None:
    """Close the run's W&B record with how the session ended (a stopped or failed run's too)."""
    if s.logger is not None:
        s.logger.summary_update(summary)
        s.logger.finish(exit_code=exit_code)


def _train_step(s: _Session, lr: float) -> tuple[float, float]:
    """One optimizer step on the next global batch: (mean cross-entropy over dp, grad norm before clipping)."""
    cfg, runtime = s.cfg, s.runtime
    set_lr(s.optimizer, lr)
    with region("data"):  # a label for the profiler's trace
        batch = s.data.sampler.next_batch(cfg.global_batch_sequences).to(runtime.device, non_blocking=True)
    loss_sum = torch.zeros((), device=runtime.device)
    for chunk in batch.split(s.micro_sequences):
        # autocast over backward too; forward_backward returns the detached cross-entropy (no z-loss)
        with autocast_for(runtime.device, runtime.autocast_dtype):
            loss_sum += s.par.step.forward_backward(chunk[:, :-1], chunk[:, 1:], 1.0 / s.num_micro)
    grad_norm = s.par.step.clip_grad_norm(s.model, cfg.optim.grad_clip)
    s.optimizer.step()
    s.optimizer.zero_grad(set_to_none=True)
    return _dp_mean(loss_sum / s.num_micro), grad_norm


def _log_step(s: _Session, step: int, lr: float, loss_val: float, grad_norm: float, tps: float) -> None:
    """The metrics row of a logging step (rank 0 writes it; the router row is a collective)."""
    cfg = s.cfg
    if not (step % cfg.logging.interval_steps == 0 or step == cfg.num_steps):
        return
    router = s.par.step.router_row(s.model)  # MoE only -> router.parquet; every rank calls it
    if s.writer is None:
        return
    row = dict(
        step=step,
        tokens=step * cfg.tokens_per_step,
        flops=s.flops_per_step * step,
        loss=loss_val,
        lr=lr,
        grad_norm=grad_norm,
        tokens_per_s=tps,
        **router,
    )
    s.writer.log_metrics(row)
    _emit(s.callbacks, "step", row)
    if s.logger is not None:
        s.logger.log(step_metrics(row), step=step)


def _evaluate(s: _Session, step: int) -> None:
    """Validation loss/bpb on every source, and the multiple-choice tasks (every rank runs them)."""
    ev = evaluate(
        s.par,
        tokenizer=s.data.tokenizer,
        tasks=s.tasks,
        val_sets=s.data.val_sets,
        max_seq_len=s.cfg.model.max_seq_len,
        autocast_dtype=s.runtime.autocast_dtype,
    )
    if s.writer is None:
        return
    tokens = step * s.cfg.tokens_per_step
    for row in ev.stamped(step=step, tokens=tokens, flops=s.flops_per_step * step):
        s.writer.log_eval(row)
    _emit(s.callbacks, "eval", {"step": step, "tokens": tokens, "rows": ev.rows})
    if s.logger is not None:
        s.logger.log(eval_metrics(ev.rows), step=step)


def _checkpoint(s: _Session, step: int) -> None:
    """Save checkpoint `step` (every rank writes its shards) after the records that cover it."""
    if s.writer is not None:
        # Records first: once checkpoint k exists on disk, the records cover step k, so a
        # kill at any instant never leaves a checkpoint whose records were not written.
        s.writer.flush()
    train_state = {
        "step": step,
        "tokens": step * s.cfg.tokens_per_step,
        "sampler": s.data.sampler.state_dict(),
        "best_loss": s.best_loss,
        "run_id": config_hash(s.cfg),
    }
    path = ckpt.save_checkpoint(
        s.run_dir / "checkpoints",
        step,
        s.model,
        s.optimizer,
        train_state,
        keep_last=s.cfg.checkpoint.keep_last,
        publish=s.publish,
    )
    _emit(s.callbacks if s.writer is not None else [], "checkpoint", {"step": step, "path": str(path)})


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_divergence(loss: float, best: float, tokens: int, cfg: RunConfig) -> None:
    if not math.isfinite(loss):
        raise Diverged(f"loss is {loss} at {tokens} tokens")
    spike = cfg.train.max_loss_spike
    if spike and tokens >= cfg.warmup_tokens and math.isfinite(best) and loss > spike * best:
        raise Diverged(f"loss {loss:.4g} > {spike} x best {best:.4g} at {tokens} tokens")


def _emit(callbacks, kind: str, record: dict) -> None:
    for cb in callbacks:
        cb(kind, record)


def _prefix_rows(src_ckpt: Path, max_step: int) -> list[dict]:
    """A branch started from another run's checkpoint inherits that run's metrics up to the step."""
    return rows_through(src_ckpt.parent.parent / "metrics.parquet", max_step)


def _summary(cfg, run_dir: Path, writer: RecordWriter, static: dict, best_loss: float) -> dict[str, Any]:
    losses = [m["loss"] for m in writer.metrics]
    tail = losses[-max(1, len(losses) // 20) :]  # mean of the last 5% of steps: less noisy than the last
    vals = [e for e in writer.evals if e["task"] == "val" and e["metric"] == "loss"]
    bpbs = [e for e in writer.evals if e["task"] == "val" and e["metric"] == "bpb"]
    return dict(
        static,
        run_id=config_hash(cfg),
        final_train_loss=sum(tail) / len(tail),
        best_train_loss=best_loss,
        final_val_loss=vals[-1]["value"] if vals else None,
        best_val_loss=min(v["value"] for v in vals) if vals else None,
        final_val_bpb=bpbs[-1]["value"] if bpbs else None,
        flops_6n=static["flops_per_token_6n"] * static["num_tokens"],
        flops_exact=static["flops_per_token_exact"] * static["num_tokens"],
    )
