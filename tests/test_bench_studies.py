"""experiments/studies.py (the choice-study experiment) on simulated runs: one study through the package's
closed loop to its matched decisive measurement, scored; and its registry matches the registration
in docs/studies.md. The real studies train for hours (the command is in docs/studies.md)."""

import inspect
import json
import re
from pathlib import Path

from experiments import studies

ROOT = Path(__file__).resolve().parent.parent


def test_one_simulated_study_runs_the_protocol_to_its_scored_decisive_measurement(tmp_path):
    studies.main(["--study", "arch", "--simulate", "--smoke", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    (row,) = summary["studies"]
    assert row["scored"] and row["n_pairs"] == 6 and summary["simulated"]
    assert set(row["views"]) == {"paired", "paired_frontier", "joint", "joint_frontier", "separate"}
    paired = row["views"]["paired"]
    assert paired["covered"] in (True, False) and paired["decision"] in ("right", "wrong", "none")
    goals = summary["goals"]
    for key in ("width_met", "coverage_met", "decision_met", "accuracy_met", "accuracy_at_largest_budget"):
        assert key in goals, key
    assert goals["accuracy_at_largest_budget"]["paired"]["total"] == 1
    assert "load_average" in summary and row["times"]["train_s"] > 0
    # the loop stopped after the decisive measurement: the ledger holds one study prediction
    book = json.loads((tmp_path / "study-arch" / "ledger.json").read_text())
    assert [e["arm"] for e in book["studies"]] == ["gelu"]


def test_every_study_of_the_experiment_is_registered_in_the_docs():
    text = (ROOT / "docs" / "studies.md").read_text()
    registry = re.search(r"^STUDIES: .*?^}", inspect.getsource(studies), re.S | re.M).group(0)
    for name in re.findall(r'^    "(\w+)": \{$', registry, re.M):
        assert f"| {name} |" in text, name  # a row of the registration table
