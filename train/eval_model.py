"""The one evaluation: held-out loss and bits-per-byte per source, and multiple-choice tasks.

    ev = evaluate(par, tokenizer=tok, tasks=tasks, val_sets=data.val_sets, max_seq_len=256, autocast_dtype=None)
    ev.rows                                     # [{task, metric, value, stderr}]: evals.parquet's columns
    ev.stamped(step=400, tokens=t, flops=c)     # the rows with the point of the run they score
    ev.examples                                 # {task: per-example details}: what eval-parity pairs

Every evaluation goes through `evaluate`: the training loop at its eval steps (scalelab.train.loop),
a saved checkpoint on one device or under a layout (`scalelab eval`, `sweep eval`:
scalelab.train.eval_checkpoint), and every setup of `scalelab eval-parity` (scalelab.train.eval_setups).
`par` is the model under its layout (`Parallelized`; one device is a layout too):

- validation: each source's held-out batches through `par.step.eval_loss` (mean cross-entropy, no
  z-loss), averaged over batches weighted by rows. bits-per-byte = (mean loss in nats / ln 2) ×
  tokens / bytes of the held-out text, comparable across tokenizers (the ratio comes from the shard
  index: end-of-text tokens carry no bytes). `stderr` across batches is a rough noise scale (batches
  are not independent documents: read it as a lower bound).
- tasks: on one device from batched logits (`continuation_logprobs`: batch size and padding side
  are the setup's); under a layout one row per request through `par.step.eval_loss`
  (`step_logprobs`), so no rank builds full logits. Under a layout `evaluate` is a collective: every
  rank calls it with the same arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from scalelab.parallel.parallelize import Parallelized
from scalelab.train.eval_tasks import MC_METRICS, MCTask, request_sequence, score_mc_task

IGNORE = -100


@dataclass(kw_only=True, slots=True)
class Evaluation:
    rows: list[dict]  # {task, metric, value, stderr}: validation rows first, then each task's metrics
    examples: dict[str, list[dict]] = field(default_factory=dict)  # per task: score_mc_task's details

    def stamped(self, *, step: int, tokens: int, flops: float) -> list[dict]:
        """The rows as evals.parquet holds them: with the step, tokens and FLOPs they were scored at."""
        return [dict(r, step=step, tokens=tokens, flops=flops) for r in self.rows]


def evaluate(
    par: Parallelized,
    *,
    tokenizer,
    tasks: Sequence[MCTask] = (),
    val_sets: Sequence = (),
    max_seq_len: int,
    autocast_dtype: torch.dtype | None,
    batch_sequences: int = 16,
    padding: str = "right",
) -> Evaluation:
    """Validation rows for `val_sets`, then every task's metrics (see the module docstring).

    Args:
        par: the model under its layout; its model is left in the train/eval mode it came in.
        tokenizer: the run's tokenizer (task texts and the end-of-text id).
        tasks: resolved tasks (scalelab.train.eval_tasks.load_tasks); per-example details come back too.
        val_sets: scalelab.train.data.sampler.ValSet's (empty: no validation rows).
        max_seq_len: the model's context; longer requests are truncated from the left.
        autocast_dtype: the validation forward's autocast (None: the parameters' dtype).
        batch_sequences, padding: one device only (a layout scores one request per row).
    """
    rows = _validation_rows(par, val_sets, autocast_dtype)
    scorer = None
    if par.dims.world_size > 1:  # any layout, pp included: through the step's eval loss

        def scorer(requests):
            return step_logprobs(par, requests, eot_id=tokenizer.eot_id, seq_len=max_seq_len)

    examples = {}
    for task in tasks:
        res = score_mc_task(
            par.model,
            tokenizer,
            task,
            max_seq_len=max_seq_len,
            batch_sequences=batch_sequences,
            padding=padding,
            scorer=scorer,
        )
        rows += [dict(task=task.name, metric=m, value=res[m][0], stderr=res[m][1]) for m in MC_METRICS]
        examples[task.name] = res["examples"]
    return Evaluation(rows=rows, examples=examples)


@torch.no_grad()
def _validation_rows(par: Parallelized, val_sets: Sequence, autocast_dtype: torch.dtype | None) -> list[dict]:
    """(task, metric, value, stderr) rows: loss and bpb per source, then the mixture average as "val"."""
    if not val_sets:
        return []
    model = par.model
    was_training = model.training
    model.eval()
    rows, losses = [], []
    for vs in val_sets:
        per_batch = []
        for batch in vs.batches:
            batch = batch.to(par.device, non_blocking=True)
            with autocast_for(par.device, autocast_dtype):
                loss, _ = par.step.eval_loss(model, batch[:, :-1], batch[:, 1:])
            per_batch.append(float(loss))
        sizes = [b.shape[0] for b in vs.batches]  # the last batch may be smaller: weight by rows
        mean = sum(x * n for x, n in zip(per_batch, sizes)) / sum(sizes)
        var = sum((x - mean) ** 2 for x in per_batch) / max(len(per_batch) - 1, 1)
        stderr = math.sqrt(var / len(per_batch)) if len(per_batch) > 1 else float("nan")
        bpb = vs.bpb(mean)
        rows.append(dict(task=f"val/{vs.name}", metric="loss", value=mean, stderr=stderr))
        rows.append(
            dict(task=f"val/{vs.name}", metric="bpb", value=bpb, stderr=stderr / math.log(2) / vs.bytes_per_token)
        )
        losses.append((mean, bpb))
    if len(losses) > 1:
        rows.append(dict(task="val", metric="loss", value=sum(x for x, _ in losses) / len(losses), stderr=float("nan")))
        rows.append(dict(task="val", metric="bpb", value=sum(b for _, b in losses) / len(losses), stderr=float("nan")))
    else:
        rows.append(dict(rows[0], task="val"))
        rows.append(dict(rows[1], task="val"))
    if was_training:
        model.train()
    return rows


@torch.no_grad()
def step_logprobs(par: Parallelized, requests: Sequence[tuple[list[int], list[int]]], *, eot_id: int, seq_len: int):
    """log p(continuation | context) per request through `par.step.eval_loss` (a collective: every
    rank calls it with the same requests).

    Each request is one row [eot] + context + continuation, right-padded to `seq_len`, whose targets
    are the continuation only (ignore_index elsewhere): mean cross-entropy × continuation length is
    its log-likelihood. That holds for every layout the loop trains (FSDP, TP with loss parallel,
    PP, CP, EP).
    """
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


def autocast_for(device: torch.device, dtype: torch.dtype | None):
    """The autocast context of a run's dtype on its device (disabled for fp32)."""
    if dtype is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)
