"""`scalelab eval` on a real (tiny) run: per-checkpoint rows merged into evals.parquet, and the
standalone held-out loss equal to what the training loop logged at the same step."""

import polars as pl
import pytest
import torch

from scalelab.cli.main import main
from scalelab.train.config import build_run_config
from scalelab.train.loop import train_run

BASE = {
    "name": "t",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    "train": {"num_tokens": 8 * 256, "global_batch_tokens": 256, "seed": 3},
    "eval": {"interval_steps": 4, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 4, "keep_last": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def test_eval_cli_merges_rows_and_matches_training_validation(tmp_path, capsys):
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    train_run(build_run_config(BASE), run_dir)
    before = pl.read_parquet(run_dir / "evals.parquet")
    rc = main(["eval", str(run_dir), "--tasks", "bundled:stdlib_nextline@12", "bundled:stdlib_completion@12"])
    assert rc == 0
    after = pl.read_parquet(run_dir / "evals.parquet")
    for step in (4, 8):
        for task in ("bundled/stdlib_nextline", "bundled/stdlib_completion"):
            got = after.filter((pl.col("step") == step) & (pl.col("task") == task))
            assert sorted(got["metric"]) == ["acc", "acc_norm", "bpb"]
            assert got["tokens"].to_list() == [step * 256] * 3
    # recomputed validation rows replace the loop's rows and hold the same numbers
    key = ["step", "task", "metric"]
    joined = before.join(after, on=key, suffix="_new")
    assert joined.height == before.height
    assert joined["value"].to_list() == pytest.approx(joined["value_new"].to_list(), rel=1e-5)
    assert "bundled/stdlib_nextline" in capsys.readouterr().out


def test_eval_cli_bad_path_is_one_line(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--tasks", "bundled:stdlib_nextline"]) == 2
    assert "neither a checkpoint dir" in capsys.readouterr().err
