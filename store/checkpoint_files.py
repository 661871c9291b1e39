"""A run's checkpoint directories as files: which are complete, and their copies on object storage.

    <run>/checkpoints/step_<N>/         complete (a save writes step_<N>.tmp and renames it)
    <run>/checkpoints/step_<N>/manifest.json   every file's size and sha256, written last

What is inside a checkpoint (DCP shards, train state, RNG) and how it is verified and loaded is
scalelab.train.checkpoint's; this module only moves and lists the directories, so the store
(scalelab.store.lease) can sync a run without torch.

On object storage a checkpoint is uploaded file by file, manifest.json last, and only step_<N>/
prefixes whose manifest is there count (`remote_checkpoints`; scalelab.store.lease pulls those), so
an upload cut short is never loaded (and never mistaken for a legacy checkpoint without a manifest).
`pull_checkpoint` downloads one complete checkpoint of another run (a cooldown branch's branch
point, read from its stable run) beside the node-local copy of the run that starts from it.
"""

from __future__ import annotations

import re
from pathlib import Path

from scalelab.store import objects

MANIFEST = "manifest.json"  # written last into a checkpoint: its presence marks the checkpoint complete
STEP_DIR = re.compile(r"^step_(\d+)$")


def list_checkpoints(ckpt_root: str | Path) -> list[tuple[int, Path]]:
    """Completed checkpoints as (step, path), oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir():  # step_<N> appears by rename only once the save completed
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(ckpt_root: str | Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1][1] if ckpts else None


def remote_checkpoints(url: str) -> dict[str, list[str]]:
    """{step_<N>: its object names} of the completed checkpoints (manifest present) under `url/`."""
    found: dict[str, list[str]] = {}
    for rel in objects.list_objects(url):
        step_dir, _, fname = rel.partition("/")
        if STEP_DIR.match(step_dir) and fname and "/" not in fname:
            found.setdefault(step_dir, []).append(fname)
    return {d: names for d, names in found.items() if MANIFEST in names}


def pull_checkpoint(url: str, dest: Path) -> bool:
    """Download the complete checkpoint at `url` (.../checkpoints/step_<N>) into `dest`, whole: its
    files go to `dest`.tmp, renamed to `dest` once all are there. False (nothing written) when the
    store holds no complete checkpoint there (no manifest)."""
    listing = objects.list_objects(url)
    if MANIFEST not in listing:
        return False
    tmp = dest.with_name(dest.name + ".tmp")
    for rel, meta in sorted(listing.items()):
        if "/" not in rel:
            objects.download(objects.join(url, rel), objects.inside(tmp, rel), meta["mtime"])
    tmp.rename(dest)
    return True
