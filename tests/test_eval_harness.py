"""lm-evaluation-harness adapter: its methods directly, and a full offline simple_evaluate run of the real
lm-eval package (in the dev extras) on a local-JSONL task YAML that must agree with scalelab's own MC
evaluator. Nothing reaches the network: the task and its data are files in tmp_path, the hub is offline,
and the task manager indexes only that folder (lm-eval's own ~10k task YAMLs would take ~18 s)."""

import json
import math

import lm_eval
import numpy as np
import pytest
import torch
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_harness import HAVE_LM_EVAL, ScalelabLM
from scalelab.train.eval_tasks import MCExample, MCTask, score_mc_task


class Bigram(torch.nn.Module):
    def __init__(self, vocab: int = 257, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 2.0)

    def forward(self, tokens):
        return self.table[tokens]


class Req:
    """The shape of lm-eval's Instance as the LM sees it: a tuple in `.args`."""

    def __init__(self, *args):
        self.args = args


def _logp(table, prev, nxt):
    row = table[prev]
    return row[nxt] - (np.log(np.exp(row - row.max()).sum()) + row.max())


def test_loglikelihood_and_rolling_match_hand_computation():
    model = Bigram(seed=1)
    table = model.table.detach().double().numpy()
    lm = ScalelabLM(model, load_tokenizer("byte"), max_seq_len=8, batch_sequences=2)
    ((lp, greedy),) = lm.loglikelihood([Req("ab", "cd")])
    seq = [256, *b"abcd"]
    assert lp == pytest.approx(_logp(table, seq[2], seq[3]) + _logp(table, seq[3], seq[4]), rel=1e-5)
    assert greedy == all(np.argmax(table[seq[t - 1]]) == seq[t] for t in (3, 4))
    text = "hello rolling world, longer than one window"
    (total,) = lm.loglikelihood_rolling([Req(text)])
    ids = [256, *text.encode()]
    want = sum(_logp(table, ids[t - 1], ids[t]) for t in range(1, len(ids)))
    assert total == pytest.approx(want, rel=1e-5)


def test_generate_until_is_greedy_and_stops():
    model = Bigram(seed=2)
    table = model.table.detach().numpy()
    lm = ScalelabLM(model, load_tokenizer("byte"), max_seq_len=16)
    (out,) = lm.generate_until([Req("x", {"until": [], "max_gen_toks": 5})])
    prev, want = ord("x"), []
    for _ in range(5):
        nxt = int(np.argmax(table[prev]))
        if nxt == 256:
            break
        want.append(nxt)
        prev = nxt
    assert out == load_tokenizer("byte").decode(want)
    if len(out) >= 2:
        (cut,) = lm.generate_until([Req("x", {"until": [out[1]], "max_gen_toks": 5})])
        assert cut == out[: out.index(out[1])]


def test_lm_eval_simple_evaluate_offline_matches_own_evaluator(tmp_path, monkeypatch):
    assert HAVE_LM_EVAL and get_model("scalelab") is ScalelabLM  # `lm_eval --model scalelab` finds it
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # everything is local: never reach for the hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "pi", "omega", "x", "longer choice"]
    docs = []
    for i in range(12):
        choices = list(rng.choice(words, size=3, replace=False))
        docs.append({"context": f"item {i}:", "choices": choices, "gold": int(rng.integers(3))})
    data = tmp_path / "toy.jsonl"
    data.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tmp_path / "toy.yaml").write_text(
        "task: scalelab_toy\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n  cache_dir: {tmp_path / 'hf-datasets'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{gold}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    torch.set_num_threads(1)
    model = Bigram(seed=4)
    tok = load_tokenizer("byte")
    lm = ScalelabLM(model, tok, max_seq_len=32)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["scalelab_toy"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        bootstrap_iters=0,
        log_samples=False,
    )
    got = results["results"]["scalelab_toy"]
    # lm-eval puts its target delimiter " " in front of every choice
    examples = [
        MCExample(context=d["context"], choices=tuple(" " + c for c in d["choices"]), gold=d["gold"]) for d in docs
    ]
    own = score_mc_task(model, tok, MCTask(name="toy", examples=examples), max_seq_len=32)
    assert got["acc,none"] == pytest.approx(own["acc"][0])
    # lm-eval's acc_norm divides by the choice's characters without the delimiter
    norm = [
        float(np.argmax(np.array(det["logprobs"]) / [len(c) for c in d["choices"]]) == d["gold"])
        for det, d in zip(own["examples"], docs)
    ]
    assert got["acc_norm,none"] == pytest.approx(np.mean(norm))
    assert not math.isnan(got["acc,none"])
