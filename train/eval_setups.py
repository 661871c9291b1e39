"""Evaluation setups and per-example scores under each (what `scalelab eval-parity` compares).

    ref = parse_setup("dtype=fp32,batch=16,padding=right")
    variants = parse_variants("dtype=bf16;batch=1,32;padding=left", ref)   # one field changed each
    frame = score_examples(par, tokenizer, tasks, variants[0], max_seq_len=cfg.model.max_seq_len)
    frame = score_layout(checkpoint, tasks, parse_setup("layout=fsdp2"), verified=True)

A setup is what an evaluation run chooses besides the checkpoint: the parallel layout, the dtype
the model computes in, the batch size (which changes padding and the shapes of every matmul) and
the padding side. The frame has one row per (task, example, metric): acc, acc_norm, bpb and
logprob (the gold continuation's log-likelihood, the most sensitive of them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace

import polars as pl
import torch

from scalelab.errors import UsageError
from scalelab.parallel.layouts import parse_layout
from scalelab.parallel.parallelize import Parallelized
from scalelab.train.eval_checkpoint import evaluate_checkpoint
from scalelab.train.eval_model import evaluate
from scalelab.train.eval_tasks import MCTask

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PADDINGS = ("right", "left")
PER_EXAMPLE_SCHEMA = {"task": pl.String, "example": pl.Int64, "metric": pl.String, "value": pl.Float64}


@dataclass(frozen=True)
class EvalSetup:
    layout: str = "single"
    dtype: str = "fp32"
    batch: int = 16
    padding: str = "right"

    def label(self, reference: EvalSetup | None = None) -> str:
        """`key=value` for the fields that differ from `reference` (all fields without one)."""
        parts = [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if reference is None or getattr(self, f.name) != getattr(reference, f.name)
        ]
        return ",".join(parts) or "reference"


def _field(key: str, value: str, where: str) -> tuple[str, object]:
    if key == "dtype":
        if value not in DTYPES:
            raise UsageError(f"{where}: dtype={value!r}; use one of {', '.join(DTYPES)}")
        return key, value
    if key == "batch":
        if not value.isdigit() or int(value) < 1:
            raise UsageError(f"{where}: batch={value!r}; use a whole number >= 1, e.g. batch=1,32")
        return key, int(value)
    if key == "padding":
        if value not in PADDINGS:
            raise UsageError(f"{where}: padding={value!r}; use right or left")
        return key, value
    if key == "layout":
        if value != "single":
            parse_layout(value)  # a bad name fails here, before anything runs
        return key, value
    raise UsageError(f"{where}: {key!r} is not a setup field; use layout, dtype, batch or padding")


def parse_setup(text: str, base: EvalSetup | None = None) -> EvalSetup:
    """`key=value,key=value` over `base` (default EvalSetup())."""
    setup = base or EvalSetup()
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--reference {text!r}: {item!r} is not key=value; e.g. dtype=fp32,batch=16")
        setup = replace(setup, **dict([_field(key.strip(), value.strip(), "--reference")]))
    return setup


def parse_variants(text: str, reference: EvalSetup) -> list[EvalSetup]:
    """`key=v1,v2;key=v3` -> one setup per value, each the reference with that one field changed."""
    out: list[EvalSetup] = []
    for group in filter(None, (g.strip() for g in text.split(";"))):
        key, sep, values = group.partition("=")
        if not sep or not values.strip():
            raise UsageError(f"--variants: {group!r} is not key=v1,v2; e.g. dtype=bf16;batch=1,32")
        for value in filter(None, (v.strip() for v in values.split(","))):
            setup = replace(reference, **dict([_field(key.strip(), value, "--variants")]))
            if setup != reference and setup not in out:
                out.append(setup)
    if not out:
        raise UsageError(f"--variants {text!r}: no setup differs from the reference; e.g. dtype=bf16")
    return out


def model_for(model: torch.nn.Module, setup: EvalSetup) -> torch.nn.Module:
    """The single-device model in the setup's dtype (a copy when it changes)."""
    dtype = DTYPES[setup.dtype]
    if next(model.parameters()).dtype == dtype:
        return model
    return copy.deepcopy(model).to(dtype)


def examples_frame(examples: dict[str, list[dict]]) -> pl.DataFrame:
    """Per-example rows (task, example, metric, value) from score_mc_task's details per task name."""
    rows = []
    for task, details in examples.items():
        for e, ex in enumerate(details):
            values = dict(ex["values"], logprob=ex["logprobs"][ex["gold"]])
            rows += [dict(task=task, example=e, metric=k, value=float(v)) for k, v in values.items()]
    return pl.DataFrame(rows, schema=PER_EXAMPLE_SCHEMA)


def score_examples(
    par: Parallelized, tokenizer, tasks: list[MCTask], setup: EvalSetup, *, max_seq_len: int
) -> pl.DataFrame:
    """Per-example metric values of `tasks` under a one-device `setup` (`par`: the checkpoint's model
    on one device, fp32; layouts: score_layout)."""
    if setup.layout != "single":
        raise UsageError(f"layout={setup.layout}: a layout is scored by score_layout, from the checkpoint")
    # the setup's dtype: the same step on a copy of the model in that dtype (fp32: the model itself)
    ev = evaluate(
        replace(par, model=model_for(par.model, setup)),
        tokenizer=tokenizer,
        tasks=tasks,
        max_seq_len=max_seq_len,
        autocast_dtype=None,
        batch_sequences=setup.batch,
        padding=setup.padding,
    )
    return examples_frame(ev.examples)


def score_layout(checkpoint, tasks: list[MCTask], setup: EvalSetup, *, verified: bool = False) -> pl.DataFrame:
    """Per-example metric values under a parallel layout: the checkpoint loaded sharded on its ranks.

    The layout's ranks score one row per request in fp32 (scalelab.train.eval_model.step_logprobs), so
    a layout setup may differ from an fp32, right-padded reference in its layout only.
    """
    if setup.dtype != "fp32" or setup.padding != "right":
        raise UsageError(f"{setup.label()}: a layout setup is scored in fp32 with right padding; vary one field")
    ev = evaluate_checkpoint(checkpoint, tasks, layout=parse_layout(setup.layout), with_val=False, verified=verified)
    return examples_frame(ev.examples)
