"""One run end to end on the debug preset and the default corpus: records, exact resume, divergence.

Resume contract: a run interrupted after step k (in-process stop, or SIGKILL of `scalelab run`)
and resumed from its latest checkpoint logs bit-identical losses (==, no tolerance) to an
uninterrupted run with the same config.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch

from scalelab.cli.main import main
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.store.records import read_status
from scalelab.train.config import build_run_config, to_dict
from scalelab.train.loop import train_run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: restores the thread count after the module

BASE = {
    "name": "t",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    # one intra-op thread in-process and in the CLI subprocesses alike (bit-exact comparisons across
    # them; and two OpenMP threads crawl on a loaded 2-core machine)
    "train": {
        "num_tokens": 12 * 256,
        "global_batch_tokens": 256,
        "micro_batch_sequences": 4,
        "seed": 3,
        "num_threads": 1,
    },
    "eval": {"interval_steps": 4, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 4, "keep_last": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
    "optim": {"lr": 3e-3},
}


def _cfg(*overrides):
    return build_run_config(BASE, list(overrides))


def _losses(run_dir: Path) -> list[float]:
    return pl.read_parquet(run_dir / "metrics.parquet")["loss"].to_list()


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref")
    summary = train_run(_cfg(), run_dir)
    return run_dir, summary


def test_records_are_written_in_store_format(reference_run):
    run_dir, summary = reference_run
    assert summary["status"] == "done"
    status = read_status(run_dir)
    assert status["status"] == "done" and status["params"] == summary["params"]
    metrics = pl.read_parquet(run_dir / "metrics.parquet")
    assert metrics.columns == ["step", "tokens", "flops", "loss", "lr", "grad_norm", "tokens_per_s"]
    assert metrics["step"].to_list() == list(range(1, 13))
    assert metrics["tokens"].to_list() == [256 * s for s in range(1, 13)]
    evals = pl.read_parquet(run_dir / "evals.parquet")
    assert set(evals["metric"]) == {"loss", "bpb"}
    assert sorted(set(evals["step"])) == [4, 8, 12]
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved == to_dict(_cfg())
    assert status["loaded_steps"] == [None]  # a fresh run loads nothing
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_12", "step_8"]  # keep_last=2


def test_interrupted_and_resumed_run_is_bit_identical(reference_run, tmp_path):
    ref_dir, _ = reference_run
    out = train_run(_cfg(), tmp_path, stop_after_steps=6)  # checkpoint at 4, records up to 6
    assert out["status"] == "running"
    assert len(_losses(tmp_path)) == 6
    train_run(_cfg(), tmp_path, resume=True)  # resumes from step 4, redoes 5 and 6
    assert _losses(tmp_path) == _losses(ref_dir)
    assert pl.read_parquet(tmp_path / "evals.parquet").equals(pl.read_parquet(ref_dir / "evals.parquet"))
    status = read_status(tmp_path)
    # a resume, not a restart (which would log the same losses): the second attempt loaded step 4
    assert status["attempts"] == 2 and status["loaded_steps"] == [None, 4]


def test_sigkill_then_resume_from_cli_is_bit_identical(reference_run, tmp_path):
    ref_dir, _ = reference_run
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(json.dumps(to_dict(_cfg())))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "scalelab.cli", "run", str(cfg_path), "--out", str(out)]
    env = dict(os.environ, SCALELAB_TEST_STEP_DELAY_S="0.3")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (out / "checkpoints" / "step_4").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_status(out)["status"] == "running"  # killed: never marked done
    latest = list_checkpoints(out / "checkpoints")[-1][0]  # 4, or 8 if the kill came late
    # the resume through the same CLI entry point, in this process (the killed one had to be its own)
    assert main(["run", str(cfg_path), "--out", str(out), "--resume"]) == 0
    assert _losses(out) == _losses(ref_dir)
    assert read_status(out)["loaded_steps"] == [None, latest]


def test_divergence_stops_the_run_with_status_diverged(tmp_path):
    summary = train_run(_cfg("optim.lr=1e4", "optim.grad_clip=0", "train.max_loss_spike=2.0"), tmp_path)
    assert summary["status"] == "diverged"
    status = read_status(tmp_path)
    assert status["status"] == "diverged" and "loss" in status["reason"]


def test_cli_rejects_bad_config_with_one_line(tmp_path):
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(json.dumps(BASE))
    cmd = [sys.executable, "-m", "scalelab.cli", "run", str(cfg_path), "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd + ["--set", "model.num_heads=3"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "model" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()  # nothing started


def test_debug_preset_learns_below_unigram_entropy(tmp_path):
    """Validation loss falls well below the corpus's unigram entropy (the best context-free model)."""
    import numpy as np

    from scalelab.train.data.bundle import build_data

    cfg = build_run_config(
        {
            "model": {"preset": "debug"},
            "data": {"seq_len": 128, "val_sequences": 32},
            # 60 steps at 5e-3 reach ~2.70 nats on the default corpus (unigram ~3.22); 1e-2 is too hot here
            "optim": {"lr": 5e-3},
            "train": {"num_tokens": 60 * 4096, "global_batch_tokens": 4096, "num_threads": 1},
            "eval": {"interval_steps": 0},
            "checkpoint": {"interval_steps": 0, "final": False},
            "logging": {"wandb": "disabled", "progress": "off"},
        }
    )
    summary = train_run(cfg, tmp_path)
    train_tokens = np.asarray(build_data(cfg.data, seed=0).sources[0].train)
    counts = np.bincount(train_tokens, minlength=cfg.model.vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    unigram_nats = float(-(p * np.log(p)).sum())  # ~3.2 nats for the stdlib's bytes
    assert summary["final_val_loss"] < unigram_nats - 0.3, (summary["final_val_loss"], unigram_nats)


def test_multiple_choice_tasks_are_scored_at_eval_steps(tmp_path):
    cfg = _cfg("eval.tasks=[bundled:stdlib_nextline@12]", "train.num_tokens=1024", "eval.interval_steps=2")
    train_run(cfg, tmp_path)
    evals = pl.read_parquet(tmp_path / "evals.parquet").filter(pl.col("task") == "bundled/stdlib_nextline")
    assert sorted(set(evals["metric"])) == ["acc", "acc_norm", "bpb"]
    assert sorted(set(evals["step"])) == [2, 4]
    acc = evals.filter(pl.col("metric") == "acc")["value"].to_list()
    assert all(0.0 <= a <= 1.0 for a in acc)


def test_unknown_task_is_a_config_error():
    from scalelab.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.tasks"):
        _cfg("eval.tasks=[/no/such/task.jsonl]")


def _count_block_forwards(monkeypatch) -> list[int]:
    """Count forwards of every TransformerBlock that run with autograd on (training and AC recompute)."""
    from scalelab.models.llama import TransformerBlock

    calls = [0]
    forward = TransformerBlock.forward

    def counted(self, *args, **kwargs):
        if torch.is_grad_enabled():
            calls[0] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(TransformerBlock, "forward", counted)
    return calls


_ONE_DEVICE = ("train.num_tokens=512", "checkpoint.interval_steps=0", "checkpoint.final=false", "train.device=cpu")


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_applies_on_one_device(tmp_path, monkeypatch, mode):
    """parallel.activation_checkpoint on a world of 1: each block's forward runs again in backward
    (2 steps x 2 micro-batches x num_layers forwards without AC, twice as many with it), and the
    losses are the same numbers."""
    calls = _count_block_forwards(monkeypatch)
    train_run(_cfg(*_ONE_DEVICE), tmp_path / "plain")
    plain = calls[0]
    calls[0] = 0
    train_run(_cfg(*_ONE_DEVICE, f"parallel.activation_checkpoint={mode}"), tmp_path / "ac")
    num_layers = _cfg().model.num_layers
    assert plain == 2 * 2 * num_layers
    assert calls[0] == 2 * plain
    assert _losses(tmp_path / "ac") == _losses(tmp_path / "plain")


def test_compile_applies_on_one_device(tmp_path, monkeypatch):
    """parallel.compile on a world of 1 compiles every block (torch.compile recorded, not run:
    bench/one_device_compile_ac.py runs the real compile and measures it)."""
    compiled = []

    def record(fn, *args, **kwargs):
        compiled.append(getattr(fn, "__self__", fn))
        return fn

    monkeypatch.setattr(torch, "compile", record)
    train_run(_cfg(*_ONE_DEVICE, "parallel.compile=true"), tmp_path)
    from scalelab.models.llama import TransformerBlock

    assert len(compiled) == _cfg().model.num_layers
    assert all(isinstance(m, TransformerBlock) for m in compiled)


def test_init_and_data_order_have_their_own_seeds(tmp_path):
    """train.data_seed moves the data order and nothing else: at an LR too small to move a weight
    (no decay), the validation loss is the init's alone and the training loss is the init's on the
    first batches. Unset or equal to train.seed it is the run it always was (the same id)."""
    from scalelab.train.identity import config_hash

    frozen = ("train.num_tokens=512", "optim.lr=1e-30", "optim.weight_decay=0")

    def losses(*overrides):
        summary = train_run(_cfg(*frozen, *overrides), tmp_path / "-".join(overrides or ("plain",)))
        return summary["final_val_loss"], _losses(tmp_path / "-".join(overrides or ("plain",)))

    assert config_hash(_cfg(*frozen)) == config_hash(_cfg(*frozen, "train.data_seed=3"))  # seed is 3
    assert config_hash(_cfg(*frozen)) != config_hash(_cfg(*frozen, "train.data_seed=4"))
    val_ref, train_ref = losses()
    val_data, train_data = losses("train.data_seed=4")  # the init of seed 3, the data order of seed 4
    val_init, train_init = losses("train.seed=4")  # both from seed 4
    assert val_data == val_ref and train_data != train_ref  # the same init, other batches
    assert val_init != val_ref and train_init != train_data  # the same batches as data_seed=4, another init
