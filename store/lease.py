"""The run lease on object storage, and the node-local working copy of a run trained into it.

    with remote_run("s3://lab/sweeps/iso", run_id, wait_s=180) as run_dir:
        train_run(cfg, run_dir, resume=True)      # run_dir: a local directory, synced to the store

A local store serialises the trainers of a run with an fcntl lock (scalelab.store.run_lock).
Object storage has no locks, so a run there is guarded by a *lease*: the object
`<store root>/.leases/<run_id>.json` = {holder, generation, ttl_s, renewed_at, expires_at}. It is
taken with a conditional put (`If-None-Match: *`: of two takers exactly one succeeds) and renewed
every ttl_s/3 by a thread with `If-Match: <its ETag>`, so a holder that lost it finds out instead
of overwriting the new one. Each takeover raises the generation by one.

Expiry never compares two machines' clocks:
  - a taker takes over a lease once the store's own clock says it has not been renewed for ttl_s
    (the HTTP Date of the read minus the object's LastModified, both the store's; 1 s resolution);
  - a holder counts its lease valid for ttl_s from the moment it *sent* its last successful
    renewal, on its monotonic clock. A renewal lands after it is sent, so the holder's validity
    always ends before a taker may take over (given clocks that tick at the same rate).
The lease's client makes one attempt with short timeouts, so a stalled renewal fails within
seconds instead of being retried by botocore for minutes against a 30 s lease.

Fencing: every write and delete a holder makes to the run's objects (RunMirror) is
  1. made only while its lease is valid by its own clock with a margin (Lease.check), and
  2. conditioned on the object as this holder last saw it (`If-Match` its ETag, or
     `If-None-Match: *` for a new one). A condition that fails means someone else wrote the object:
     the holder re-reads the lease (Lease.confirm); if it is another holder's, it stops (LeaseLost)
     having changed nothing; if it is still its own, the object was left by an earlier, fenced-out
     holder and is overwritten (conditioned on its current ETag).
A remote checkpoint object is deleted only if this holder uploaded it or took it over at its pull
(and only under the ETag it recorded then, after confirming the lease): a holder that lost its
lease can neither overwrite nor delete what the next holder wrote.

The lease is renewed from the moment it is taken until the final upload is done: the pull and the
last push run under renewals. The run is trained in a local directory (the files the training
loop, DCP and the restricted checkpoint reader expect) that starts as a copy of the run's objects,
checkpoints included (only complete ones: manifest present). A second thread uploads what changed
every ttl_s/3 and once more at the end, in the order that keeps the store consistent at every
instant: the records, then the checkpoints they cover (manifest last), then status.json. A holder
whose lease was taken stops uploading and its trial fails, so Tune retries it behind the new holder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from scalelab.store import objects
from scalelab.store.checkpoint_files import MANIFEST, STEP_DIR, list_checkpoints

LEASE_TTL_S = 30.0  # a dead holder's run is taken over this long after its last renewal
LEASES = ".leases"
NOT_SYNCED = ("status.json", ".lock", ".status.lock")  # status.json goes last, on its own; locks are local
# Folders of a run uploaded once, when its trial ends: the offline W&B logs (<run>/wandb, written by
# wandb.init(dir=<run>)), which would otherwise go with the node-local copy. Never pulled back.
FINAL_FOLDERS = ("wandb",)
CLOCK_SLACK_S = 1.0  # the store's clock reads whole seconds (Date, LastModified)


class LeaseLost(RuntimeError):
    """Another holder took the lease, or this one could not renew it in time."""


class LeaseLapsing(RuntimeError):
    """The lease is still this holder's but close to lapsing (renewals failing): a write waits."""


class Lease:
    """One holder's lease on an object (see the module docstring)."""

    def __init__(self, url: str, ttl_s: float = LEASE_TTL_S, holder: str | None = None):
        self.url, self.ttl_s = url, ttl_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.etag: str | None = None
        self.generation = 0
        self.lost = threading.Event()
        self._sent_at: float | None = None  # monotonic time the last successful take/renewal was sent

    def _body(self) -> bytes:
        now = time.time()  # for people reading the object; expiry is decided by the store's clock
        body = {"holder": self.holder, "generation": self.generation, "ttl_s": self.ttl_s}
        return json.dumps(dict(body, renewed_at=now, expires_at=now + self.ttl_s)).encode()

    def current(self) -> dict | None:
        """The lease object as the store holds it: its fields, etag and age_s (store clock), or None."""
        got = objects.read_object(self.url, fast=True)
        if got is None:
            return None
        try:
            body = json.loads(got.data)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            body = {"holder": "?", "ttl_s": 0.0}  # unreadable: expired at once
        return dict(body, etag=got.etag, age_s=got.age_s)

    def _put(self, **condition) -> None:
        sent = time.monotonic()
        self.etag = objects.write_bytes(self.url, self._body(), fast=True, **condition)
        self._sent_at = sent

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it or the store's clock says its holder stopped renewing."""
        self.generation = 1
        try:
            self._put(if_none_match=True)
            return True
        except Exception as e:  # noqa: BLE001 - botocore's ClientError, sorted by is_precondition_failure
            if not objects.is_precondition_failure(e):
                raise
        cur = self.current()
        if cur is None or not self._expired(cur):
            return False  # held (or released just now: the next try takes it)
        self.generation = int(cur.get("generation") or 0) + 1
        try:
            self._put(if_match=cur["etag"])
            return True
        except Exception as e:  # noqa: BLE001
            if objects.is_precondition_failure(e) or objects.is_not_found(e):
                return False  # another taker was faster, or the holder released it
            raise

    def _expired(self, cur: dict) -> bool:
        ttl = float(cur.get("ttl_s") or 0.0)
        if cur.get("age_s") is None:  # a store that sends no Date header: never taken over early
            return ttl == 0.0
        return cur["age_s"] > ttl + CLOCK_SLACK_S

    def acquire(self, wait_s: float | None) -> None:
        """Take the lease, waiting up to wait_s (None: as long as a live holder renews it)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while not self.try_acquire():
            if deadline is not None and time.monotonic() > deadline:
                cur = self.current() or {}
                raise RuntimeError(
                    f"{self.url} is leased by {cur.get('holder')} (renewed {cur.get('age_s')} s ago by the "
                    f"store's clock, lease {cur.get('ttl_s')} s); waited {wait_s:.0f} s"
                )
            time.sleep(min(1.0, self.ttl_s / 4))

    def remaining_s(self) -> float:
        """How long this holder's lease stays valid by its own monotonic clock (<= 0: lapsed)."""
        if self._sent_at is None or self.lost.is_set():
            return 0.0
        return self._sent_at + self.ttl_s - time.monotonic()

    def renew(self) -> None:
        """Extend the lease; LeaseLost if another holder has it now or it lapsed before this renewal."""
        if self.remaining_s() <= 0:
            self.lost.set()
            raise LeaseLost(f"{self.url}: not renewed within {self.ttl_s:g} s; this holder stops writing")
        try:
            self._put(if_match=self.etag)
        except Exception as e:  # noqa: BLE001
            if objects.is_precondition_failure(e) or objects.is_not_found(e):
                self.lost.set()
                raise LeaseLost(f"{self.url}: lease taken by {(self.current() or {}).get('holder')}") from None
            raise

    def check(self) -> None:
        """Before a write: LeaseLost if the lease is lost or lapsed, LeaseLapsing if it is valid for
        less than a margin (a sixth of its life) more; either way nothing is written."""
        left = self.remaining_s()
        if left <= 0:
            self.lost.set()
            raise LeaseLost(f"{self.url}: lease lost or lapsed; this holder stops writing")
        if left < self.ttl_s / 6:
            raise LeaseLapsing(f"{self.url}: lease valid for {left:.1f} s only (renewals failing); not writing now")

    def confirm(self) -> None:
        """Read the lease back: LeaseLost (and lost for good) unless this holder still has it."""
        self.check()
        cur = self.current()
        if cur is None or cur.get("holder") != self.holder:
            self.lost.set()
            raise LeaseLost(f"{self.url}: held by {(cur or {}).get('holder')} now; this holder stops writing")

    def release(self) -> None:
        if self.etag is None or self.lost.is_set():
            return
        try:
            objects.delete(self.url, if_match=self.etag, fast=True)
        except Exception as e:  # noqa: BLE001
            if not (objects.is_precondition_failure(e) or objects.is_not_found(e)):
                raise


class RunMirror:
    """A run's objects mirrored in a local directory: pull once, push what changed (ordered, fenced).

    lease: the lease every write and delete is fenced by (None: unfenced, for tools and tests that
    own the prefix; a conflicting write then fails instead of being resolved)."""

    def __init__(self, url: str, local: Path, lease: Lease | None = None):
        self.url, self.local, self.lease = url, local, lease
        self.sent: dict[str, str] = {}  # file name -> sha256 of what the store holds
        self.owned: dict[str, str] = {}  # key below url -> ETag this holder wrote or took over at its pull
        self.lock = threading.Lock()  # a periodic push and a rank's checkpoint upload never interleave

    def pull(self, listing: dict[str, dict] | None = None, *, records: bool = True) -> None:
        """Copy the run's records and its complete checkpoints; every key is checked first.

        listing: the run's objects as objects.list_objects gave them (default: listed now; the
        ranks of a multi-process run all pull what rank 0 listed). records=False: checkpoints only."""
        listing = objects.list_objects(self.url) if listing is None else listing
        self.local.mkdir(parents=True, exist_ok=True)
        (self.local / "checkpoints").mkdir(exist_ok=True)
        complete = {
            rel.split("/")[1] for rel in listing if rel.startswith("checkpoints/") and rel.endswith(f"/{MANIFEST}")
        }
        for rel, meta in sorted(listing.items()):
            parts = rel.split("/")
            if len(parts) == 1:
                if not records or objects.too_large(objects.join(self.url, rel), meta["size"]):
                    continue
                self._fetch(rel, self.local / rel, meta)
                self.sent[rel] = _sha(self.local / rel)
            elif parts[0] == "checkpoints" and len(parts) == 3 and parts[1] in complete and STEP_DIR.match(parts[1]):
                self._fetch(rel, self.local / "checkpoints" / f"{parts[1]}.tmp" / parts[2], meta)
            self.owned[rel] = meta["etag"]  # taken over: pruned like this holder's own once superseded
        for name in sorted(complete):
            if not STEP_DIR.match(name):
                continue
            tmp = self.local / "checkpoints" / f"{name}.tmp"
            tmp.rename(self.local / "checkpoints" / name)
            self.sent[f"checkpoints/{name}"] = _sha(self.local / "checkpoints" / name / MANIFEST)

    def _fetch(self, rel: str, dest: Path, meta: dict) -> None:
        if self.lease is not None:
            self.lease.check()
        objects.download(objects.join(self.url, rel), objects.inside(self.local, str(dest.relative_to(self.local))),
                         meta["mtime"])  # fmt: skip

    def push(self, *, checkpoints: bool = True) -> None:
        """Upload what changed: records, then new checkpoints (manifest last), then prune, then status.

        checkpoints=False: the checkpoints were uploaded by the ranks that wrote them
        (scalelab.store.rank_copy); only superseded ones are pruned here."""
        with self.lock:
            self._push(checkpoints)

    def push_folders(self) -> None:
        """Upload the files of FINAL_FOLDERS, fenced like the records (a file already sent is not
        sent again; symbolic links, which wandb makes beside its logs, are left out)."""
        with self.lock:
            for folder in FINAL_FOLDERS:
                for dirpath, _, names in sorted(os.walk(self.local / folder)):  # links to folders not followed
                    for name in sorted(names):
                        path = Path(dirpath, name)
                        if not path.is_symlink() and path.is_file():
                            self._put(path.relative_to(self.local).as_posix(), _read(path))

    def _push(self, checkpoints: bool) -> None:
        # Snapshots first, uploads in reverse: status.json read before the records it summarises,
        # checkpoints listed before the records that cover them are read.
        status = _read(self.local / "status.json")
        ckpts = list_checkpoints(self.local / "checkpoints")
        for f in sorted(self.local.iterdir()):
            if f.is_file() and f.name not in NOT_SYNCED and not f.name.endswith(".tmp"):
                self._put(f.name, _read(f))
        kept = set()
        for _, path in ckpts:
            rel = f"checkpoints/{path.name}"
            kept.add(path.name)
            manifest = _read(path / MANIFEST)
            if not checkpoints or manifest is None or self.sent.get(rel) == hashlib.sha256(manifest).hexdigest():
                continue
            try:
                files = sorted(p for p in path.iterdir() if p.is_file() and p.name != MANIFEST)
                for f in [*files, path / MANIFEST]:  # the manifest makes the checkpoint exist: last
                    self._put_file(f"{rel}/{f.name}", f)
            except FileNotFoundError:
                continue  # pruned by keep_last while uploading: its objects go below
            self.sent[rel] = hashlib.sha256(manifest).hexdigest()
        for key in sorted(self.owned):  # superseded checkpoints and cut uploads, once newer ones are up
            parts = key.split("/")
            if parts[0] == "checkpoints" and len(parts) == 3 and parts[1] not in kept:
                self._delete(key)
        self._put("status.json", status)

    # -- fenced writes ---------------------------------------------------------------------------

    def _put(self, rel: str, data: bytes | None) -> None:
        if data is None:
            return
        digest = hashlib.sha256(data).hexdigest()
        if self.sent.get(rel) != digest:
            self._fenced(rel, lambda **cond: objects.write_bytes(objects.join(self.url, rel), data, **cond))
            self.sent[rel] = digest

    def _put_file(self, rel: str, path: Path) -> None:
        self._fenced(rel, lambda **cond: objects.put_file(objects.join(self.url, rel), path, **cond))

    def _fenced(self, rel: str, write) -> None:
        """write(**condition) conditioned on the object as this holder last saw it (module docstring)."""
        for attempt in range(2):
            if self.lease is not None:
                self.lease.check()
            seen = self.owned.get(rel)
            try:
                self.owned[rel] = write(**({"if_match": seen} if seen else {"if_none_match": True}))
                return
            except Exception as e:  # noqa: BLE001 - botocore's ClientError, sorted below
                if not (objects.is_precondition_failure(e) or objects.is_not_found(e)):
                    raise
            if self.lease is None or attempt:
                raise LeaseLost(f"{objects.join(self.url, rel)} changed under this writer; not overwriting it")
            self.lease.confirm()  # LeaseLost unless the lease is still this holder's
            current = objects.head(objects.join(self.url, rel), fast=True)  # left by a fenced-out holder
            if current is None:
                self.owned.pop(rel, None)
            else:
                self.owned[rel] = current

    def _delete(self, rel: str) -> None:
        etag = self.owned.pop(rel)
        if self.lease is not None:
            self.lease.confirm()
        try:
            objects.delete(objects.join(self.url, rel), if_match=etag, fast=self.lease is not None)
        except Exception as e:  # noqa: BLE001
            if not (objects.is_precondition_failure(e) or objects.is_not_found(e)):
                raise  # changed since (not this holder's any more) or gone: left as it is


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lease_url(sweep_url: str, run_id: str) -> str:
    return objects.join(objects.parent(sweep_url), LEASES, f"{run_id}.json")


@contextlib.contextmanager
def held_lease(sweep_url: str, run_id: str, wait_s: float | None, ttl_s: float = LEASE_TTL_S) -> Iterator[Lease]:
    """Take run_id's lease (waiting up to wait_s) and renew it every ttl_s/3 until the block ends.

    The renewals run in their own thread, so a long upload in the block never delays one. The
    caller checks `lease.lost` after the block (remote_run raises LeaseLost)."""
    lease = Lease(lease_url(sweep_url, run_id), ttl_s)
    lease.acquire(wait_s)
    stop_renew = threading.Event()
    renewer = threading.Thread(target=every, args=(ttl_s / 3, stop_renew, lease.renew), name=f"lease-{run_id}")
    renewer.daemon = True
    renewer.start()
    try:
        yield lease
    finally:
        stop_renew.set()
        renewer.join()
        lease.release()


@contextlib.contextmanager
def remote_run(
    sweep_url: str, run_id: str, wait_s: float | None, ttl_s: float = LEASE_TTL_S, *, run_url: str | None = None
) -> Iterator[Path]:
    """Hold run_id's lease and yield a local working copy of the run, synced to the store.

    run_url: where the run's objects are (default `<sweep>/runs/<run_id>`; a run another sweep of
    the root claimed lives in that sweep, scalelab.store.claims). The lease is the root's either way.

    Raises:
        LeaseLost: (on exit) the lease was taken over or lapsed while this holder trained; nothing
            of this holder's was uploaded after that.
    """
    stop_sync = threading.Event()
    # Renewals start before the pull and stop after the final upload (held_lease's block).
    with held_lease(sweep_url, run_id, wait_s, ttl_s) as lease:
        syncer, top, pulled = None, None, False
        try:
            remove_dead_copies(f"scalelab-run-{run_id}-")
            top = Path(tempfile.mkdtemp(prefix=f"scalelab-run-{run_id}-"))
            mirror = RunMirror(run_url or objects.join(sweep_url, "runs", run_id), top / run_id, lease=lease)
            mirror.pull()
            pulled = True
            syncer = threading.Thread(target=every, args=(ttl_s / 3, stop_sync, mirror.push), name=f"sync-{run_id}")
            syncer.daemon = True
            syncer.start()
            yield mirror.local
        finally:
            stop_sync.set()
            if syncer is not None:
                syncer.join()
            try:
                if pulled and not lease.lost.is_set():  # a copy pulled only in part is never pushed
                    final_push(mirror, lease)
                    mirror.push_folders()
            finally:
                if top is not None:
                    if Path.cwd().is_relative_to(top):  # the trial chdir'd into the copy; Ray reuses its actor
                        os.chdir(tempfile.gettempdir())
                    shutil.rmtree(top, ignore_errors=True)
    if lease.lost.is_set():
        raise LeaseLost(f"{lease.url}: taken over or lapsed while this trial trained; its uploads stopped")


def remove_dead_copies(prefix: str) -> None:
    """Node-local copies of this run left in the temp dir by an attempt killed before its clean-up
    (SIGKILL, a lost node that came back): the caller holds the run's lease, so none is live."""
    for old in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def final_push(mirror: RunMirror, lease, attempts: int = 4, *, checkpoints: bool = True) -> None:
    """The last upload, under renewals: retried while renewals are only failing (LeaseLapsing)."""
    for attempt in range(attempts):
        try:
            mirror.push(checkpoints=checkpoints)
            return
        except LeaseLapsing:
            if attempt == attempts - 1:
                raise
            time.sleep(lease.ttl_s / 6)


def every(period_s: float, stop: threading.Event, fn) -> None:
    """fn() every period_s until stop is set or the lease is lost; a failed call is retried next time."""
    while not stop.wait(period_s):
        try:
            fn()
        except LeaseLost:
            return
        except Exception:  # noqa: BLE001 - a network error or a lapsing lease: the next period tries again
            continue
