"""Smoke tests of the registered first-round experiment's scripts (docs/first-round.md), without
training: experiments/recipe_audit.py's grid and its report on a synthetic audit store, and
experiments/first_round_store.py -> experiments/first_round_scores.py on a store whose runs are finished from a
known law (scalelab.analysis.synthetic) where the scripts would train them on Ray."""

import json
import math
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from experiments import first_round_audit_rebuild, first_round_scores, first_round_store, recipe_audit
from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.errors import UsageError
from scalelab.store.atomic import atomic_write_json
from scalelab.sweeps.recipes.recipe import timescale_of
from scalelab.sweeps.recipes.recipe_audit import audited_recipe, load_audit
from scalelab.sweeps.recipes.recipe_gate import check_sweep
from scalelab.sweeps.specs.spec import expand_sweep


def _loss(config: dict, n: int, d: int) -> float:
    """A truth whose best LR is the demo recipe's times (D / 1e6)^-0.2, best timescale 0.5 of the run."""
    o = config["optim"]
    best = 5e-3 * (n / 5e4) ** -0.3 * (d / 1e6) ** -0.2
    steps = d // config["train"]["global_batch_tokens"]
    out = math.log(1.2 + 40 * n**-0.3 + 80 * d**-0.3) + 0.1 * math.log(o["lr"] / best) ** 2
    return math.exp(out + 0.02 * math.log(timescale_of(o["weight_decay"], o["lr"], steps) / 0.5) ** 2)


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory):
    """experiments/recipe_audit.py's smoke grid, finished from the truth above, then its report."""
    audit = recipe_audit
    out = tmp_path_factory.mktemp("audit") / "audit"
    spec = audit.audit_spec(smoke=True)
    sweep = expand_sweep(spec)
    store.init_sweep(out, yaml.safe_dump(spec), "recipe_audit", [r.to_dict() for r in sweep.runs], sweep.name)
    for run in sweep.runs:
        run_dir = store.run_path(out, run.run_id)
        atomic_write_json(run_dir / "config.json", run.config)
        loss = _loss(run.config, run.params, run.num_tokens)
        status = dict(
            status="done", run_id=run.run_id, params=run.params, num_tokens=run.num_tokens, final_val_loss=loss
        )
        atomic_write_json(run_dir / "status.json", status)
    audit.main(["--out", str(out), "--smoke", "--report-only", "--replicates", "20"])
    return out


def test_the_audit_grid_and_its_report(audit_dir, capsys):
    capsys.readouterr()
    recipe_audit.main(["--dry-run"])
    assert "recipe audit: 106 runs {'lr': 78, 'weight_decay': 15, 'beta2': 4, 'shape': 9}" in capsys.readouterr().out
    for name in ("audit.json", "audit.txt", "recipe.yaml"):
        assert (audit_dir / name).is_file()
    text = (audit_dir / "audit.txt").read_text()
    assert "fitted LR(N, D)" in text and "the demo's design" in text
    recipe = yaml.safe_load((audit_dir / "recipe.yaml").read_text())["recipe"]
    # the truth's -0.2, moved by its decay term: a fixed wd makes a higher LR a shorter timescale
    assert recipe["lr"]["tokens_exponent"] == pytest.approx(-0.2, abs=0.1)


def test_one_store_then_its_scores(audit_dir, tmp_path, monkeypatch, capsys):
    law = SyntheticLaw()
    spec, sweep = first_round_store.first_round_spec(audit_dir, seed=1000, num_sizes=6, span=2.0, seeds_per_point=1)
    assert len(sweep.runs) == 18 and len({r.config["train"]["seed"] for r in sweep.runs}) == 18
    assert check_sweep(sweep).ok  # the audited recipe passes its own gate

    def fake_rounds(sweep, sweep_dir, *, spec_text, **_):  # the first round "trains": finished from the law
        launch_synthetic(yaml.safe_load(spec_text), sweep_dir, law, noise_std=0.004)
        return SimpleNamespace(stopped="", ok=True)

    def fake_launch(sweep, sweep_dir, *, spec_text, **_):
        launch_synthetic(yaml.safe_load(spec_text), sweep_dir, law, noise_std=0.004)

    capsys.readouterr()
    first_round_store.main(["--out", str(tmp_path / "plan"), "--seed", "1", "--audit", str(audit_dir), "--plan"])
    plan = capsys.readouterr().out
    assert "most per FLOP" in plan and "of the span (inside)" in plan and not (tmp_path / "plan").exists()
    monkeypatch.setattr(first_round_store, "run_rounds", fake_rounds)
    monkeypatch.setattr(first_round_store, "launch", fake_launch)
    args = ["--out", str(tmp_path / "s1000"), "--seed", "1000", "--audit", str(audit_dir), "--holdout-sizes", "2"]
    first_round_store.main(args)
    first_round_store.main(args)  # resumed: the holdout round is launched as proposed, never proposed again
    loop = tmp_path / "s1000" / "loop"
    assert sorted(p.name for p in (loop / "rounds").glob("round_*.yaml")) == ["round_1.yaml"]
    capsys.readouterr()
    first_round_scores.main([str(loop), "--json", str(tmp_path / "scores.json")])
    out = capsys.readouterr().out
    s = first_round_scores.store_scores(loop)
    assert [s["distances"][m]["scored"] for m in (3, 10, 30)] == [2, 2, 2]
    assert all(np.isfinite(s["distances"][m]["error"]) for m in (3, 10, 30))
    assert "old recipe +7.70%, sd 4.11% over 7 stores" in out and "replication" in out
    # protocol 2: the ledger predicted by the bracket; its ends, widened by the stated run noise
    far = [p for p in store.ledger.read_ledger(loop)["predictions"] if p.get("kind") == "holdout"]
    assert all(p["predicted"] == pytest.approx((p["ends"][0] * p["ends"][1]) ** 0.5, rel=1e-12) for p in far)
    ends = s["distances"][30]["ends"]
    assert ends["noise"] == pytest.approx(0.0056) and ends["scored"] == 2
    at30 = [p for p in far if p["flops"] > 20 * 2e12]
    lo, hi = first_round_scores.ends_interval(at30[0]["ends"], 0.0056)
    assert lo == pytest.approx(at30[0]["ends"][0] * math.exp(-1.96 * 0.0056), rel=1e-4) and hi > at30[0]["ends"][1]
    assert ends["covered"] == sum(
        first_round_scores.ends_interval(p["ends"], 0.0056)[0]
        <= p["measured"]
        <= first_round_scores.ends_interval(p["ends"], 0.0056)[1]
        for p in at30
    )
    assert "protocol 2 (the bracket as the loop's prediction)" in out and "30x over 1 store(s):" in out
    # recorded (protocol 2): the ledger's bracket and its ends, without score_store.py, once
    record = tmp_path / "runs.csv"
    record.write_text(first_round_scores.RECORDED.read_text())
    args = [str(loop), "--record", "--as", "s9", "--recorded", str(record)]
    first_round_scores.main(args)
    with pytest.raises(UsageError, match="already records"):
        first_round_scores.main(args)
    mine = [r for r in first_round_scores.recorded_scores(record) if r["store"] == "s9"][0]
    assert mine["protocol"] == 2
    for m in (3, 10, 30):  # the default as the ledger scores it, to the record's 0.01%
        assert mine["distances"][m]["error"] == pytest.approx(s["distances"][m]["error"], abs=0.01)
        assert mine["bracket"][m]["error"] == pytest.approx(s["distances"][m]["error"], abs=0.01)
        assert mine["distances"][m]["ends"]["covered"] == s["distances"][m]["ends"]["covered"]
    capsys.readouterr()
    first_round_scores.main(["--recorded", str(record)])
    out = capsys.readouterr().out
    assert "10x: protocol 2, the bracket" in out and "10x: audited recipe" in out  # summarised apart
    # a store whose ledger predicted before protocol 2: the bracket from score_store.py's rows
    book = store.SweepLayout(loop).ledger
    data = json.loads(pathlib.Path(book).read_text())
    for p in data["predictions"]:
        p.pop("ends", None)
    pathlib.Path(book).write_text(json.dumps(data))
    ids = [p["run_id"] for p in data["predictions"] if p.get("kind") == "holdout"]
    with pytest.raises(UsageError, match="give score_store.py --json"):
        first_round_scores.main([str(loop), "--record", "--as", "s8", "--recorded", str(record)])
    rows = [{"run_id": i, "bracket": [1.3, 1.2, 1.4], "bracket_error": -0.01 * k} for k, i in enumerate(ids)]
    (tmp_path / "s.json").write_text(json.dumps(rows))
    first_round_scores.main([str(loop), "--record", str(tmp_path / "s.json"), "--as", "s8", "--recorded", str(record)])
    old = [r for r in first_round_scores.recorded_scores(record) if r["store"] == "s8"][0]
    assert old["protocol"] == 1 and old["bracket"][3]["error"] == pytest.approx(-0.5)  # rows 0 and 1: -0%, -1%


def test_recorded_stores_give_the_documented_summary(capsys):
    """The recorded stores (docs/first-round.md's per-run rows) give the three-store figures the
    docs reported before s1300 (+3.64% / +6.34% at 10x / 30x; the bracket's 30x +0.69% over
    s1100-s1200)."""
    first_round_scores.main(["--recorded", str(first_round_scores.RECORDED), "--json", "/dev/null"])
    rows = first_round_scores.recorded_scores()
    old = [s for s in rows if s["store"] in ("s1000", "s1100", "s1200")]
    assert first_round_scores._summary([s["distances"][10]["error"] for s in old]) == pytest.approx(
        (3.64, 3.93), abs=0.006
    )
    assert first_round_scores._summary([s["distances"][30]["error"] for s in old]) == pytest.approx(
        (6.34, 6.26), abs=0.006
    )
    assert first_round_scores._summary([s["bracket"][30]["error"] for s in old[1:]])[0] == pytest.approx(
        0.69, abs=0.006
    )
    assert "(rule: |mean| <= 2.0% over s1100-s1400)" in capsys.readouterr().out


def test_audit_rebuild_gives_the_given_recipe_and_frontier_and_keeps_the_draws_spread(audit_dir, tmp_path):
    """experiments/first_round_audit_rebuild.py: the rebuilt audit's recipe is the given one to the
    digit, its frontier the given one, and its LR-law draws keep the re-run's spread about the new law."""
    lr = {"ref_params": 40310.0, "ref_lr": 0.006694, "exponent": -0.515, "ref_num_tokens": 1008000.0,
          "tokens_exponent": 0.138}  # fmt: skip
    out = tmp_path / "rebuilt"
    frontier = "E=1.29,A=58.7,B=1040,alpha=0.532,beta=0.62"
    first_round_audit_rebuild.main(["--rerun", str(audit_dir), "--out", str(out), "--lr", json.dumps(lr),
                                    "--timescale", "1.0", "--frontier", frontier])  # fmt: skip
    recipe = audited_recipe(load_audit(out))
    assert recipe["lr"] == lr and recipe["weight_decay"] == {"timescale": 1.0}
    assert load_audit(out).frontier["params"] == {"E": 1.29, "A": 58.7, "B": 1040.0, "alpha": 0.532, "beta": 0.62}
    before, after = (json.loads((d / "audit.json").read_text())["lr_law"] for d in (audit_dir, out))
    for i in (1, 2):  # the exponents' draws: moved with the law, same spread
        b, a = (np.array([k[i] for k in law["draws"]]) for law in (before, after))
        assert np.std(a) == pytest.approx(np.std(b)) and np.mean(a - b) == pytest.approx(
            after["coef"][i] - before["coef"][i]
        )
    with pytest.raises(UsageError, match="--frontier"):
        first_round_audit_rebuild.main(["--rerun", str(audit_dir), "--out", str(out), "--frontier", "E=1"])
