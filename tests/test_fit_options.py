"""The fit's options have one type and one builder: a spec's `fit:` section, `scalelab fit`'s
arguments and `sweep next`'s flags all become a FitOptions through fitting.entry.fit_options.fit_options,
checked once, each error naming the key as its input spelled it (no fit runs here: seconds)."""

import pytest
import yaml

from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.fitting.entry.fit_options import FitOptions, fit_options
from scalelab.store import SweepLayout
from scalelab.sweeps.specs.spec import expand_sweep

SPEC = {
    "name": "opts",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5.0}, "span": 3},
}


def _store(tmp_path, fit: dict):
    """A sweep directory that holds only its spec (no runs)."""
    path = tmp_path / "sweep"
    path.mkdir(parents=True)
    SweepLayout(path).spec.write_text(yaml.safe_dump({**SPEC, "fit": fit}))
    return path


def test_a_spec_section_a_command_and_the_loop_build_the_same_options():
    section = {"law": "auto", "candidates": ["chinchilla", "kaplan@flops"], "bootstrap": 16, "target_flops": 1e13}
    sweep = expand_sweep({**SPEC, "fit": section})
    assert isinstance(sweep.fit, FitOptions) and sweep.fit == fit_options(section)
    # a store's defaults under the section: the loop's rule (drawn starts of the whole grid, gates)
    assert sweep.fit.candidates == ("chinchilla", "kaplan@flops") and sweep.fit.require_optimum
    assert sweep.fit.gates and sweep.fit.draw_starts and sweep.fit.loss == "final_val_loss"
    # a command's options win; a law given is fitted as asked (the spec's forms drop)
    again = fit_options(section, bootstrap=4, seed=3, law="kaplan")
    assert (again.bootstrap, again.seed, again.law, again.candidates, again.require_optimum) == (
        4,
        3,
        "kaplan",
        None,
        False,
    )
    # a table's fit (no section): FitOptions' own defaults
    assert fit_options(None, law="kaplan") == FitOptions(law="kaplan")
    assert fit_options({}, target_flops=None).target_flops is None  # None given is "not given"


@pytest.mark.parametrize(
    "section, given, flags, key",
    [
        ({"bootstrap": -1}, {}, None, "fit.bootstrap: -1 is negative"),
        ({}, {"bootstrap": -1}, {"bootstrap": "--replicates"}, "--replicates: -1 is negative"),
        (None, {"bootstrap": -1}, {"bootstrap": "--bootstrap"}, "--bootstrap: -1 is negative"),
        ({"law": "lr_annealing"}, {}, None, "fit.law: 'lr_annealing' is not a law of (N, D)"),
        ({"evidence": "level"}, {}, None, "fit.evidence: set with fit.law 'chinchilla'"),
        (
            None,
            {"evidence": "level"},
            {"evidence": "--evidence", "law": "--law"},
            "--evidence: an option of --law auto",
        ),
        ({"law": "auto", "stack_point": "mean"}, {}, None, "fit.stack_point: 'mean' is not known"),
        ({"noise_floor": 0.7}, {}, None, "fit.noise_floor: 0.7 must be in [0, 0.5)"),
        ({"bootstrp": 8}, {}, None, "fit.bootstrp: unknown key; did you mean 'bootstrap'?"),
        ({"seed": 1}, {}, None, "fit.seed: unknown key"),  # a FitOptions field, not a spec key
        ({"target_flops": -1e12}, {}, None, "fit.target_flops: -1e+12 is not a FLOP count"),
    ],
)
def test_bad_values_are_named_as_their_input_spelled_them(section, given, flags, key):
    with pytest.raises(ConfigError) as e:
        fit_options(section, flags=flags, **given)
    assert str(e.value).startswith(key) and "\n" not in str(e.value), str(e.value)


def test_scalelab_fit_and_sweep_next_refuse_bad_options_before_anything_is_written(tmp_path, capsys):
    store = _store(tmp_path, {"law": "auto"})
    before = sorted(p.name for p in store.iterdir())
    assert main(["fit", str(store), "--bootstrap", "-2", "--out", str(tmp_path / "fit.json")]) == 2
    assert main(["sweep", "next", str(store), "--replicates", "-2", "--target-flops", "1e13"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("--bootstrap: -2 is negative; use 0 (delta-method intervals) or more"), err
    assert err[1].endswith("--replicates: -2 is negative; use 0 (delta-method intervals) or more"), err
    assert sorted(p.name for p in store.iterdir()) == before and not (tmp_path / "fit.json").exists()
    # the spec's law is auto: --evidence is its option (the store has no runs, which is the next error)
    assert main(["fit", str(store), "--evidence", "level"]) == 2
    err = capsys.readouterr().err
    assert "holds no runs" in err and "--evidence" not in err
    bad = _store(tmp_path / "b", {"law": "select"})
    assert main(["fit", str(bad)]) == 2
    assert "fit.law: 'select' is not a law of (N, D) the loop can fit" in capsys.readouterr().err
