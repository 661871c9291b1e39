"""Bad input on the command line: exit 2, one line naming the key/value and the fix, nothing written.

The cases of the hardening fuzz that used to end in a traceback, in a silently rounded batch, or
in a failed run directory that then blocked the corrected command. (scripts/bad_inputs.py runs
the whole fuzz table as separate processes.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from scalelab.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: restores the thread count after the module

RUN = {
    "name": "bad",
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"num_tokens": 1024, "global_batch_tokens": 256, "num_threads": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 0},
    "logging": {"wandb": "disabled", "progress": "off"},
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(yaml.safe_dump(RUN))
    Path("a_file").write_text("not a directory")
    Path("broken.yaml").write_text("model:\n  preset: debug\ndata: {seq_len: 64\ntrain:\n  seed: 1\n")
    Path("good_sweep.yaml").write_text(yaml.safe_dump({"name": "s", "base": RUN, "grid": {"optim.lr": [1e-3]}}))
    Path("sweep.yaml").write_text(
        yaml.safe_dump({"name": "s", "base": {**RUN, "parallel": {"dp_shard": 0}}, "grid": {"optim.lr": [1e-3]}})
    )
    return tmp_path


CASES = [
    (["run", "run.yaml", "--out", "o", "--set", "parallel.dp_shard=0"], r"parallel\.dp_shard: 0 must be an integer"),
    (["run", "run.yaml", "--out", "o", "--set", "parallel.tp=0"], r"parallel\.tp: 0 must be an integer >= 1"),
    (["run", "run.yaml", "--out", "o", "--set", "optim.lr=nan"], r"optim\.lr: nan is not a finite number"),
    (["run", "run.yaml", "--out", "o", "--set", "optim.beta2=.inf"], r"optim\.beta2: inf is not a finite number"),
    (["run", "run.yaml", "--out", "o", "--set", "train.init_from=/missing"], r"checkpoint /missing: no such"),
    (["run", "run.yaml", "--out", "a_file"], r"--out a_file is a file"),
    (["run", "run.yaml", "--out", "o", "--set", "train.num_tokens=1e30"], r"data\.sources\[0\]\.max_epochs"),
    (
        ["run", "run.yaml", "--out", "o", "--set", "train.global_batch_tokens=100"],
        r"train\.global_batch_tokens: 100 is not a whole number of sequences .*use 64 or 128",
    ),
    (["run", "broken.yaml", "--out", "o"], r"broken\.yaml: invalid YAML at line 4, column 6"),
    (["sweep", "plan", "sweep.yaml", "--no-measure"], r"parallel\.dp_shard: 0 must be an integer >= 1"),
    (["sweep", "launch", "sweep.yaml", "--out", "o"], r"parallel\.dp_shard: 0 must be an integer >= 1"),
    (["sweep", "launch", "good_sweep.yaml", "--out", "a_file"], r"--out a_file is a file"),
    (["sweep", "resume", "a_file"], r"a_file is not a sweep directory"),
    (["eval", "o", "--batch-sequences", "0"], r"--batch-sequences 0: must be >= 1"),
    (["eval", "o", "--limit", "-1"], r"--limit -1: must be >= 1"),
    (["export", "o", "--hf", "hf", "--dtype", "int8"], r"--dtype 'int8': use one of float32"),
    (["export", "o", "--hf", "hf", "--max-shard-gb", "0"], r"--max-shard-gb 0.0: must be > 0"),
    (["export", "missing", "--hf", "hf"], r"missing is neither a checkpoint dir"),
    (["eval", "o", "--layout", "fsdp2xbogus3"], r"bogus3"),
    (["eval-parity", "o", "--variants", "layout=tp2;layout=nope2"], r"nope2"),
]


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(c[0][:1] + c[0][3:]) or c[0][0] for c in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(workdir, capsys, argv, message):
    import re

    before = sorted(p.name for p in workdir.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert sorted(p.name for p in workdir.iterdir()) == before  # nothing created


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only case")
def test_eval_on_cuda_without_a_gpu_is_one_line(workdir, capsys):
    assert main(["eval", "o", "--device", "cuda"]) == 2
    assert "no GPU is visible" in capsys.readouterr().err


def test_a_rejected_run_leaves_nothing_that_blocks_the_corrected_command(workdir, capsys):
    for bad in ("train.num_tokens=1e30", "optim.lr=nan", "parallel.tp=0"):
        assert main(["run", "run.yaml", "--out", "o", "--set", bad]) == 2
    capsys.readouterr()
    assert main(["run", "run.yaml", "--out", "o"]) == 0
    assert json.loads((workdir / "o" / "status.json").read_text())["status"] == "done"
    # the run's time on both clocks (what a CPU plan is checked against); one thread: CPU <= wall
    wall, cpu = map(float, re.search(r"train ([\d.]+) s wall, ([\d.]+) s CPU", capsys.readouterr().out).groups())
    assert 0 < cpu <= wall * 1.05 + 0.2
