"""eval-parity: systematic shifts between evaluation setups, against a known truth and a real checkpoint.

Contract: on synthetic paired scores the table recovers a planted shift (inside its 95% interval),
calls an unchanged setup ok, a planted shift above the noise fraction "shifts", and a setup that
reverses two checkpoints' order "flips ranking". On a trained debug checkpoint through the CLI,
batch size changes no example's log-likelihood by more than 1e-5 (right padding, fp32: the pads are
never attended), bf16 moves them measurably, and the per-example scores and summary are written.
"""

import json

import numpy as np
import polars as pl
import pytest
import yaml

from scalelab.analysis.eval_parity import REFERENCE, parity_table
from scalelab.analysis.report import _eval_invariance_section
from scalelab.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _frame(values: dict[str, np.ndarray], task: str = "t", metric: str = "logprob") -> pl.DataFrame:
    return pl.concat(
        pl.DataFrame({"setup": s, "task": task, "example": np.arange(len(v)), "metric": metric, "value": v})
        for s, v in values.items()
    )


def test_planted_shifts_are_recovered_and_judged():
    rng = np.random.default_rng(0)
    ref = rng.normal(-50.0, 5.0, 400)  # between-example sd 5: the score's standard error is 0.25
    planted = 0.3
    frame = _frame(
        {
            REFERENCE: ref,
            "same": ref.copy(),
            "small": ref + 0.01 + rng.normal(0, 0.002, 400),  # systematic, 4% of the noise
            "big": ref + planted + rng.normal(0, 0.05, 400),
        }
    )
    table = {r["setup"]: r for r in parity_table(frame).iter_rows(named=True)}
    assert table["same"]["shift"] == 0 and table["same"]["verdict"] == "ok"
    assert table["small"]["verdict"] == "detected", table["small"]
    big = table["big"]
    assert big["lo"] <= planted <= big["hi"] and abs(big["shift"] - planted) < 0.02
    assert big["verdict"] == "shifts" and big["eval_se"] == pytest.approx(ref.std(ddof=1) / 20)

    # a second checkpoint 0.1 better under the reference, 0.2 worse under "big": the order flips
    other = _frame({REFERENCE: ref - 0.1, "same": ref - 0.1, "small": ref - 0.1, "big": ref + 0.5})
    flips = {r["setup"]: r["verdict"] for r in parity_table(frame, compare=other).iter_rows(named=True)}
    assert flips == {"same": "ok", "small": "detected", "big": "flips ranking"}

    # the store's noise replaces the evaluation's own when given
    noisy = parity_table(frame, noise={("t", "logprob"): 10.0}).filter(pl.col("setup") == "big").row(0, named=True)
    assert noisy["noise"] == 10.0 and noisy["verdict"] == "detected"


RUN = {
    "name": "parity",
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"num_tokens": 4 * 1024, "global_batch_tokens": 1024, "seed": 1, "device": "cpu"},
    "optim": {"lr": 1e-2},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 4},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def test_cli_on_a_trained_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    assert main(["run", "run.yaml", "--out", "r"]) == 0
    argv = ["eval-parity", "r", "--tasks", "bundled:stdlib_nextline@24", "--variants", "batch=1,7;dtype=bf16"]
    capsys.readouterr()
    assert main(argv) == 0
    assert "dtype=bf16" in capsys.readouterr().out
    out = tmp_path / "r" / "eval_parity" / "step_4"
    per = pl.read_parquet(out / "per_example.parquet").filter(pl.col("metric") == "logprob")
    ref = per.filter(pl.col("setup") == REFERENCE).sort("example")["value"].to_numpy()
    for setup in ("batch=1", "batch=7"):
        got = per.filter(pl.col("setup") == setup).sort("example")["value"].to_numpy()
        assert np.abs(got - ref).max() <= 1e-5, setup
    bf16 = per.filter(pl.col("setup") == "dtype=bf16").sort("example")["value"].to_numpy()
    assert np.abs(bf16 - ref).max() > 1e-3  # bf16 rounding moves the log-likelihoods
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"] == ["batch=1", "batch=7", "dtype=bf16"] and len(summary["rows"]) == 3 * 4

    # the report's section lists every row of the run's eval-parity summary
    html = _eval_invariance_section(pl.DataFrame({"run_dir": [str(tmp_path / "r")]}))
    assert "<h2>Evaluation invariance</h2>" in html and html.count("dtype=bf16") == 4
    assert _eval_invariance_section(pl.DataFrame({"run_dir": [str(tmp_path)]})) == ""


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--variants", "dtype=fp8"], r"dtype='fp8'; use one of fp32, bf16"),
        (["--variants", "batch=0"], r"batch='0'; use a whole number >= 1"),
        (["--variants", "colour=red"], r"'colour' is not a setup field"),
        (["--variants", "dtype=fp32"], r"no setup differs from the reference"),
    ],
)
def test_bad_variants_exit_2_before_anything_is_read(tmp_path, capsys, extra, message):
    import re

    assert main(["eval-parity", str(tmp_path / "missing"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not any(tmp_path.iterdir())
