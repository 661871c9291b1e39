"""Validation during training: loss and bits-per-byte on each source's held-out split.

bits-per-byte = (mean loss in nats / ln 2) × tokens / bytes of the held-out text, which is
comparable across tokenizers (the byte tokenizer has exactly one byte per token... except for the
end-of-text tokens, which carry no bytes: the ratio comes from the shard index, not assumed).
"""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def evaluate_sources(model, val_sets: list, loss_fn, runtime) -> list[dict]:
    """Rows (task, metric, value, stderr) for every validation set, plus the mixture average.

    `val_sets` are `scalelab.train.data.sampler.ValSet`s (batches and the exact byte count);
    `loss_fn(model, inputs, targets)` returns (mean loss, metrics).
    """
    was_training = model.training
    model.eval()
    rows = []
    losses = []
    if not val_sets:
        return rows
    for vs in val_sets:
        name, bytes_per_token = vs.name, vs.bytes_per_token
        per_batch = []
        for batch in vs.batches:
            batch = batch.to(runtime.device, non_blocking=True)
            with autocast_for(runtime):
                loss, _ = loss_fn(model, batch[:, :-1], batch[:, 1:])
            per_batch.append(float(loss))
        sizes = [b.shape[0] for b in vs.batches]  # the last batch may be smaller: weight by rows
        mean = sum(x * n for x, n in zip(per_batch, sizes)) / sum(sizes)
        # stderr across batches: a rough noise scale of the estimate (batches are not independent
        # documents, so read it as a lower bound).
        var = sum((x - mean) ** 2 for x in per_batch) / max(len(per_batch) - 1, 1)
        stderr = math.sqrt(var / len(per_batch)) if len(per_batch) > 1 else float("nan")
        bpb = vs.bpb(mean)
        rows.append(dict(task=f"val/{name}", metric="loss", value=mean, stderr=stderr))
        rows.append(dict(task=f"val/{name}", metric="bpb", value=bpb, stderr=stderr / math.log(2) / bytes_per_token))
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


def autocast_for(runtime):
    """The autocast context of a run's dtype on its device (disabled for fp32)."""
    if runtime.autocast_dtype is None:
        return torch.autocast(runtime.device.type, enabled=False)
    return torch.autocast(runtime.device.type, dtype=runtime.autocast_dtype)
