"""The `seeds:` section (scalelab.sweeps.specs.seeds): replicates by init, by data order or both, and a seed
of its own for every design point; the plain forms keep the runs (and ids) they always had."""

import pytest

from scalelab.errors import ConfigError
from scalelab.sweeps.specs.spec import expand_sweep

BASE = {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512, "seed": 5}}
ISO = {"budgets": [3e11, 1e12], "num_sizes": 3, "center": {"tokens_per_param": 5}, "span": 3}


def _runs(seeds):
    return expand_sweep({"base": BASE, "isoflop": ISO, "seeds": seeds}).runs


def _seeds(run) -> tuple[int, int | None]:
    return run.config["train"]["seed"], run.config["train"]["data_seed"]


def test_plain_forms_keep_their_runs():
    plain = [r.run_id for r in expand_sweep({"base": BASE, "isoflop": ISO}).runs]
    assert [r.run_id for r in _runs(3)] == [r.run_id for r in _runs([5, 6, 7])]
    assert [r.run_id for r in _runs(3)][::3] == plain  # replicate 0 of each point is the plain run
    assert [r.run_id for r in _runs({"count": 3})] == [r.run_id for r in _runs(3)]


@pytest.mark.parametrize(("vary", "want"), [("data", [(5, 5), (5, 6)]), ("init", [(5, 5), (6, 5)])])
def test_a_replicate_moves_one_source_of_noise(vary, want):
    plain = [r.run_id for r in expand_sweep({"base": BASE, "isoflop": ISO}).runs]
    runs = _runs({"count": 2, "vary": vary})
    assert [_seeds(r) for r in runs[:2]] == want
    assert [r.run_id for r in runs][::2] == plain  # seeds equal to the base's: the same run
    assert len({r.run_id for r in runs}) == len(runs)


def test_distinct_gives_every_point_its_own_seeds():
    runs = _runs({"count": 2, "distinct": True})
    assert len(runs) == 12 and len({_seeds(r) for r in runs}) == 12
    assert [_seeds(r)[0] for r in runs[:4]] == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("section", "key"),
    [({"count": 2, "vary": "order"}, "seeds.vary"), ({"count": 1.5}, "seeds.count"), ({"cnt": 2}, "seeds.cnt")],
)
def test_bad_seed_sections_name_the_key(section, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _runs(section)
