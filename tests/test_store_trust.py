"""A store's records cannot choose local files for workers to read (issue 51, Medium 3; docs/store.md, Trust).

Whoever can write a store (a bucket, a shared directory) writes its records; the person who
launches gives the spec. A run of sweep.resolved.json (or a run's config.json for `sweep eval`, or
a detached driver's spec copy) naming a local path (data, tokenizer, init_from, an eval task file)
that the launcher's own spec does not name is refused with one line, exit 2, before anything is
trained or built from it; with `--spec` naming the same path it is accepted. No Ray starts here:
a refusal comes first, and the accepted resume finds its run finished.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.train.config import RunConfig, build_run_config, to_dict
from scalelab.train.identity import config_hash
from scalelab.train.local_paths import LOCAL_PATH_FIELDS, NO_PATH_SECTIONS, NOT_PATHS, local_paths

BASE = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"global_batch_tokens": 256, "num_tokens": 1024},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def _string_fields(cls, prefix: str = "") -> set[str]:
    """Dotted names of every str-holding field of a config dataclass (lists of sections flattened)."""
    out = set()
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        args = typing.get_args(tp)
        inner = args[0] if typing.get_origin(tp) is list else tp
        if dataclasses.is_dataclass(inner):
            out |= _string_fields(inner, f"{name}.")
        elif str in (inner, *args) or typing.get_origin(tp) is dict:
            out.add(name)
    return out


def test_every_string_of_a_run_config_is_classified_as_a_path_or_not():
    """A new string field must be put in LOCAL_PATH_FIELDS or NOT_PATHS (train/local_paths.py)."""
    fields = {f for f in _string_fields(RunConfig) if f.split(".")[0] not in NO_PATH_SECTIONS}
    assert fields == set(LOCAL_PATH_FIELDS) | set(NOT_PATHS)


def test_local_paths_names_each_key_and_not_the_defaults(tmp_path):
    tree = to_dict(build_run_config(BASE))
    assert local_paths(tree) == []
    tree["data"]["sources"] = [{"name": "a", "path": "default"}, {"name": "b", "path": "/data/b"}]
    tree["data"]["tokenizer"] = "/tok/tokenizer.json"
    tree["train"]["init_from"] = "/ckpt/step_9"
    tree["eval"]["tasks"] = ["bundled:stdlib_nextline", "olmes:arc_easy/rc_0shot", "/tasks/t.jsonl"]
    assert local_paths(tree) == [
        ("data.sources[1].path", "/data/b"),
        ("data.tokenizer", "/tok/tokenizer.json"),
        ("train.init_from", "/ckpt/step_9"),
        ("eval.tasks[1]", "olmes:arc_easy/rc_0shot"),
        ("eval.tasks[2]", "/tasks/t.jsonl"),
    ]


@pytest.fixture
def planted(tmp_path):
    """A launched (recorded) sweep whose sweep.resolved.json a bucket writer rewrote so that its run
    (id: the config's hash, as a real one) trains on tmp_path/secret; the run is marked done, so
    an accepted resume has nothing to train. Returns (sweep dir, the spec that names that path)."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa.txt").write_text("-----BEGIN OPENSSH PRIVATE KEY----- canary\n")
    spec = {"name": "s", "base": BASE, "grid": {"optim.lr": [1e-3]}}
    sd = tmp_path / "root" / "s"
    runs = [r.to_dict() for r in expand_sweep(spec).runs]
    store.init_sweep(sd, yaml.safe_dump(spec), "s", runs, "s")
    cfg = build_run_config(dict(BASE, data=dict(BASE["data"], sources=[{"name": "loot", "path": str(secret)}])))
    run_id = config_hash(cfg)
    resolved = json.loads((sd / "sweep.resolved.json").read_text())
    resolved["runs"] = [dict(runs[0], run_id=run_id, config=to_dict(cfg))]
    (sd / "sweep.resolved.json").write_text(json.dumps(resolved))
    (sd / "runs" / run_id).mkdir(parents=True)
    (sd / "runs" / run_id / "status.json").write_text(json.dumps({"status": "done"}))
    own = tmp_path / "own.yaml"  # the launcher's spec, if the path were theirs
    own.write_text(yaml.safe_dump(dict(spec, base=dict(BASE, data=to_dict(cfg)["data"]))))
    return sd, own


def test_resume_refuses_a_path_only_the_store_names_and_takes_it_from_the_launchers_spec(planted, capsys):
    sd, own = planted
    before = sorted(p.relative_to(sd) for p in sd.rglob("*"))
    assert main(["sweep", "resume", str(sd)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.sources[0].path=" in err and "secret" in err, err
    assert "sweep.resolved.json: run " in err and "--spec" in err
    assert sorted(p.relative_to(sd) for p in sd.rglob("*")) == before  # nothing written, nothing trained
    assert main(["sweep", "resume", str(sd), "--spec", str(own)]) == 0  # the launcher's own path
    assert "1 of 1 run(s) already finished" in capsys.readouterr().out


@pytest.mark.parametrize(
    "key, value",
    [
        ("train.init_from", "/home/user/ckpt/step_10"),
        ("train.init_from", "../../../elsewhere/checkpoints/step_2"),
        ("data.tokenizer", "/etc/passwd"),
        ("eval.tasks", ["/home/user/secret.jsonl"]),
    ],
)
def test_any_path_key_the_store_names_is_refused(planted, capsys, key, value):
    sd, _ = planted
    resolved = json.loads((sd / "sweep.resolved.json").read_text())
    section, name = key.split(".")
    resolved["runs"][0]["config"][section][name] = value
    resolved["runs"][0]["config"]["data"]["sources"] = [{"name": "stdlib", "path": "default"}]
    (sd / "sweep.resolved.json").write_text(json.dumps(resolved))
    assert main(["sweep", "resume", str(sd)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "only the store's records name" in err, err


def test_a_cooldown_branch_point_inside_the_store_is_allowed(planted, capsys):
    sd, _ = planted
    resolved = json.loads((sd / "sweep.resolved.json").read_text())
    resolved["runs"][0]["config"]["train"]["init_from"] = "../0123456789ab/checkpoints/step_4"
    resolved["runs"][0]["config"]["data"]["sources"] = [{"name": "stdlib", "path": "default"}]
    (sd / "sweep.resolved.json").write_text(json.dumps(resolved))
    from scalelab.sweeps.execution.execute import check_given_paths

    check_given_paths(resolved["runs"], frozenset(), sd)  # no error


def test_a_round_launched_from_the_stores_records_may_not_add_a_path(tmp_path):
    """launch() given the launcher's paths (as run_rounds passes them) refuses a sweep whose runs, built
    from the store's sweep.yaml, name another: before anything is written."""
    secret = tmp_path / "secret.txt"
    secret.write_text("x" * 4096)
    spec = {"name": "r", "base": dict(BASE, data=dict(BASE["data"], sources=[{"path": str(secret)}])), "grid": {}}
    spec["grid"] = {"optim.lr": [1e-3]}
    with pytest.raises(UsageError, match="only the store's records name"):
        launch(expand_sweep(spec), tmp_path / "root" / "r", spec_text="x", given=frozenset(), log=lambda m: None)
    assert not (tmp_path / "root").exists()


def test_sweep_eval_refuses_a_run_config_naming_a_path_not_given(tmp_path, capsys):
    sd = tmp_path / "root" / "e"
    spec = {"name": "e", "base": BASE, "grid": {"optim.lr": [1e-3]}}
    store.init_sweep(sd, yaml.safe_dump(spec), "e", [r.to_dict() for r in expand_sweep(spec).runs], "e")
    run = sd / "runs" / "0123456789ab"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "checkpoints" / "step_2" / "manifest.json").write_text("{}")
    (run / "status.json").write_text(json.dumps({"status": "done"}))
    tree = to_dict(build_run_config(BASE))
    tree["data"]["tokenizer"] = "/home/user/.ssh/id_rsa"
    (run / "config.json").write_text(json.dumps(tree))
    assert main(["sweep", "eval", str(sd), "--tasks", "bundled:stdlib_nextline@4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.tokenizer=" in err and "config.json" in err, err


def test_a_detached_drivers_spec_copy_must_be_the_one_submitted(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "base": BASE, "grid": {"optim.lr": [1e-3]}}))
    out = tmp_path / "root" / "s"
    assert main(["sweep", "launch", str(spec), "--out", str(out), "--spec-sha256", "0" * 64]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not the spec that was submitted" in err, err
    assert not out.exists()


def test_resume_reads_the_spec_it_is_given_not_a_missing_one(planted, capsys):
    sd, _ = planted
    assert main(["sweep", "resume", str(sd), "--spec", str(Path(sd) / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("where", [".claims", "runs"])
def test_a_planted_link_cannot_send_a_trial_outside_the_store_root(tmp_path, where):
    """A `.claims/<id>` (or a sweep's `runs/<id>`) symlink to any directory would make the trial train
    there and its clean-up delete that directory's `.*.tmp` files: refused with one line instead."""
    from scalelab.store.run_lock import remove_stale_temp_files, run_lock

    victim = tmp_path / "home"
    victim.mkdir()
    (victim / ".bashrc.tmp").write_text("keep me")
    spec = {"name": "s", "base": BASE, "grid": {"optim.lr": [1e-3]}}
    sd = tmp_path / "root" / "s"
    store.init_sweep(sd, yaml.safe_dump(spec), "s", [r.to_dict() for r in expand_sweep(spec).runs], "s")
    link = tmp_path / "root" / ".claims" / "0123456789ab" if where == ".claims" else sd / "runs" / "0123456789ab"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    with pytest.raises(UsageError, match="not a run of this store root; remove the link"):
        with run_lock(sd, "0123456789ab", wait_s=0) as run_dir:  # what a sweep trial does first
            remove_stale_temp_files(run_dir)
    assert (victim / ".bashrc.tmp").read_text() == "keep me" and sorted(victim.iterdir()) == [victim / ".bashrc.tmp"]
