"""The store's behaviour, run alike against a local directory and a local S3 server, so the two cannot drift.

Every test here takes `root`, a store root that is a temporary directory or a fresh `s3://` prefix on
moto's S3 server (tests/s3_local.py), and runs the same assertions on both: whole records and
read-modify-writes that lose no update (scalelab.store.atomic), the ledger (flags, scoring, two
writers at once), run locks and leases, claims and links between sibling sweeps, resume, and the
closed loop's rounds. One test trains for real on Ray (one private cluster for the module,
module_ray): a WSD cooldown sweep (a branch started from its stable run's checkpoint) with a sibling
sweep that shares its runs, on a local root and then on an S3 prefix, whose records must be the same.
"""

from __future__ import annotations

import json
import math
import threading
import uuid

import pytest
import ray
import yaml

from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic, simulate_runs
from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.store import files, ledger, objects
from scalelab.store.atomic import atomic_write_json, read_versioned, replace_if, update_json
from scalelab.store.run_lock import run_lock
from scalelab.sweeps.closed_loop import propose, rounds
from scalelab.sweeps.closed_loop.proposal import read_round
from scalelab.sweeps.closed_loop.rounds import run_rounds
from scalelab.sweeps.execution.execute import launch, resume
from scalelab.sweeps.execution.ray_cluster import local_ray_on_loopback
from scalelab.sweeps.specs.spec import expand_sweep

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
from s3_local import serve  # noqa: E402

BUCKET = "scalelab-backends"
BACKENDS = ("local", "s3")


@pytest.fixture(scope="module")
def s3():
    with serve(BUCKET) as env:
        yield env


@pytest.fixture(params=BACKENDS)
def root(request, tmp_path):
    """A store root: a local directory, or a new prefix of the S3 server's bucket."""
    if request.param == "local":
        yield tmp_path / "root"
    else:
        request.getfixturevalue("s3")
        yield f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"


def sweep_of(root, name: str):
    return files.join(root, name)


# ---------------------------------------------------------------------------------------------
# Records: whole, and updated without losing another writer's change
# ---------------------------------------------------------------------------------------------


def test_records_are_whole_and_concurrent_updates_are_all_kept(root):
    path = files.join(root, "x", "state.json")
    atomic_write_json(path, {"n": 0})
    assert json.loads(files.read_bytes(path)) == {"n": 0}
    data, seen = read_versioned(path)
    assert replace_if(path, b'{"n": 1}', seen)  # the version read: written
    assert not replace_if(path, b'{"n": 2}', seen)  # stale version: refused, nothing written
    assert not replace_if(path, b'{"n": 3}', None)  # "must not exist yet": refused
    assert json.loads(files.read_bytes(path)) == {"n": 1}
    new = files.join(root, "x", "new.json")
    assert replace_if(new, b"{}", None) and not replace_if(new, b"[]", None)

    def bump(obj):
        obj["n"] += 1
        return obj["n"], True

    workers = [threading.Thread(target=lambda: [update_json(path, bump, default=dict) for _ in range(8)])]
    workers.append(threading.Thread(target=lambda: [update_json(path, bump, default=dict) for _ in range(8)]))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert json.loads(files.read_bytes(path)) == {"n": 17}  # 1 + 16 increments: none lost


# ---------------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------------


def _prediction(run_id: str, k: int = 1) -> dict:
    return dict(round=k, run_id=run_id, kind="compute_optimal", params=1000, tokens=20000, flops=1.2e8,
                predicted=2.0, interval=[1.9, 2.1])  # fmt: skip


def _fit(k: int, run_ids: list[str]) -> dict:
    return {"round": k, "law": "chinchilla", "params": {"E": 1.0}, "intervals": {"E": [0.9, 1.1]}, "run_ids": run_ids}


def _done(sweep, run_id: str, loss: float) -> None:
    store.write_status(store.run_path(sweep, run_id), "done", final_val_loss=loss)


def test_ledger_flags_scores_and_keeps_every_concurrent_fit(root):
    sweep = sweep_of(root, "s")
    _done(sweep, "finished0001", 2.05)  # an identical config proposed again: the run exists already
    _done(sweep, "fitted000001", 1.95)  # a run the fit used
    ledger.record_round(
        sweep, _fit(1, ["fitted000001"]), [_prediction(i) for i in ("finished0001", "fitted000001", "pending00001")]
    )
    _done(sweep, "pending00001", 2.02)
    scored = ledger.score(sweep)
    assert [p["run_id"] for p in scored] == ["pending00001"]
    book = ledger.read_ledger(sweep)
    assert [p.get("flag") for p in book["predictions"]] == ["run already started", "run used by the fit", None]
    assert [p["measured"] for p in book["predictions"]] == [None, None, pytest.approx(2.02)]

    def record(k):
        ledger.record_round(sweep, _fit(k, []), [_prediction(f"later{k:07d}", k)])

    writers = [threading.Thread(target=record, args=(k,)) for k in range(2, 6)]
    writers += [threading.Thread(target=ledger.score, args=(sweep,)) for _ in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    book = ledger.read_ledger(sweep)
    assert sorted(f["round"] for f in book["fits"]) == [1, 2, 3, 4, 5]  # no writer lost another's fit
    assert len(book["predictions"]) == 7 and book["predictions"][2]["measured"] == pytest.approx(2.02)


# ---------------------------------------------------------------------------------------------
# Run locks and leases, claims and links, resume
# ---------------------------------------------------------------------------------------------


def test_one_trainer_per_run_and_sibling_sweeps_link_a_run_instead_of_copying_it(root):
    a, b = sweep_of(root, "a"), sweep_of(root, "b")
    for sweep in (a, b):
        store.init_sweep(sweep, "name: s\n", "s", [{"run_id": "shared000001"}], "s")
    holding, release = threading.Event(), threading.Event()

    def trainer():
        with run_lock(a, "shared000001") as run_dir:
            holding.set()
            release.wait(30)
            store.write_status(run_dir, "done", final_val_loss=2.5)

    t = threading.Thread(target=trainer)
    t.start()
    assert holding.wait(30)
    with pytest.raises(RuntimeError, match="lock|leased"):  # a second trainer of the same run waits, then gives up
        with run_lock(a, "shared000001", wait_s=1.0):
            pass
    release.set()
    t.join()
    # the sibling sweep finds the run where the first trained it: linked, not a copy of its own
    assert store.attach_runs(b, ["shared000001"], current_id=None) == {"shared000001": "done"}
    assert store.read_status(store.run_location(b, "shared000001"))["final_val_loss"] == 2.5
    if objects.is_url(b):
        assert objects.list_objects(store.run_path(b, "shared000001")) == {}
        assert json.loads(objects.read_bytes(f"{b}/links/shared000001.json")) == {"sweep": "a"}
    else:
        assert store.run_path(b, "shared000001").is_symlink()
    # resuming the sibling: its trainer takes the run's one lock and finds it finished
    with run_lock(b, "shared000001") as run_dir:
        assert store.run_state(run_dir) == "done"
    runs = store.load_runs(root)
    assert runs["run_id"].to_list() == ["shared000001"]  # the store root lists the shared run once


# ---------------------------------------------------------------------------------------------
# The closed loop's rounds
# ---------------------------------------------------------------------------------------------

LAW = SyntheticLaw()
LOOP = {
    "name": "loop",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 0.5}, "span": 3},
    "fit": {"bootstrap": 4},
}


def _synthetic_launch(sweep, sweep_dir, *, spec_text, spec_name, **_):
    """run_rounds' launch with the training replaced by the synthetic law (the store calls are real)."""
    store.init_sweep(sweep_dir, spec_text, spec_name, [r.to_dict() for r in sweep.runs], sweep.name)
    simulate_runs(sweep_dir, [r for r in sweep.runs if store.run_state(store.run_path(sweep_dir, r.run_id)) != "done"],
                  LAW, noise_std=0.003)  # fmt: skip
    ledger.score(sweep_dir)  # as execute.launch does at its end
    return {"states": {r.run_id: store.run_state(store.run_path(sweep_dir, r.run_id)) for r in sweep.runs}}


def _strip_times(book: dict) -> dict:
    book = json.loads(json.dumps(book))
    for f in book["fits"]:
        f.pop("recorded_at")
    return book


def test_rounds_write_the_same_ledger_fits_and_runs_on_both_stores(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(rounds, "launch", _synthetic_launch)
    books, resolved, fits = {}, {}, {}
    for backend in BACKENDS:
        sd = tmp_path / "loop" if backend == "local" else f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/loop"
        result = run_rounds(
            expand_sweep(LOOP), sd, spec_text=yaml.safe_dump(LOOP, sort_keys=False), spec_name="loop", rounds=2,
            target_flops=1e13, budget_flops=9e12, log=lambda _: None,
        )  # fmt: skip
        assert result.ok and len(result.proposals) == 1
        p = result.proposals[0]
        assert files.exists(p.spec_path) and files.exists(p.fit_path)
        assert str(p.spec_path) == str(files.join(sd, "rounds", "round_1.yaml"))
        back = read_round(sd, 1)  # read back through the store package
        assert json.loads(json.dumps(back.to_dict())) == json.loads(files.read_text(p.fit_path))
        books[backend] = _strip_times(ledger.read_ledger(sd))
        resolved[backend] = [(r["run_id"], r["spec"]) for r in store.read_resolved(sd)["runs"]]
        fits[backend] = {k: v for k, v in back.to_dict().items() if k not in ("spec_path", "fit_path")}
    assert books["s3"] == books["local"] and books["local"]["predictions"]
    assert all(p["measured"] is not None for p in books["local"]["predictions"] if not p.get("flag"))
    assert resolved["s3"] == resolved["local"] and ("rounds/round_1.yaml" in {s for _, s in resolved["local"]})
    assert fits["s3"] == fits["local"]


def test_a_round_proposed_meanwhile_by_another_driver_is_not_overwritten(root):
    sd = sweep_of(root, "loop")
    _synthetic_launch(expand_sweep(LOOP), sd, spec_text=yaml.safe_dump(LOOP, sort_keys=False), spec_name="loop")
    other = b'{"written by": "another driver"}'
    assert replace_if(files.join(sd, "fits", "round_1.json"), other, None)  # that driver's claim on round 1 ...
    with pytest.raises(UsageError, match="round 1 was proposed meanwhile"):
        _propose_as_round(sd, 1)
    assert files.read_bytes(files.join(sd, "fits", "round_1.json")) == other
    assert not files.exists(files.join(sd, "rounds", "round_1.yaml"))
    assert ledger.read_ledger(sd)["fits"] == []  # nothing of the losing proposal recorded


def _propose_as_round(sd, k):
    """propose_round as a driver that numbered its round k before the other driver's fit appeared."""
    real = propose.next_round
    propose.next_round = lambda _: k
    try:
        return propose.propose_round(sd, target_flops=1e13, replicates=4, log=lambda _: None)
    finally:
        propose.next_round = real


# ---------------------------------------------------------------------------------------------
# Real training on Ray: a cooldown branch, and a sibling sweep sharing its runs
# ---------------------------------------------------------------------------------------------

WSD = {
    "name": "wsd",
    "base": {
        "model": {"preset": "debug", "d_model": 32},
        "data": {"seq_len": 32, "val_sequences": 4},
        "train": {"global_batch_tokens": 128, "num_tokens": 16 * 128},
        "schedule": {"name": "wsd", "decay_fraction": 0.25, "warmup_tokens": 128},
        "eval": {"interval_steps": 0, "val_batch_sequences": 4},
        "checkpoint": {"interval_steps": 8},
        "logging": {"wandb": "disabled", "progress": "off"},
    },
    "points": [{}],
    "cooldowns": {"fractions": [0.5], "max_checkpoints": 4},
    "execution": {"max_failures": 1, "max_concurrent": 1},
}


@pytest.fixture(scope="module")
def module_ray(s3):
    """One private loopback Ray (1 CPU, as each launch asked for) for both backends' training, started
    after the S3 server so its workers inherit the AWS environment pointing at it; a launch uses a Ray
    that is already up as it is. Shut down at the module's end, before the session's `ray_local`
    (whose tests run last) starts. Starting a cluster is most of a launch's time on a small sweep."""
    local_ray_on_loopback()
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _train_cooldown_sweep_and_a_sibling(root) -> dict[str, tuple]:
    """Launch the WSD sweep and a sibling sweep of the same spec into `root`; check that each run
    trained once (the branch from its stable run's checkpoint); return run id -> (status, final val
    loss, cooldown) as load_runs reads it."""
    a, b = sweep_of(root, "wsd"), sweep_of(root, "wsd-sibling")
    sweep = expand_sweep(WSD)
    branch = next(r for r in sweep.runs if r.depends_on)
    text = yaml.safe_dump(WSD)
    first = launch(sweep, a, spec_text=text, num_cpus=1, log=lambda _: None)
    assert set(first["states"].values()) == {"done"} and sorted(first["trained"]) == sorted(first["states"])
    second = launch(sweep, b, spec_text=text, num_cpus=1, log=lambda _: None)
    assert second["trained"] == [] and set(second["states"].values()) == {"done"}  # linked, not retrained
    assert resume(b, num_cpus=1, log=lambda _: None)["trained"] == []
    starts = [e["run_id"] for s in (a, b) for e in store.read_events(s) if e["event"] == "start"]
    assert sorted(starts) == sorted(first["states"])  # one training per run in the whole root
    status = store.read_status(store.run_location(a, branch.run_id))
    assert status["loaded_steps"][0] == branch.labels["branch_step"]  # started from the stable checkpoint
    runs = store.load_runs(root)
    assert runs.height == 2
    return {r["run_id"]: (r["status"], r["final_val_loss"], r["cooldown"]) for r in runs.iter_rows(named=True)}


@pytest.mark.serial  # starts a Ray cluster (tests/conftest.py)
def test_cooldown_branch_and_a_sibling_sweep_train_each_run_once_with_the_same_records_on_both_stores(
    s3, tmp_path, module_ray
):
    """Both backends in one test, so the comparison never depends on which worker ran which test first."""
    local = _train_cooldown_sweep_and_a_sibling(tmp_path / "root")
    remote = _train_cooldown_sweep_and_a_sibling(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}")
    assert remote == local  # same run ids, statuses and final losses (bit for bit)


# ---------------------------------------------------------------------------------------------
# The LR-transfer gate
# ---------------------------------------------------------------------------------------------

LADDER = {
    "name": "lad",
    "base": {
        "model": {"parametrization": "mup", "kernels": "torch"},
        "data": {"seq_len": 32, "val_sequences": 8},
        "train": {"global_batch_tokens": 128},
        "eval": {"interval_steps": 0},
        "checkpoint": {"interval_steps": 0},
        "logging": {"wandb": "disabled"},
    },
    "ladder": {"sizes": [3.4e4], "tokens_per_param": [0.25]},
    "transfer": {"check": True, "widths": [32, 64], "lrs": [4e-3, 1.6e-2, 6.4e-2], "tokens_per_param": 0.25},
}


def _lr_launch(sweep, sweep_dir, *, spec_text, spec_name, **_):
    """A launch whose runs end at a loss with its minimum at lr 1.6e-2 at every width (a transfer that holds)."""
    store.init_sweep(sweep_dir, spec_text, spec_name, [r.to_dict() for r in sweep.runs], sweep.name)
    for r in sweep.runs:
        loss = 3.0 + (math.log(r.config["optim"]["lr"] / 1.6e-2)) ** 2 + 1e-3 * r.config["model"]["d_model"]
        store.write_status(store.run_path(sweep_dir, r.run_id), "done", final_val_loss=loss, final_train_loss=loss)
    return {"states": {r.run_id: "done" for r in sweep.runs}}


def test_transfer_gate_checks_into_the_sibling_sweep_and_the_ladder_takes_its_lr(root, monkeypatch):
    monkeypatch.setattr(rounds, "launch", _lr_launch)
    out = sweep_of(root, "lad")
    result = run_rounds(
        expand_sweep(LADDER), out, spec_text=yaml.safe_dump(LADDER), spec_name="lad", log=lambda _: None
    )
    assert result.transfer is not None and not result.transfer.refused and result.transfer.gate.ok
    check = files.join(root, "lad-transfer")
    assert files.read_text(files.join(check, "gate.txt")) == result.transfer.table + "\n"
    assert store.load_runs(check).height == 6  # 2 widths x 3 LRs, in the sibling sweep
    ladder = store.load_runs(out)
    assert ladder["lr"].to_list() == [pytest.approx(1.6e-2)]  # the ladder's run took the transferred LR


# ---------------------------------------------------------------------------------------------
# What object storage does not run yet: one line, exit 2, nothing written
# ---------------------------------------------------------------------------------------------

STUDY = {
    "name": "study",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5.0}, "span": 3},
    "fit": {"bootstrap": 8},
    "study": {"arms": {"a": {}, "b": {"optim.beta2": 0.99}}, "target_flops": 3e13},
}


def test_a_studys_rounds_on_s3_stop_with_one_line(s3, tmp_path, capsys):
    spec = tmp_path / "study.yaml"
    spec.write_text(yaml.safe_dump(STUDY))
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/study"
    assert main(["sweep", "launch", str(spec), "--out", url, "--rounds", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "a study's rounds need a local or shared POSIX store" in err and len(err.splitlines()) == 1
    assert objects.list_objects(objects.parent(url)) == {}  # nothing written
    launch_synthetic(STUDY, url, {"a": SyntheticLaw(), "b": SyntheticLaw(efficiency=2.0)})
    before = objects.list_objects(url)
    assert main(["sweep", "next", url]) == 2
    err = capsys.readouterr().err.strip()
    assert "a study's rounds need a local or shared POSIX store" in err and len(err.splitlines()) == 1
    assert objects.list_objects(url).keys() == before.keys()


def test_sweep_study_reads_a_study_on_s3(s3, capsys):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/study"
    launch_synthetic(STUDY, url, {"a": SyntheticLaw(), "b": SyntheticLaw(efficiency=2.0)})
    before = objects.list_objects(url)
    assert main(["sweep", "study", url, "--replicates", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("study study: baseline a") and "b over a: multiplier" in out
    assert "verdicts by the paired gap model" in out and "no arm has measured runs at the target yet" in out
    assert objects.list_objects(url).keys() == before.keys()  # read, not written
