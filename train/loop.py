"""One pretraining run: data → model → steps → evals → checkpoints → records.

    from scalelab.train.loop import train_run
    summary = train_run(cfg, run_dir, resume=True)

The same function runs a single-process CPU run, a rank of a `scalelab run` multi-process job, a
torchrun job, or a Ray Train worker: everything distributed comes from the process group that the
launcher created and from scalelab.parallel. Rank 0 writes the records.

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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scalelab.models.accounting import flops_per_token, num_params, num_params_nonembedding
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.models.moe import step_row as moe_step_row
from scalelab.train import checkpoint as ckpt
from scalelab.train.config import RunConfig, config_hash, to_dict
from scalelab.train.data.bundle import build_data
from scalelab.train.evaluate import _autocast, evaluate_sources
from scalelab.train.optim import build_optimizer, set_lr
from scalelab.train.records import RecordWriter, atomic_write_json, read_status, rows_through, write_status
from scalelab.train.runtime import Runtime, make_runtime
from scalelab.train.schedule import schedule_for

Callback = Callable[[str, dict[str, Any]], None]

# Fault-injection tests (SIGKILL mid-run, driver kill) need runs slow enough to be caught between
# steps; this sleeps after every step. Unset (0) in normal use.
_STEP_DELAY_ENV = "SCALELAB_TEST_STEP_DELAY_S"


class Diverged(RuntimeError):
    pass


class StopRun(Exception):
    """Raised by a callback to end the run where it is, recorded as `status` with `record`'s fields
    (e.g. sweeps/early_stop.py at a "checkpoint" event: records flushed, the checkpoint on disk)."""

    def __init__(self, status: str, record: dict[str, Any]):
        super().__init__(status)
        self.status, self.record = status, record


def run_summary_fields(cfg: RunConfig) -> dict[str, Any]:
    """Static facts about a run (sizes, FLOPs) that the store keeps beside its losses."""
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    return dict(
        params=num_params(cfg.model),
        params_nonembed=num_params_nonembedding(cfg.model),
        flops_per_token_6n=fpt.six_n,
        # exact: every matmul (output layer included) plus causal attention (half the T x T scores)
        flops_per_token_exact=fpt.exact_causal,
        num_steps=cfg.num_steps,
        tokens_per_step=cfg.tokens_per_step,
        num_tokens=cfg.num_steps * cfg.tokens_per_step,
    )


def _build_and_parallelize(cfg: RunConfig, runtime: Runtime, seed: int):
    if cfg.parallel.world_size == 1 and runtime.world_size == 1:
        return build_model(cfg.model, device=runtime.device, seed=seed)
    from scalelab.parallel.apply import apply_parallelism  # only needed for multi-process layouts

    # Sharded on the meta device, then only this rank's shards are allocated and initialised
    # (the same values as the single-device init): no rank ever holds the whole model.
    model = apply_parallelism(build_model(cfg.model, device="meta"), cfg, runtime)
    runtime.extra["parallelized"].materialize(runtime.device, seed)
    return model


def _build_data(cfg: RunConfig, runtime: Runtime):
    return build_data(
        cfg.data,
        seed=cfg.train.seed,
        dp_rank=runtime.dp_rank,
        dp_size=runtime.dp_size,
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
) -> dict[str, Any]:
    """Train one run into `run_dir`; returns the summary that status.json also holds.

    Args:
        cfg: the resolved run config.
        run_dir: where records and checkpoints go (created).
        resume: continue from the latest completed checkpoint in run_dir (if any).
        callbacks: called as cb(kind, record) with kind in {"step", "eval", "checkpoint"} (rank 0);
            one may raise StopRun to end the run early (single-process runs).
        stop_after_steps: stop (status stays "running") after this many steps — for tests that
            simulate an interruption.
    """
    run_dir = Path(run_dir)
    runtime = make_runtime(cfg)
    callbacks = callbacks or []
    # Everything that can reject the inputs (data sources and their token budget, the checkpoint to
    # start from) runs before the run directory exists: a rejected run leaves nothing behind that
    # would block the corrected command.
    data = _build_data(cfg, runtime)
    data.sampler.check_budget(cfg.num_steps * cfg.tokens_per_step)
    if cfg.train.init_from and not (resume and ckpt.list_checkpoints(run_dir / "checkpoints")):
        ckpt.verify(cfg.train.init_from)
    if runtime.is_rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_dir / "config.json", to_dict(cfg))
    try:
        return _train(cfg, run_dir, runtime, data, resume, callbacks, stop_after_steps)
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


def _train(cfg, run_dir: Path, runtime: Runtime, data, resume: bool, callbacks, stop_after_steps) -> dict[str, Any]:
    seed = cfg.train.seed
    _seed_everything(seed)
    model = _build_and_parallelize(cfg, runtime, seed)
    if runtime.dp_size > 1:  # the layout is known now: this rank reads its slice of each batch
        data = _build_data(cfg, runtime)
    optimizer = build_optimizer(model, cfg.optim, runtime.device.type)
    lr_of = schedule_for(cfg)
    tasks = []
    if cfg.eval.tasks:
        from scalelab.train.eval_tasks import evaluate_tasks, load_tasks

        tasks = load_tasks(cfg.eval.tasks, cfg.eval.task_limit or None)
    static = run_summary_fields(cfg)
    flops_per_step = static["flops_per_token_6n"] * cfg.tokens_per_step

    start_step = 0
    resume_from, skipped = None, []
    if resume:
        resume_from, skipped = ckpt.select_resume_checkpoint(run_dir / "checkpoints", log=_log)
    init_from = None if resume_from else cfg.train.init_from
    source = resume_from or (Path(init_from) if init_from else None)
    state: dict[str, Any] = {}
    if source is not None:
        state = ckpt.load_checkpoint(source, model, optimizer, verified=True)  # verified above
        data.sampler.load_state_dict(state["sampler"])
        start_step = int(state["step"])
    writer = RecordWriter(run_dir, resume_step=start_step if resume_from else None) if runtime.is_rank0 else None
    if writer is not None and init_from and not resume_from:
        writer.metrics = _prefix_rows(Path(init_from), start_step)
    best_loss = float(state.get("best_loss", math.inf))
    first_step_of_session = start_step

    if runtime.is_rank0:
        prev = read_status(run_dir) or {}
        attempt = int(prev.get("attempts", 0)) + 1
        # One entry per attempt: the step of the checkpoint that attempt loaded (None: it started
        # from step 0). Deterministic training makes a restart's losses equal a resume's, so this
        # record is what tells them apart.
        loaded_steps = ((prev.get("loaded_steps") or []) + [None] * attempt)[: attempt - 1]
        loaded_steps.append(int(state["step"]) if state else None)
        write_status(
            run_dir,
            "running",
            run_id=config_hash(cfg),
            started_steps=start_step,
            started_from=str(source) if source is not None else None,
            loaded_steps=loaded_steps,
            skipped_checkpoints=[f"{name}: {why}" for name, why in skipped],
            attempts=attempt,
            **static,
        )
    logger = _open_wandb(cfg, run_dir, runtime)
    bar = _progress(cfg, runtime, start_step)

    local_sequences = cfg.global_batch_sequences // runtime.dp_size
    micro = cfg.train.micro_batch_sequences or local_sequences
    num_micro = local_sequences // micro
    model.train()
    if hasattr(model, "set_moe_loss_scale"):  # MoE aux losses get the LM loss's 1/num_micro too
        model.set_moe_loss_scale(1.0 / num_micro)
    step = start_step
    step_delay = float(os.environ.get(_STEP_DELAY_ENV, "0") or 0)
    t_last = time.perf_counter()
    for step in range(start_step + 1, cfg.num_steps + 1):
        tokens_before = (step - 1) * cfg.tokens_per_step
        lr = lr_of(tokens_before)
        set_lr(optimizer, lr)
        batch = data.sampler.next_batch(cfg.global_batch_sequences).to(runtime.device, non_blocking=True)
        loss_sum = torch.zeros((), device=runtime.device)
        fwd_bwd = runtime.extra.get("forward_backward")  # set by scalelab.parallel for multi-process layouts
        for chunk in batch.split(micro):
            if fwd_bwd is not None:  # backward included; returns the detached cross-entropy
                with _autocast(runtime):
                    loss_sum += fwd_bwd(chunk[:, :-1], chunk[:, 1:], 1.0 / num_micro)
                continue
            with _autocast(runtime):
                loss, parts = lm_loss(model, chunk[:, :-1], chunk[:, 1:], z_loss=cfg.optim.z_loss)
            (loss / num_micro).backward()
            loss_sum += parts["ce"]  # report cross-entropy alone, without the z-loss term
        grad_norm = runtime.extra.get("clip_grad_norm", _clip)(model, cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_val = _dp_mean(loss_sum / num_micro)
        tokens = step * cfg.tokens_per_step
        now = time.perf_counter()
        tps = cfg.tokens_per_step / max(now - t_last, 1e-9)
        t_last = now
        row = dict(
            step=step,
            tokens=tokens,
            flops=flops_per_step * step,
            loss=loss_val,
            lr=lr,
            grad_norm=grad_norm,
            tokens_per_s=tps,
        )
        _check_divergence(loss_val, best_loss, tokens_before, cfg)
        best_loss = min(best_loss, loss_val)
        log_step = step % cfg.logging.interval_steps == 0 or step == cfg.num_steps
        # router statistics (MoE only) -> router.parquet; under a layout a collective over all ranks
        router = runtime.extra.get("router_row", moe_step_row)(model) if log_step else {}
        if writer is not None and log_step:
            row.update(router)
            writer.log_metrics(row)
            _emit(callbacks, "step", row)
            if logger is not None:
                logger.log(
                    {
                        "train/loss": loss_val,
                        "train/lr": lr,
                        "train/grad_norm": grad_norm,
                        "perf/tokens_per_s": tps,
                        "tokens": tokens,
                    },
                    step=step,
                )
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{tps:,.0f}")
        last = step == cfg.num_steps
        if last or (cfg.eval.interval_steps and step % cfg.eval.interval_steps == 0):
            rows = evaluate_sources(model, data.val_sets, runtime.extra.get("loss_fn") or _val_loss, runtime)
            if tasks:  # every rank runs it: under FSDP/TP the forward is collective
                rows += evaluate_tasks(model, data.tokenizer, tasks, max_seq_len=cfg.model.max_seq_len)
            if writer is not None:
                for r in rows:
                    writer.log_eval(dict(r, step=step, tokens=tokens, flops=flops_per_step * step))
                _emit(callbacks, "eval", {"step": step, "tokens": tokens, "rows": rows})
                if logger is not None:
                    logger.log({f"{r['task']}/{r['metric']}": r["value"] for r in rows}, step=step)
        if writer is not None and (last or step % max(cfg.logging.interval_steps, 10) == 0):
            writer.flush()
        if (last and cfg.checkpoint.final) or (
            cfg.checkpoint.interval_steps and step % cfg.checkpoint.interval_steps == 0
        ):
            if writer is not None:
                # Records first: once checkpoint k exists on disk, the records cover step k, so a
                # kill at any instant never leaves a checkpoint whose records were not written.
                writer.flush()
            train_state = {
                "step": step,
                "tokens": tokens,
                "sampler": data.sampler.state_dict(),
                "best_loss": best_loss,
                "run_id": config_hash(cfg),
            }
            path = ckpt.save_checkpoint(
                run_dir / "checkpoints",
                step,
                model,
                optimizer,
                train_state,
                keep_last=cfg.checkpoint.keep_last,
            )
            _emit(callbacks if writer is not None else [], "checkpoint", {"step": step, "path": str(path)})
        if step_delay:
            time.sleep(step_delay)
        if stop_after_steps is not None and step - first_step_of_session >= stop_after_steps and not last:
            if writer is not None:
                writer.flush()
            if bar is not None:
                bar.close()
            return {"status": "running", "step": step}
    if bar is not None:
        bar.close()
    summary = _summary(cfg, run_dir, writer, static, best_loss) if writer is not None else {"status": "done"}
    if runtime.is_rank0:
        write_status(run_dir, "done", **summary)
    if logger is not None:
        logger.summary_update(summary)
        logger.finish()
    return dict(summary, status="done")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _val_loss(model, inputs, targets):
    """Validation loss: plain cross-entropy (no z-loss), whatever the training objective."""
    return lm_loss(model, inputs, targets, z_loss=0.0)


def _clip(model, max_norm: float) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP/TP
        norm = norm.full_tensor()
    return float(norm)


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


def _progress(cfg, runtime, start_step):
    if not runtime.is_rank0:
        return None
    mode = cfg.logging.progress
    if mode == "off" or (mode == "auto" and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.num_steps, initial=start_step, unit="step", desc=cfg.name, dynamic_ncols=True)


class _Wandb:
    def __init__(self, run):
        self.run = run

    def log(self, data, step):
        self.run.log(data, step=step)

    def summary_update(self, data):
        self.run.summary.update({k: v for k, v in data.items() if v is not None})

    def finish(self):
        self.run.finish()


def _open_wandb(cfg, run_dir: Path, runtime: Runtime):
    if not runtime.is_rank0 or cfg.logging.wandb == "disabled":
        return None
    import wandb

    run = wandb.init(
        project=cfg.logging.wandb_project,
        name=cfg.name,
        id=config_hash(cfg),
        resume="allow",
        mode=cfg.logging.wandb,
        dir=str(run_dir),
        config=to_dict(cfg),
        reinit="finish_previous",
        settings=wandb.Settings(silent=True, console="off"),
    )
    return _Wandb(run)
