"""experiments/gap_power.py (the paired gap's coverage, width and power on simulated studies) on a tiny
configuration: both methods measured on the same studies, the four figures per method, bad input refused."""

import json

from experiments import gap_power


def test_the_bench_measures_both_methods_on_the_same_simulated_studies(tmp_path, capsys):
    rc = gap_power.main(
        ["--trials", "2", "--noise", "0.003", "--truths", "none,E +0.09", "--json", str(tmp_path / "g.json")]
    )
    assert rc == 0
    assert "truth E +0.09         true gap at 2e13 +0.0900 nats" in capsys.readouterr().out
    summary = json.loads((tmp_path / "g.json").read_text())
    assert set(summary["methods"]) == {"noise_corrected", "backtest_t"} and summary["load_average"]
    for method in summary["methods"].values():
        s = method["all"]
        assert s["studies"] == 4 and s["no_gap"] == 2 and s["big_gaps"] == 2  # 0.09 nats > 2 x 0.0035
        assert 0 <= s["coverage_measured"] <= 1 and 0 < s["median_width"] < 0.15 and s["wrong"] == 0
    # a gap 25 times the per-point scatter is decided by the new method
    assert summary["methods"]["noise_corrected"]["E +0.09"]["decided_big"] == 1.0


def test_an_unknown_truth_is_refused_in_one_line(capsys):
    assert gap_power.main(["--trials", "1", "--truths", "none,E +7"]) == 2
    err = capsys.readouterr().err
    assert err.strip().startswith("--truths: 'E +7' is not a truth; use one of none,")
    assert len(err.strip().splitlines()) == 1
