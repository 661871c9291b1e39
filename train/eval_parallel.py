"""Evaluation under a parallel layout: a checkpoint loaded sharded and scored through the layout's step.

    rows, per_example = evaluate_checkpoint_parallel(ckpt, tasks, "fsdp2xtp2")   # spawns the ranks
    lps = step_logprobs(par, requests, eot_id=tok.eot_id, seq_len=256)          # inside a rank

The model is built on the meta device, parallelized, and the checkpoint loaded into the shards by
DCP: no rank holds the whole model, whatever layout wrote the checkpoint. Multiple-choice
log-likelihoods go through the same `eval_loss` the validation loss uses: each request is one row
[eot] + context + continuation, right-padded to the sequence length, whose targets are the
continuation only (ignore_index elsewhere), so mean cross-entropy x continuation length is its
log-likelihood. That holds for every layout the loop trains (FSDP, TP with loss parallel, PP,
CP, EP): no rank builds the full logits, and the training loop scores tasks under a layout the
same way. Results equal the single-device evaluation within float rounding (tests: 1e-5 relative).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.parallelize import Parallelized
from scalelab.train.checkpoint import load_checkpoint, verify
from scalelab.train.checkpoint_verify import TRAIN_STATE
from scalelab.train.config import build_run_config
from scalelab.train.data.bundle import build_data
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_tasks import MC_METRICS, load_tasks, request_sequence, score_mc_task
from scalelab.train.evaluate import evaluate_sources
from scalelab.train.parallel_model import parallel_model
from scalelab.train.run_summary import run_summary_fields
from scalelab.train.runtime import make_runtime

IGNORE = -100


@torch.no_grad()
def step_logprobs(par: Parallelized, requests: Sequence[tuple[list[int], list[int]]], *, eot_id: int, seq_len: int):
    """log p(continuation | context) per request through `par.step.eval_loss` (a collective: every
    rank calls it with the same requests)."""
    out = []
    for ctx, cont in requests:
        full, n = request_sequence(ctx, cont, eot_id=eot_id, max_seq_len=seq_len)
        inputs = torch.full((1, seq_len), eot_id, dtype=torch.long)
        targets = torch.full((1, seq_len), IGNORE, dtype=torch.long)
        t = len(full) - 1
        inputs[0, :t] = torch.tensor(full[:-1])
        targets[0, t - n : t] = torch.tensor(full[t + 1 - n :])
        loss, _ = par.step.eval_loss(par.model, inputs.to(par.device), targets.to(par.device))
        out.append(-float(loss) * n)
    return out


def _worker(tree: dict, ckpt: str, specs: list[str], limit: int | None, with_val: bool, out: str) -> None:
    """One rank: the layout's model, the checkpoint loaded into its shards, the tasks scored."""
    cfg = build_run_config(tree)
    runtime = make_runtime(cfg)
    par = parallel_model(cfg, runtime, cfg.parallel, seed=None, z_loss=0.0)  # the checkpoint overwrites it
    load_checkpoint(ckpt, par.model, None, restore_rng=False, verified=True)  # verified by the caller
    par.model.eval()
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    seq_len = cfg.model.max_seq_len

    def scorer(requests):
        return step_logprobs(par, requests, eot_id=tokenizer.eot_id, seq_len=seq_len)

    rows, examples = [], {}
    if with_val:
        data = build_data(cfg.data, seed=cfg.train.seed, val_batch_size=cfg.eval.val_batch_sequences)
        rows += evaluate_sources(par.model, data.val_sets, par.step.eval_loss, runtime)
    for task in load_tasks(specs, limit):
        res = score_mc_task(None, tokenizer, task, max_seq_len=seq_len, scorer=scorer)
        rows += [dict(task=task.name, metric=m, value=res[m][0], stderr=res[m][1]) for m in MC_METRICS]
        examples[task.name] = res["examples"]
    if runtime.is_rank0:
        Path(out).write_text(json.dumps({"rows": rows, "examples": examples}))


def evaluate_checkpoint_parallel(
    checkpoint: str | Path,
    specs: Sequence[str],
    layout: ParallelConfig,
    *,
    limit: int | None = None,
    with_val: bool = True,
    verified: bool = False,
) -> tuple[list[dict], dict[str, list[dict]]]:
    """(rows like evaluate_checkpoint's, per-example details per task) of `checkpoint` under `layout`.

    The layout is validated against the run's model and batch before any process starts
    (ConfigError); the checkpoint is verified first (CheckpointError) unless `verified` (the caller
    just did).
    """
    ckpt = Path(checkpoint)
    state = json.loads((ckpt / TRAIN_STATE).read_text()) if verified else verify(ckpt)
    tree = json.loads((ckpt.parent.parent / "config.json").read_text())
    tree["parallel"] = dataclasses.asdict(layout)
    cfg = build_run_config(tree)  # validates the layout against this model (heads, layers, experts)
    load_tasks(specs, limit)  # unknown tasks fail here, not in every rank
    with tempfile.TemporaryDirectory(prefix="scalelab-eval-") as tmp:
        out = Path(tmp) / "result.json"
        spawn(
            _worker,
            cfg.parallel.world_size,
            (tree, str(ckpt), list(specs), limit, with_val, str(out)),
            backend=cfg.parallel.backend,
        )
        result = json.loads(out.read_text())
    step = int(state["step"])
    tokens = int(state.get("tokens", step * cfg.tokens_per_step))  # the layout changes neither
    flops = run_summary_fields(cfg)["flops_per_token_6n"] * tokens
    return [dict(r, step=step, tokens=tokens, flops=flops) for r in result["rows"]], result["examples"]
