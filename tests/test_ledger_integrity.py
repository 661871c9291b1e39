"""The ledger cannot be written after the fact (issue 30, item 6).

A prediction is recorded before its round can be launched; one whose run already started, or that
the fit itself used, is flagged and never scored (an identical config re-proposed would otherwise
score a finished run at once); ledger updates are locked, so a scoring pass never drops a fit
recorded at the same time.
"""

from __future__ import annotations

import json
import threading

import pytest

from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.propose import propose_next

SPEC = {
    "name": "fake",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
    "fit": {"bootstrap": 8},
}


def _done(sweep, run_id: str, loss: float) -> None:
    d = store.run_path(sweep, run_id)
    d.mkdir(parents=True, exist_ok=True)
    (d / "status.json").write_text(json.dumps({"status": "done", "final_val_loss": loss}))


def _prediction(run_id: str, k: int = 1) -> dict:
    return dict(round=k, run_id=run_id, kind="compute_optimal", params=1000, tokens=20000, flops=1.2e8,
                predicted=2.0, interval=[1.9, 2.1])  # fmt: skip


def _fit(k: int, run_ids: list[str]) -> dict:
    return {"round": k, "law": "chinchilla", "params": {"E": 1.0}, "intervals": {"E": [0.9, 1.1]}, "run_ids": run_ids}


def test_a_prediction_for_a_run_that_already_ran_or_that_the_fit_used_is_flagged_not_scored(tmp_path):
    sweep = tmp_path / "s"
    (sweep / "runs").mkdir(parents=True)
    _done(sweep, "finished0001", 2.05)  # an identical config proposed again: the run exists already
    _done(sweep, "fitted000001", 1.95)  # a run the fit used
    ledger.record_round(sweep, _fit(1, ["fitted000001"]), [_prediction("finished0001"), _prediction("fitted000001")])
    ledger.score(sweep)
    predictions = ledger.read_ledger(sweep)["predictions"]
    assert [p["measured"] for p in predictions] == [None, None]
    assert [p.get("flag") for p in predictions] == ["run already started", "run used by the fit"]
    assert ledger.coverage(predictions)["n_scored"] == 0


def test_a_prediction_for_a_run_done_in_a_sibling_sweep_is_flagged_not_scored(tmp_path):
    """Issue 51: a run finished in another sweep of the store root, not linked here yet (the launch
    links it), is no prediction: flagged, never scored as covered."""
    root = tmp_path / "root"
    for name in ("a", "b"):
        (root / name / "runs").mkdir(parents=True)
        (root / name / "sweep.yaml").write_text(f"name: {name}\n")
    _done(root / "a", "finished0001", 2.0)
    ledger.record_round(root / "b", _fit(1, []), [_prediction("finished0001")])
    _done(root / "b", "finished0001", 2.0)  # the launch linked it; its loss is now readable here
    ledger.score(root / "b")
    (p,) = ledger.read_ledger(root / "b")["predictions"]
    assert p.get("flag") == "run already started" and p["measured"] is None and p["covered"] is None


def test_sweep_ledger_reads_without_writing(tmp_path, monkeypatch, capsys):
    """Issue 51: `sweep ledger` rewrote ledger.json (and made its lock) to print it: on a read-only
    store a traceback. It scores in memory and writes nothing."""
    from scalelab.cli.main import main

    sweep = tmp_path / "s"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "sweep.yaml").write_text("name: s\n")
    ledger.record_round(sweep, _fit(1, []), [_prediction("pending00001")])
    _done(sweep, "pending00001", 2.0)
    before = {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file()}

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system", str(a[0]))

    monkeypatch.setattr(ledger, "atomic_write_json", read_only)
    monkeypatch.setattr(ledger.os, "open", read_only)
    assert main(["sweep", "ledger", str(sweep), "--json"]) == 0
    (p,) = json.loads(capsys.readouterr().out)["predictions"]
    assert p["measured"] == 2.0 and p["covered"] is True
    assert {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file()} == before


def test_a_scoring_pass_never_drops_a_fit_recorded_meanwhile(tmp_path, monkeypatch):
    sweep = tmp_path / "s"
    (sweep / "runs").mkdir(parents=True)
    ledger.record_round(sweep, _fit(1, []), [_prediction("pending00001")])
    _done(sweep, "pending00001", 2.02)
    reading, go_on = threading.Event(), threading.Event()
    real = ledger.read_status

    def slow_read_status(run_dir):
        reading.set()
        go_on.wait(10)  # the scoring pass is between its read and its write of the ledger
        return real(run_dir)

    monkeypatch.setattr(ledger, "read_status", slow_read_status)
    scorer = threading.Thread(target=ledger.score, args=(sweep,))
    scorer.start()
    assert reading.wait(10)
    monkeypatch.setattr(ledger, "read_status", real)  # the second writer reads normally
    recorder = threading.Thread(target=ledger.record_round, args=(sweep, _fit(2, []), []))
    recorder.start()
    recorder.join(1.0)  # with a lock it waits for the scorer; without one it is done by now
    go_on.set()
    scorer.join()
    recorder.join()
    book = ledger.read_ledger(sweep)
    assert [f["round"] for f in book["fits"]] == [1, 2]
    assert book["predictions"][0]["measured"] == pytest.approx(2.02)


def test_the_round_spec_is_written_only_after_its_predictions_are_recorded(tmp_path, monkeypatch):
    sd = tmp_path / "fake"
    launch_synthetic(SPEC, sd, SyntheticLaw(), noise_std=0.003)

    def ledger_fails(*a, **k):
        raise OSError("disk full while recording the predictions")

    monkeypatch.setattr(ledger, "record_round", ledger_fails)
    with pytest.raises(OSError, match="disk full"):
        propose_next(sd, target_flops=1e13, replicates=8, log=lambda _: None)
    assert not (sd / "rounds" / "round_1.yaml").exists()  # nothing launchable without its predictions
