"""The closed loop as one call (scalelab.sweeps.closed_loop.rounds.run_rounds) on synthetic stores: rounds launched
exactly as proposed (each run resolved once, by the proposer), stopping at the first passing fit,
taken up again when run twice; typed proposals whose JSON is the round file's."""

import json

import pytest
import yaml

from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, simulate_runs
from scalelab.errors import UsageError
from scalelab.sweeps.closed_loop import rounds
from scalelab.sweeps.closed_loop.proposal import read_round
from scalelab.sweeps.closed_loop.rounds import run_rounds
from scalelab.sweeps.specs.spec import expand_sweep, load_sweep

LAW = SyntheticLaw()
SPEC = {
    "name": "loop",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    # centred ~3x above N*: the best runs sit at the low edge, so the first fit fails `bracketed`
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 0.5}, "span": 3},
    "fit": {"bootstrap": 4},
}


@pytest.fixture
def launched(monkeypatch):
    """run_rounds' launches, with the training replaced by the synthetic law (what each was given)."""
    calls = []

    def launch(sweep, sweep_dir, *, spec_text, spec_name, **_):
        entries = [r.to_dict() for r in sweep.runs]
        store.init_sweep(sweep_dir, spec_text, spec_name, entries, sweep.name)
        todo = [r for r in sweep.runs if store.run_state(store.run_path(sweep_dir, r.run_id)) != "done"]
        simulate_runs(sweep_dir, todo, LAW, noise_std=0.003)
        calls.append((spec_name, entries))
        return {"states": {r.run_id: store.run_state(store.run_path(sweep_dir, r.run_id)) for r in sweep.runs}}

    monkeypatch.setattr(rounds, "launch", launch)
    return calls


def _loop(sd, events, **kw):
    return run_rounds(
        expand_sweep(SPEC),
        sd,
        spec_text=yaml.safe_dump(SPEC, sort_keys=False),
        spec_name="loop",
        rounds=4,
        target_flops=1e13,
        budget_flops=9e12,
        until_passed=True,
        reopen=True,
        log=lambda _: None,
        before_fit=lambda i: events.append(("fit", i)),
        before_launch=lambda i, p: events.append(("launch", i, p.passed)),
        **kw,
    )


def test_rounds_are_launched_as_proposed_until_a_fit_passes(tmp_path, launched):
    sd, events = tmp_path / "loop", []
    result = _loop(sd, events)
    passed = [p.passed for p in result.proposals]
    assert passed[0] is False and passed[-1] is True and passed.count(True) == 1 and len(passed) <= 3
    assert events == [e for i in range(1, len(passed) + 1) for e in (("fit", i), ("launch", i, passed[i - 1]))]
    assert result.ok and not result.stopped
    assert [name for name, _ in launched] == ["loop"] + [f"round_{p.round}" for p in result.proposals]
    for (_, entries), p in zip(launched[1:], result.proposals):
        # what was launched is what the round's spec expands to, every entry (labels, predictions) alike
        assert json.loads(json.dumps(entries)) == [
            json.loads(json.dumps(r.to_dict())) for r in load_sweep(p.spec_path).runs
        ]
        saved = json.loads(p.fit_path.read_text())
        assert saved == json.loads(json.dumps(p.to_dict()))
        assert [q["run_id"] for q in saved["proposals"]] == [r.run_id for r in p.runs]
        back = read_round(sd, p.round)
        assert json.loads(json.dumps(back.to_dict())) == saved and back.gates.passed == p.passed
    # the loop run again takes up its passing round instead of proposing another
    again = _loop(sd, [])
    assert [p.round for p in again.proposals] == [result.proposals[-1].round]
    assert len(list((sd / "rounds").glob("round_*.yaml"))) == len(result.proposals)


def test_rounds_need_a_target_before_anything_runs(tmp_path, launched):
    with pytest.raises(UsageError, match="--target-flops"):
        run_rounds(expand_sweep({**SPEC, "fit": {}}), tmp_path / "x", spec_text="", rounds=2)
    assert launched == [] and not (tmp_path / "x").exists()


def test_a_protocol_sets_each_rounds_budget_continues_a_store_and_may_leave_a_round_unlaunched(
    tmp_path, launched, monkeypatch
):
    """next_round gives each round's budget and step (None stops); launch_design=False continues a
    store without launching its design again; a before_launch hook returning False launches nothing."""
    sd, text, quiet = tmp_path / "loop", yaml.safe_dump(SPEC, sort_keys=False), lambda _: None
    proposed = []
    propose = rounds.propose_round
    monkeypatch.setattr(rounds, "propose_round", lambda out, **kw: proposed.append(kw) or propose(out, **kw))
    run_rounds(expand_sweep(SPEC), sd, spec_text=text, spec_name="loop", rounds=1, log=quiet)
    asked = []

    def next_round(i, last):
        asked.append((i, None if last is None else last.round))
        return {"budget_flops": 6e12, "step": 2.0} if i == 1 else ({"step": 5.0} if i == 2 else None)

    result = run_rounds(expand_sweep(SPEC), sd, spec_text=text, spec_name="loop", rounds=5, target_flops=1e13,
                        budget_flops=9e12, launch_design=False, next_round=next_round, log=quiet)  # fmt: skip
    assert asked == [(1, None), (2, 1), (3, 2)]  # stopped at the third ask
    assert [(kw["budget_flops"], kw["step"]) for kw in proposed] == [(6e12, 2.0), (9e12, 5.0)]
    assert [name for name, _ in launched] == ["loop", "round_1", "round_2"]  # the design launched once
    assert [p.round for p in result.proposals] == [1, 2] and result.ok
    unlaunched = run_rounds(expand_sweep(SPEC), sd, spec_text=text, spec_name="loop", rounds=3, target_flops=1e13,
                            launch_design=False, before_launch=lambda i, p: False, log=quiet)  # fmt: skip
    assert unlaunched.proposals == [] and len(launched) == 3 and len(proposed) == 3  # proposed, not launched
