"""One copy of each run per store root: claims, and links from the sweeps that share a run.

Store root and dedupe: the *store root* is the directory that holds the sweep directories (the
parent of `--out`). Runs are addressed by the hash of their resolved config, and each run has one
directory per store root: the first sweep to start a run claims it (`<root>/.claims/<run_id>`, an
atomic symlink to its run directory, see claim_run), and every other sweep links its
`runs/<id>` there (`../../<other>/runs/<id>`, a relative symlink). Whoever trains a run holds that
directory's lock (scalelab.store.run_lock), so sibling sweeps launched together train each run
once: the second waits for the first and finds it done (or, if the first died, resumes it from its
checkpoints). Runs that are `done` anywhere in the root from before claims existed are linked the
same way. Ids change when the code gains a config field; `renamed_runs` finds a finished run under
its new id (and load_runs lists it once).

Object storage has no symlinks; the same rules hold with objects: the claim is
`<root>/.claims/<run_id>.json` = {"sweep": name} (a conditional put: one sweep wins), and a sweep
whose run another one claimed keeps `<sweep>/links/<run_id>.json` = {"sweep": owner} instead of its
own copy. The lease (scalelab.store.lease) is keyed by root and run id, so the second sweep's trial
waits for the first one's trainer and finds the run done; readers follow the link
(objects.local_view copies the linked run's records into the view).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from scalelab.errors import UsageError
from scalelab.store import objects
from scalelab.store.paths import is_sweep_dir, run_path, runs_dir
from scalelab.store.records import TERMINAL, run_state

# (stored config tree, stored run id) -> the id today's code gives that run, or None (another run)
CurrentId = Callable[[dict, str], str | None]


def find_finished_elsewhere(sweep_dir: str | Path, run_id: str) -> Path | None:
    """A terminal copy of run_id in another sweep of the same store root, or None."""
    sweep_dir = Path(sweep_dir).resolve()
    root = sweep_dir.parent
    for other in sorted(root.iterdir()):
        if other == sweep_dir or not is_sweep_dir(other):
            continue
        cand = run_path(other, run_id)
        if cand.is_dir() and not cand.is_symlink() and run_state(cand) in TERMINAL:
            return cand
    return None


def renamed_runs(root: str | Path, current_id: CurrentId) -> dict[str, Path]:
    """Terminal runs of the store root whose id changed with the code: {id under today's code: dir}.

    A run's id is the hash of its resolved config, so a new config field (with its default) changes
    every id. `current_id(stored_config, stored_id)` (scalelab.train.identity.current_run_id) says
    which id today's code gives a stored run, or None when today's code computes another run; the
    store only scans. Costs one config resolution per stored run.
    """
    index: dict[str, Path] = {}
    for sweep in sorted(p for p in Path(root).iterdir() if is_sweep_dir(p)):
        rdir = runs_dir(sweep)
        for d in sorted(rdir.iterdir()) if rdir.is_dir() else []:
            if d.is_symlink() or not d.is_dir() or run_state(d) not in TERMINAL:
                continue
            try:
                current = current_id(json.loads((d / "config.json").read_text()), d.name)
            except (OSError, ValueError):  # no readable config.json: matches nothing
                continue
            if current is not None and current != d.name:
                index.setdefault(current, d)
    return index


def attach_runs(sweep_dir: str | Path, run_ids: list[str], *, current_id: CurrentId | None) -> dict[str, str]:
    """State of each run, linking runs of the store root found elsewhere; {run_id: state}.

    Looked up among the root's claims (a run another sweep trains or trained, see claim_run), by
    id in sibling sweeps (terminal runs), then among runs stored under an older id of the same
    config (see renamed_runs; skipped when current_id is None); a match is linked as
    runs/<id> -> its directory (relative symlink).
    """
    if objects.is_url(sweep_dir):  # a run another sweep of the root claimed: a link object to it
        return {run_id: run_state(locate_object_run(sweep_dir, run_id)) for run_id in run_ids}
    sweep_dir = Path(sweep_dir)
    states, renamed = {}, None
    for run_id in run_ids:
        here = run_path(sweep_dir, run_id)
        if not here.exists():
            other = claimed_elsewhere(sweep_dir, run_id) or find_finished_elsewhere(sweep_dir, run_id)
            if other is None and current_id is not None:
                renamed = renamed_runs(sweep_dir.resolve().parent, current_id) if renamed is None else renamed
                other = renamed.get(run_id)
            if other is not None:
                here.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.relpath(other, here.parent), here)
        states[run_id] = run_state(here)
    return states


CLAIMS = ".claims"  # <root>/.claims/<run_id> -> the one physical directory of that run in the root


def _run_of_root(target: Path, root: Path, run_id: str) -> bool:
    """Whether `target` (resolved) is run_id's directory in a sweep of the store root `root`: what a
    claim or a runs/<id> link may point at, and nothing else (a planted link elsewhere would send a
    trial, and its clean-up of temporary files, into any directory)."""
    sweep = target.parent.parent
    return target.name == run_id and target.parent.name == "runs" and sweep.parent == root and is_sweep_dir(sweep)


def _checked_link(link: Path, root: Path, run_id: str) -> Path:
    """The resolved target of a claim or runs/<id> link, or UsageError naming a link that leads
    outside the store root's runs."""
    target = (link.parent / os.readlink(link)).resolve()
    if target.exists() and not _run_of_root(target, root.resolve(), run_id):
        raise UsageError(f"{link}: links to {target}, not a run of this store root; remove the link")
    return target


def claim_run(sweep_dir: str | Path, run_id: str) -> Path:
    """This sweep's directory for run_id, made the store root's one copy of that run; returns runs/<id>.

    The first sweep of the root to claim a run creates `<root>/.claims/<run_id>`, a symlink to its
    own run directory (os.symlink is atomic: of two sibling sweeps launched together exactly one
    wins); every other sweep links its runs/<id> to that directory. So a run has one directory,
    one lock and one training per store root; whoever trains it holds its lock. A run directory
    that already holds progress of its own is kept (copies made before claims existed), and a
    claim whose directory is gone (a deleted sweep) is taken over.
    """
    sweep_dir = Path(sweep_dir).absolute()
    here = run_path(sweep_dir, run_id)
    if here.is_symlink():
        _checked_link(here, sweep_dir.parent, run_id)
        return here
    claims = sweep_dir.parent / CLAIMS
    claims.mkdir(exist_ok=True)
    claim = claims / run_id
    here.mkdir(parents=True, exist_ok=True)  # before the claim: a claim always points at a directory
    for _ in range(3):
        try:
            os.symlink(os.path.relpath(here, claims), claim)
            return here
        except FileExistsError:
            pass
        owner = _checked_link(claim, sweep_dir.parent, run_id) if claim.is_symlink() else None
        if owner == here.resolve():
            return here
        if owner is not None and owner.is_dir():
            if any(here.iterdir()):
                return here  # progress of its own: never thrown away
            here.rmdir()
            os.symlink(os.path.relpath(owner, here.parent), here)
            return here
        stale = claims / f".{run_id}.{os.getpid()}.tmp"  # the claimed directory is gone: take over
        stale.unlink(missing_ok=True)
        os.symlink(os.path.relpath(here, claims), stale)
        os.replace(stale, claim)
    return here


def claimed_elsewhere(sweep_dir: str | Path, run_id: str) -> Path | None:
    """The directory of run_id claimed by another sweep of the root, if any (see claim_run)."""
    sweep_dir = Path(sweep_dir).absolute()
    claim = sweep_dir.parent / CLAIMS / run_id
    if not claim.is_symlink():
        return None
    owner = _checked_link(claim, sweep_dir.parent, run_id)
    if owner.is_dir() and owner != run_path(sweep_dir, run_id).resolve():
        return owner
    return None


def _owner_of(claim: str) -> tuple[str, str] | None:
    """(sweep name, ETag) of an object-storage claim, or None when there is none."""
    got = objects.read(claim)
    if got is None:
        return None
    try:
        owner = json.loads(got[0])["sweep"]
        assert isinstance(owner, str)
    except (ValueError, KeyError, TypeError, AssertionError):
        owner = ""
    return objects.confined(owner, f"{claim}: sweep") if owner else "", got[1]


def owner_body(owner: str) -> bytes:
    """The body of a link object: the sweep that holds the run."""
    return json.dumps({"sweep": owner}).encode()


def claim_object_run(sweep_url: str, run_id: str) -> str:
    """claim_run on object storage: the URL of the root's one copy of run_id, claimed for this sweep
    unless another live sweep of the root holds the claim (then linked there, see the docstring)."""
    root, me = objects.parent(sweep_url), objects.name(sweep_url)
    own = objects.join(sweep_url, "runs", run_id)
    claim = objects.join(root, CLAIMS, f"{run_id}.json")
    body = json.dumps({"sweep": me}).encode()
    for _ in range(3):
        try:
            objects.write_bytes(claim, body, if_none_match=True)
            return own
        except Exception as e:  # noqa: BLE001 - botocore's ClientError, sorted below
            if not objects.is_precondition_failure(e):
                raise
        got = _owner_of(claim)
        if got is None:
            continue
        owner, etag = got
        if owner == me:
            return own
        if owner and objects.exists(objects.join(root, owner, "sweep.yaml")):
            if objects.list_objects(own):
                return own  # progress of its own: never thrown away
            objects.write_bytes(objects.join(sweep_url, objects.LINKS, f"{run_id}.json"), owner_body(owner))
            return objects.join(root, owner, "runs", run_id)
        try:  # the claiming sweep is gone (or the claim unreadable): take over
            objects.write_bytes(claim, body, if_match=etag)
            return own
        except Exception as e:  # noqa: BLE001
            if not (objects.is_precondition_failure(e) or objects.is_not_found(e)):
                raise
    return own


def locate_object_run(sweep_url: str, run_id: str) -> str:
    """Where run_id of a sweep on object storage lives: its own prefix, or (a link, or a live claim
    of another sweep, which is then linked) that sweep's."""
    root = objects.parent(sweep_url)
    own = objects.join(sweep_url, "runs", run_id)
    link = objects.read_bytes(objects.join(sweep_url, objects.LINKS, f"{run_id}.json"))
    if link is not None:
        owner = objects.linked_sweep(link, f"{sweep_url}/{objects.LINKS}/{run_id}.json")
        return objects.join(root, owner, "runs", run_id)
    if objects.exists(objects.join(own, "status.json")):
        return own
    got = _owner_of(objects.join(root, CLAIMS, f"{run_id}.json"))
    if got is None or not got[0] or got[0] == objects.name(sweep_url):
        return own
    if not objects.exists(objects.join(root, got[0], "sweep.yaml")):
        return own
    objects.write_bytes(objects.join(sweep_url, objects.LINKS, f"{run_id}.json"), owner_body(got[0]))
    return objects.join(root, got[0], "runs", run_id)


def run_location(sweep_dir: str | Path, run_id: str) -> str | Path:
    """Where a sweep's run lives: runs/<id> (a symlink to the root's one copy, locally), or the
    claimed copy on object storage."""
    if objects.is_url(sweep_dir):
        return locate_object_run(sweep_dir, run_id)
    return run_path(sweep_dir, run_id)
