"""`scalelab sweep eval`: a task added to a finished sweep, evaluated on Ray, never twice.

Contract: every checkpoint of every finished run is scored as a Ray task and its rows land in the
run's evals.parquet with the same numbers `scalelab eval` gives for that checkpoint; rerunning
evaluates nothing (the index keys are checkpoint and task digests); a second task evaluates only
that task; a task whose examples change (another --limit) is scored again.
"""

import json

import polars as pl
import yaml

from scalelab.cli.main import main
from scalelab.sweeps.execution.evaluate import INDEX
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.train.eval_checkpoint import evaluate_checkpoint
from scalelab.train.eval_tasks import load_tasks

SPEC = {
    "name": "evals",
    "base": {
        "model": {"preset": "debug"},
        "data": {"seq_len": 64, "val_sequences": 8},
        "train": {"global_batch_tokens": 256, "num_tokens": 2560, "device": "cpu"},
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 5, "keep_last": 0},
        "logging": {"wandb": "disabled", "progress": "off"},
    },
    "grid": {"optim.lr": [1e-3, 1e-2]},
}
NEXTLINE = "bundled:stdlib_nextline"
COMPLETION = "bundled:stdlib_completion"


def _sweep_eval(sweep, capsys, *tasks, limit=12) -> str:
    capsys.readouterr()
    assert main(["sweep", "eval", str(sweep), "--tasks", *tasks, "--limit", str(limit)]) == 0
    return capsys.readouterr().err


def _rows(sweep) -> pl.DataFrame:
    frames = [
        pl.read_parquet(p).with_columns(run=pl.lit(p.parent.name)) for p in sorted(sweep.glob("runs/*/evals.parquet"))
    ]
    return pl.concat(frames).filter(pl.col("task") != "val").sort("run", "step", "task", "metric")


def test_a_task_added_to_a_finished_sweep_is_evaluated_once(ray_local, tmp_path, capsys):
    sweep = tmp_path / "root" / "evals"
    result = launch(expand_sweep(SPEC), sweep, spec_text=yaml.safe_dump(SPEC), log=lambda m: None)
    assert set(result["states"].values()) == {"done"}
    ckpts = sorted(sweep.glob("runs/*/checkpoints/step_*"))
    assert len(ckpts) == 4  # 2 runs x steps 5 and 10

    err = _sweep_eval(sweep, capsys, NEXTLINE)
    assert "0 evaluation(s) already in the store; 4 checkpoint(s) to evaluate" in err, err
    first = _rows(sweep)
    nextline = first.filter(pl.col("task").str.contains("nextline"))
    assert nextline.select("run", "step").unique().height == 4

    # the numbers are those of `scalelab eval` on the same checkpoint
    ckpt = next(p for p in ckpts if p.name == "step_5")
    direct = evaluate_checkpoint(ckpt, load_tasks([NEXTLINE], 12), with_val=False).rows
    stored = nextline.filter((pl.col("run") == ckpt.parent.parent.name) & (pl.col("step") == 5))
    assert {r["metric"]: r["value"] for r in direct} == dict(zip(stored["metric"], stored["value"]))

    # rerun: nothing evaluated, nothing rewritten
    mtimes = {p: p.stat().st_mtime_ns for p in sweep.glob("runs/*/evals.parquet")}
    err = _sweep_eval(sweep, capsys, NEXTLINE)
    assert "4 evaluation(s) already in the store; 0 checkpoint(s) to evaluate" in err, err
    assert {p: p.stat().st_mtime_ns for p in sweep.glob("runs/*/evals.parquet")} == mtimes

    # a second task: only it is scored; the first task's rows are untouched
    err = _sweep_eval(sweep, capsys, NEXTLINE, COMPLETION)
    assert "4 evaluation(s) already in the store; 4 checkpoint(s) to evaluate" in err, err
    assert "1 task(s)" in err and "2 task(s)" not in err, err
    both = _rows(sweep)
    assert both.filter(pl.col("task").str.contains("nextline")).equals(nextline)
    assert both.filter(pl.col("task").str.contains("completion")).select("run", "step").unique().height == 4
    index = json.loads((ckpt.parent.parent / INDEX).read_text())
    assert sorted(e["task"] for e in index.values()) == sorted(
        [*[t.name for t in load_tasks([NEXTLINE, COMPLETION], 12)]] * 2
    )

    # other examples (another limit): a different task digest, so it is scored again
    err = _sweep_eval(sweep, capsys, NEXTLINE, limit=6)
    assert "0 evaluation(s) already in the store; 4 checkpoint(s) to evaluate" in err, err
