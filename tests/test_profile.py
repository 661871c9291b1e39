"""Profiling: the trace analysis on a hand-built trace, a profiled one-device run, and `scalelab profile`
on dp2 (two gloo ranks) with the planner's estimate beside it.

Contracts: the five time categories partition the profiled step exactly (sum = the step's trace
range, to float rounding) and that range agrees with the step's wall clock within 25% (the
profiler's own bookkeeping sits between them); one device has no communication rows, dp2 has a
non-zero all-reduce row on every rank; parameter/gradient/optimizer bytes equal the planner's exact
state bytes for the layout; the peak holds more than that state.
"""

import json
from pathlib import Path

import pytest

from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.planner_memory import state_bytes
from scalelab.train.config import build_run_config
from scalelab.train.identity import config_hash
from scalelab.train.loop import train_run
from scalelab.train.trace_analysis import CATEGORIES, analyse_trace

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = {
    "name": "p",
    "model": {"preset": "debug", "tied_embeddings": False},
    "data": {"seq_len": 32, "val_sequences": 4},
    "train": {"num_tokens": 3 * 256, "global_batch_tokens": 256, "seed": 0, "num_threads": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 0, "final": False},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def _x(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat}


def _mem(ts, total):
    return {"ph": "i", "name": "[memory]", "ts": ts, "tid": 1, "args": {"Total Allocated": total, "Device Type": 0}}


def test_categories_partition_a_hand_built_step():
    """Step 0..1000 us: data 0-100; a matmul 100-500 that waits 300-400 on a collective (nested, as a
    DTensor op does); gloo's all-reduce 280-700 on its worker thread, queued by c10d at 270-275;
    optimizer 800-900. Compute = 100-270, 275-300, 400-500; exposed = 300-400 and 500-700."""
    trace = {
        "traceEvents": [
            _x("scalelab/step#7", 0, 1000, cat="user_annotation"),
            _x("scalelab/data", 0, 100, cat="user_annotation"),
            _x("aten::mm", 100, 400),
            _x("c10d::allreduce_", 270, 5),
            _x("_c10d_functional::wait_tensor", 300, 100),
            _x("gloo:all_reduce", 280, 420, tid=2, cat="user_annotation"),
            _x("Optimizer.step#AdamW.step", 800, 100, cat="user_annotation"),
            _x("aten::add_", 810, 50),
            _mem(-5, 10),
            _mem(200, 50),
            _mem(600, 30),
            _mem(1200, 90),  # after the step
        ]
    }
    (step,) = analyse_trace(trace).values()
    assert step.step == 7 and step.step_s == pytest.approx(1e-3)
    expected = {"data": 100, "optimizer": 100, "compute": 295, "comm_exposed": 300, "idle": 205}
    assert step.times == pytest.approx({k: v * 1e-6 for k, v in expected.items()})
    assert step.comm_by_collective == pytest.approx({"all_reduce": 420e-6})
    assert step.exposed_by_collective == pytest.approx({"all_reduce": 300e-6})
    assert step.peak_alloc_bytes == 40


def test_gloo_reduce_scatter_is_named_after_its_caller():
    """gloo runs reduce-scatter as an all-reduce; the row says what the program asked for."""
    trace = {
        "traceEvents": [
            _x("scalelab/step#1", 0, 100, cat="user_annotation"),
            _x("c10d::_reduce_scatter_base_", 10, 2),
            _x("gloo:all_reduce", 12, 30, tid=2, cat="user_annotation"),
        ]
    }
    assert set(analyse_trace(trace)[1].comm_by_collective) == {"reduce_scatter"}
    assert analyse_trace(trace)[1].peak_alloc_bytes is None  # no allocation events: no CPU peak


def _check_partition(step: dict) -> None:
    total = sum(step["times"][c] for c in CATEGORIES)
    assert total == pytest.approx(step["trace_step_s"], rel=1e-9)
    assert min(step["times"].values()) >= 0
    assert step["trace_step_s"] == pytest.approx(step["wall_s"], rel=0.25)


def test_one_device_profile_has_no_communication_and_exact_state(tmp_path):
    cfg = build_run_config(BASE, ["profile.steps=[2,3,9]"])  # 9 is past the end: skipped
    assert train_run(cfg, tmp_path)["status"] == "done"
    summary = json.loads((tmp_path / "profile" / "rank0" / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [2, 3] and summary["layout"] == "single"
    trace = json.loads((tmp_path / "profile" / "rank0" / summary["steps"][0]["trace"]).read_text())
    assert any(e.get("name") == "scalelab/step#2" for e in trace["traceEvents"])
    exact = state_bytes(cfg.model, ParallelConfig(), seq_len=cfg.seq_len)
    for step in summary["steps"]:
        _check_partition(step)
        assert step["comm_by_collective"] == {} and step["times"]["comm_exposed"] == 0
        assert step["times"]["compute"] > 0 and step["times"]["optimizer"] > 0
        mem = step["memory"]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (
            exact.param_bytes,
            exact.grad_bytes,
            exact.optim_bytes,
        )
        assert mem["activations"] > 0 and mem["peak"] == sum(
            mem[k] for k in ("params", "grads", "optimizer", "activations")
        )


def test_profile_key_leaves_the_run_id_alone():
    assert config_hash(build_run_config(BASE, ["profile.steps=[2]"])) == config_hash(build_run_config(BASE))
    with pytest.raises(ConfigError, match="profile.steps"):
        build_run_config(BASE, ["profile.steps=[0]"])


@pytest.fixture(scope="module")
def dp2_profile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp2")
    cfg_path = tmp / "run.yaml"
    cfg_path.write_text(json.dumps(BASE))
    out = tmp / "prof"
    rc = main(["profile", str(cfg_path), "--layout", "dp2", "--steps", "2", "--warmup", "2", "--out", str(out)])
    return rc, out


def test_dp2_profile_reports_all_reduce_per_rank_beside_the_planner(dp2_profile, capsys):
    rc, out = dp2_profile
    assert rc == 0
    report = json.loads((out / "profile" / "report.json").read_text())
    assert report["layout"] == "dp2" and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert rank["comm_by_collective"]["all_reduce"] > 0
        assert rank["exposed_by_collective"]["all_reduce"] <= rank["comm_by_collective"]["all_reduce"] + 1e-9
        assert sum(rank["times"].values()) == pytest.approx(rank["step_s"], rel=1e-9)
    for rank_dir in sorted((out / "profile").glob("rank*")):
        summary = json.loads((rank_dir / "summary.json").read_text())
        for step in summary["steps"]:
            _check_partition(step)
        # the ranks measured gloo's per-step latency (the planner's alpha on CPU): microseconds to ms
        assert 1e-6 < summary["hardware"]["step_latency_s"] < 0.1
    planner = report["planner"]
    assert planner["comm_bytes"]["dp_replicate"] > 0 and planner["step_s"] > 0
    # DDP's per-block all-reduces hide behind backward except the last block's and the root's
    assert 0 < planner["comm_exposed_by_axis"]["dp_replicate"]
    assert planner["memory"]["params"] == report["ranks"][0]["memory"]["params"]  # exact on both sides
    assert (out / "profile" / "profile.png").stat().st_size > 0
    text = (out / "profile" / "report.md").read_text()
    assert "| planner |" in text and "all_reduce" in text
    assert main(["profile", str(out)]) == 0  # the report again from the directory
    assert "| planner |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--steps", "0"], "--steps"),
        (["--layout", "dp2x"], "layout"),
        (["--set", "profile.steps=[0]"], "profile.steps"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(tmp_path, capsys, argv, needle):
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(json.dumps(BASE))
    assert main(["profile", str(cfg_path), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_report_of_a_directory_without_profile_exits_2(tmp_path):
    assert main(["profile", str(Path(tmp_path))]) == 2


def test_a_sweep_profiles_its_runs_without_changing_their_ids():
    """`profile:` in a sweep's base config reaches every run (its records go to runs/<id>/profile/)."""
    from scalelab.sweeps.specs.spec import expand_sweep

    spec = {"name": "s", "base": {**BASE, "train": {**BASE["train"], "num_tokens": 8 * 256}}}
    spec["grid"] = {"optim.lr": [1e-3, 3e-3]}
    plain = expand_sweep(json.loads(json.dumps(spec)))
    spec["base"]["profile"] = {"steps": [4, 5]}
    profiled = expand_sweep(spec)
    assert [r.run_id for r in profiled.runs] == [r.run_id for r in plain.runs]
    assert all(r.config["profile"]["steps"] == [4, 5] for r in profiled.runs)
