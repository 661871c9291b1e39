"""Reshardable DCP checkpoints and the local launcher, through the real training loop.

Contract: a run checkpointed at step 2 under FSDP2 on 4 processes and continued (same config
except the layout) under TP 2 (+SP, loss parallel) or on one device logs, for steps 3-4, the losses
of an uninterrupted single-device run within 1e-5 (absolute; fp32, gloo). The FSDP and TP runs go
through `scalelab.train.launch` (the processes `scalelab run` starts) and `train_run`.
"""

import polars as pl
import pytest
import torch

from scalelab.parallel.backend import spawn
from scalelab.store.records import read_status
from scalelab.train.config import build_run_config
from scalelab.train.launch import train_worker
from scalelab.train.loop import train_run

TOL = 1e-5

BASE = {
    "name": "reshard",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    "train": {"num_tokens": 4 * 256, "global_batch_tokens": 256, "seed": 5, "device": "cpu"},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 2, "keep_last": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
    "optim": {"lr": 3e-3},
}


def _losses(run_dir) -> list[float]:
    return pl.read_parquet(run_dir / "metrics.parquet").sort("step")["loss"].to_list()


def test_fsdp4_checkpoint_resumes_under_tp2_and_single_device(tmp_path):
    torch.set_num_threads(1)
    ref = build_run_config(BASE)
    train_run(ref, tmp_path / "ref")
    expected = _losses(tmp_path / "ref")
    assert len(expected) == 4

    fsdp = build_run_config(BASE, ["parallel.dp_shard=4"])
    spawn(train_worker, 4, (fsdp, str(tmp_path / "fsdp4"), False, 2), backend="gloo")
    step2 = tmp_path / "fsdp4" / "checkpoints" / "step_2"
    assert (step2 / "train_state.json").exists()
    # the first two steps under FSDP already match the reference
    assert max(abs(a - b) for a, b in zip(_losses(tmp_path / "fsdp4"), expected[:2])) <= TOL

    tp = build_run_config(BASE, ["parallel.tp=2", f"train.init_from={step2}"])
    spawn(train_worker, 2, (tp, str(tmp_path / "tp2")), backend="gloo")
    single = build_run_config(BASE, [f"train.init_from={step2}"])
    train_run(single, tmp_path / "single")

    for name in ("tp2", "single"):
        got = _losses(tmp_path / name)
        assert len(got) == 4, name
        diffs = [abs(a - b) for a, b in zip(got[2:], expected[2:])]
        assert max(diffs) <= TOL, (name, diffs)
        # continued from the FSDP checkpoint, not retrained from step 0 (same losses either way)
        assert read_status(tmp_path / name)["loaded_steps"] == [2], name


@pytest.mark.parametrize("override", ["parallel.tp=3", "parallel.pp=4", "parallel.dp_shard=3"])
def test_bad_layouts_exit_2_before_spawning(tmp_path, capsys, override, monkeypatch):
    import yaml

    from scalelab.cli.main import main
    from scalelab.train import launch

    def no_spawn(*a, **k):
        raise AssertionError("spawned despite a bad layout")

    monkeypatch.setattr(launch, "spawn", no_spawn)
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(BASE))
    code = main(["run", str(cfg_path), "--out", str(tmp_path / "out"), "--set", override])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "parallel" in err or "train.global_batch_tokens" in err
    assert "Traceback" not in err
