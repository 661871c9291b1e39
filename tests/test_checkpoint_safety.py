"""Loading a checkpoint never runs what a file brings; a corrupt latest checkpoint falls back to the previous one.

Crafted checkpoints: a `.metadata` pickle whose `__reduce__` calls os.system, and a shard whose
non-tensor entry (an optimizer hyperparameter, loaded by DCP's default planner with
weights_only=False) does the same; both with a manifest recomputed by the attacker. Each is
refused on every load path (resume, init_from, `scalelab eval`, the HF/lm-eval conversion) with one
line, and the marker file the payload would create never appears.

Corruptions: a truncated shard, an empty .metadata, an empty train_state.json, a truncated RNG
file (and a truncated shard in a checkpoint written before manifests). `--resume` uses the newest
checkpoint that verifies, says which and why it skipped the others, and continues bit for bit.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import polars as pl
import pytest
import torch

from scalelab.cli.main import main
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.store.records import read_status
from scalelab.train.checkpoint_verify import MANIFEST, CheckpointError, file_entry, read_metadata, verify_checkpoint
from scalelab.train.config import build_run_config, to_dict
from scalelab.train.eval_checkpoint import load_checkpoint_model
from scalelab.train.loop import train_run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: restores the thread count after the module

BASE = {
    "name": "ck",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    "train": {"num_tokens": 6 * 256, "global_batch_tokens": 256, "seed": 5, "num_threads": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 2, "keep_last": 3},
    "logging": {"wandb": "disabled", "progress": "off"},
}


class Payload:
    """What an attacker pickles: unpickling it runs `touch MARKER`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 2, 4 and 6."""
    run = tmp_path_factory.mktemp("src") / "run"
    assert train_run(build_run_config(BASE), run)["status"] == "done"
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2, 4, 6]
    return run


def _copy_run(source: Path, dst: Path) -> Path:
    shutil.copytree(source, dst)
    return dst


def _refresh_manifest(ckpt: Path, *names: str) -> None:
    """What an attacker (or a careless tool) does after editing files: recompute the manifest."""
    manifest = json.loads((ckpt / MANIFEST).read_text())
    for name in names:
        manifest["files"][name] = file_entry(ckpt / name)
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


def craft_metadata(ckpt: Path, marker: Path) -> None:
    """A real .metadata with the payload hidden inside, and a manifest that matches it."""
    meta = read_metadata(ckpt / ".metadata")
    meta.storage_meta.modules = [Payload(marker)]
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    _refresh_manifest(ckpt, ".metadata")


def craft_entry(ckpt: Path, marker: Path) -> None:
    """The shard's optimizer `lr` entry replaced by a torch.save'd payload (metadata points at it)."""
    meta = read_metadata(ckpt / ".metadata")
    index = next(i for i in meta.storage_data if i.fqn.endswith("param_groups.0.lr"))
    info = meta.storage_data[index]
    shard = ckpt / info.relative_path
    blob = io.BytesIO()
    torch.save(Payload(marker), blob)
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(blob.getvalue())
    info.offset, info.length = offset, len(blob.getvalue())
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    _refresh_manifest(ckpt, ".metadata", info.relative_path)


CRAFTS = {"metadata": craft_metadata, "entry": craft_entry}


def _cfg_file(tmp_path: Path, **train) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({**BASE, "train": {**BASE["train"], **train}}))
    return path


@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_crafted_checkpoints_really_carry_a_payload(source, tmp_path, craft):
    """The fixtures are live: what DCP's own reader does (pickle.load of .metadata, torch.load with
    weights_only=False of a non-tensor entry) runs the payload."""
    marker = tmp_path / "pwned"
    ckpt = _copy_run(source, tmp_path / "r") / "checkpoints" / "step_6"
    CRAFTS[craft](ckpt, marker)
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    if craft == "entry":
        info = next(v for k, v in meta.storage_data.items() if k.fqn.endswith("param_groups.0.lr"))
        with open(ckpt / info.relative_path, "rb") as f:
            f.seek(info.offset)
            torch.load(io.BytesIO(f.read(info.length)), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_crafted_checkpoint_refused_on_every_load_path(source, tmp_path, capsys, craft):
    marker = tmp_path / "pwned"
    run = _copy_run(source, tmp_path / "run")
    bad = run / "checkpoints" / "step_6"
    CRAFTS[craft](bad, marker)

    with pytest.raises(CheckpointError, match="refused: it references posix.system"):
        verify_checkpoint(bad)

    # eval: a checkpoint dir, and the run dir that holds it
    for target in (bad, run):
        assert main(["eval", str(target), "--no-write"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "refused" in err and "step_6" in err, err

    # init_from: refused before anything is written
    out = tmp_path / "branch"
    code = main(["run", str(_cfg_file(tmp_path)), "--out", str(out), "--set", f"train.init_from={bad}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "refused" in err, err
    assert not out.exists()

    # HF export / lm-eval adapter: both build the model through load_checkpoint_model
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint_model(bad)

    # resume: the crafted latest checkpoint is refused, moved aside, and the run continues from step 4
    assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "skipped step_6" in err and "refused" in err and "resume: from" in err and "step_4" in err
    status = read_status(run)
    assert status["status"] == "done" and status["started_steps"] == 4 and status["loaded_steps"] == [None, 4]
    assert any("refused" in s for s in status["skipped_checkpoints"])
    assert (run / "checkpoints" / "step_6.corrupt").is_dir()
    assert not marker.exists(), "a load path ran the payload"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    "truncated shard": lambda c: _truncate(c / "__0_0.distcp"),
    "empty .metadata": lambda c: (c / ".metadata").write_bytes(b""),
    "empty train_state.json": lambda c: (c / "train_state.json").write_text(""),
    "truncated RNG file": lambda c: _truncate(c / "rng_rank0.pt"),
    "truncated shard, no manifest": lambda c: (_truncate(c / "__0_0.distcp"), (c / MANIFEST).unlink()),
    "empty RNG file, no manifest": lambda c: ((c / "rng_rank0.pt").write_bytes(b""), (c / MANIFEST).unlink()),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(source, tmp_path, capsys, kind):
    run = _copy_run(source, tmp_path / "run")
    for name in ("step_6", "step_4"):  # the two newest are damaged the same way: two fall-backs
        CORRUPTIONS[kind](run / "checkpoints" / name)
    (run / "status.json").write_text(json.dumps({**read_status(run), "status": "running"}))
    reference = pl.read_parquet(source / "metrics.parquet")["loss"].to_list()
    assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "skipped step_6" in err and "skipped step_4" in err, err
    assert f"resume: from {run / 'checkpoints' / 'step_2'}" in err
    status = read_status(run)
    assert status["loaded_steps"] == [None, 2] and len(status["skipped_checkpoints"]) == 2
    assert pl.read_parquet(run / "metrics.parquet")["loss"].to_list() == reference  # bit for bit
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_2",
        "step_4",
        "step_4.corrupt",
        "step_6",
        "step_6.corrupt",
    ]


def test_resume_with_no_good_checkpoint_fails_keeps_them_and_needs_start_over(source, tmp_path, capsys):
    run = _copy_run(source, tmp_path / "run")
    for _, ckpt in list_checkpoints(run / "checkpoints"):
        (ckpt / ".metadata").write_bytes(b"")
    metrics = (run / "metrics.parquet").read_bytes()
    for attempt in (1, 2):  # the second attempt must not start over from step 0 either
        assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 2, attempt
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "no checkpoint verifies" in err and "step_2" in err and "step_6" in err and "--start-over" in err
        assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2, 4, 6]  # kept as they were
        assert (run / "metrics.parquet").read_bytes() == metrics
        status = read_status(run)
        assert status["status"] == "failed" and "no checkpoint verifies" in status["error"]
    assert main(["run", str(run / "config.json"), "--out", str(run), "--resume", "--start-over"]) == 0
    assert read_status(run)["loaded_steps"][-1] is None  # asked for: trained from step 0
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert {"step_2.corrupt", "step_4.corrupt", "step_6.corrupt"} <= set(names)  # the old ones kept aside


def test_a_transient_read_error_is_retried_not_called_corruption(source, tmp_path, capsys, monkeypatch):
    import errno

    run = _copy_run(source, tmp_path / "run")
    (run / "status.json").write_text(json.dumps({**read_status(run), "status": "running"}))
    real, failed = Path.read_text, []

    def flaky(self, *a, **k):
        if self.name == MANIFEST and self.parent.name == "step_6" and len(failed) < 2:
            failed.append(self)
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", flaky)
    assert main(["run", str(run / "config.json"), "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert len(failed) == 2 and f"resume: from {run / 'checkpoints' / 'step_6'}" in err, err
    assert not [p for p in (run / "checkpoints").iterdir() if ".corrupt" in p.name]


def test_save_writes_a_manifest_of_every_file(source):
    ckpt = source / "checkpoints" / "step_6"
    manifest = json.loads((ckpt / MANIFEST).read_text())
    on_disk = {p.name for p in ckpt.iterdir()} - {MANIFEST}
    assert set(manifest["files"]) == on_disk and manifest["step"] == 6
    assert verify_checkpoint(ckpt)["step"] == 6
    assert to_dict(build_run_config(BASE)) == json.loads((source / "config.json").read_text())
