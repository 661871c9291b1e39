"""A saved fit has one loader (scalelab.fitting.entry.saved_fit): both on-disk forms (a `scalelab fit --out`
FIT.json and a sweep's fits/round_K.json) give the same typed fit and the same predictions; anything
else is refused with one line naming the file and the key (exit code 2)."""

import json
from pathlib import Path

import pytest

from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.fitting.entry.from_report import allocate_from_fit, predict_from_fit
from scalelab.fitting.entry.saved_fit import load_saved_fit

REPORT = Path(__file__).parent / "assets" / "plan_fit.json"  # a FIT.json as `scalelab fit --out` saved it


def _round_file(report: dict, k: int = 3) -> dict:
    """The same fit as a round file keeps it: the record under "fit", the round's fields beside it."""
    names = list(report["samples"])
    draws = [dict(zip(names, vals)) for vals in zip(*(report["samples"][n] for n in names))]
    record = {
        "law": report["law"],
        "params": report["params"],
        "intervals": report["intervals"],
        "residual_scale": report["residual_scale"],
        "level": report["level"],
        "draws": draws,
        "run_ids": report["run_ids"],
        "points": {"params": [1e6], "tokens": [2e7], "loss": [3.0], "budgets": [1.2e14]},
        "backtest": report["backtest"],
        "warnings": [],
    }
    return {"round": k, "law": report["law"], "params": report["params"], "proposals": [], "fit": record}


def test_both_forms_load_to_the_same_fit_and_predict_the_same(tmp_path):
    report = json.loads(REPORT.read_text())
    rnd = tmp_path / "round_3.json"
    rnd.write_text(json.dumps(_round_file(report)))
    a, b = load_saved_fit(REPORT), load_saved_fit(rnd)
    assert (a.form, b.form) == ("report", "round") and b.round["round"] == 3 and a.round is None
    for key in ("law", "approach", "params", "level", "residual_scale", "draws"):
        assert getattr(a, key) == getattr(b, key), key
    assert len(a.draws) == len(report["samples"]["E"]) > 10
    assert load_saved_fit(a) is a and load_saved_fit(report, name="mem").params == a.params
    at = {"params": [1e9, 3e9], "tokens": [2e10, 6e10]}
    assert predict_from_fit(a, **at) == predict_from_fit(b, **at) == predict_from_fit(report, **at)
    assert allocate_from_fit(a, flops=1e21) == allocate_from_fit(b, flops=1e21)


def test_a_failed_replicate_saved_as_nulls_is_left_out_of_the_draws():
    """JSON has no NaN: a bootstrap replicate whose fit failed is saved with nulls, and predicts nothing."""
    report = json.loads(REPORT.read_text())
    report["samples"] = {k: [None, *v] for k, v in report["samples"].items()}  # one failed replicate first
    fit = load_saved_fit(report, name="mem")
    assert fit.draws == load_saved_fit(REPORT).draws
    at = {"params": [1e9], "tokens": [2e10]}
    assert predict_from_fit(fit, **at) == predict_from_fit(REPORT, **at)


BAD = [
    ("{not json", "is not JSON"),
    ("[1, 2]", "a JSON object with law and params"),
    ('{"params": {"E": 1.0}}', "'law'"),
    ('{"law": "chinchilla", "approach": 3}', "'params'"),
    ('{"law": "chinchilla", "params": {"E": "x"}}', "'params.E'"),
    ('{"law": "chinchilla", "approach": 4, "params": {"E": 1.0}}', "'approach'"),
    ('{"law": "chinchilla", "params": {"E": 1.0}, "level": 95}', "'level'"),
    ('{"law": "chinchilla", "params": {"E": 1.0}, "samples": {"E": [1.0], "A": []}}', "'samples'"),
    ('{"fit": [1], "proposals": []}', "'fit'"),
    ('{"fit": {"law": "chinchilla"}, "proposals": []}', "'fit.params'"),
    ('{"law": "chinchilla", "params": {"E": 1.0}, "frontier": 3}', "'frontier'"),
    ('{"study": true, "fit": {"arms": {}}, "proposals": []}', "a study's round"),
]


@pytest.mark.parametrize("text,key", BAD)
def test_a_bad_saved_fit_is_one_line_naming_the_file_and_the_key(tmp_path, text, key):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        load_saved_fit(path)
    msg = str(e.value)
    assert str(path) in msg and key in msg and "\n" not in msg, msg


def test_the_commands_refuse_a_bad_saved_fit_with_exit_2_and_one_line(tmp_path, capsys):
    path = tmp_path / "fit.json"
    path.write_text('{"law": "chinchilla", "approach": 3, "params": {"E": null}}')
    assert main(["predict", str(path), "--params", "1e9", "--tokens", "2e10"]) == 2
    assert main(["allocate", str(path), "--flops", "1e21"]) == 2
    assert main(["plan-run", str(path), "--flops", "1e21"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(str(path) in line and "'params.E'" in line for line in err), err
