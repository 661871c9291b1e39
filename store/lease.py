"""The run lease on object storage, and the node-local working copy of a run trained into it.

    with remote_run("s3://lab/sweeps/iso", run_id, wait_s=180) as run_dir:
        train_run(cfg, run_dir, resume=True)      # run_dir: a local directory, synced to the store

A local store serialises the trainers of a run with an fcntl lock (scalelab.store.run_lock).
Object storage has no locks, so a run there is guarded by a *lease*: the object
`<store root>/.leases/<run_id>.json` = {holder, expires_at}. It is taken with a conditional put
(`If-None-Match: *`: of two takers exactly one succeeds), renewed every ttl_s/3 by a thread with
`If-Match: <its ETag>` (so a holder that lost it finds out instead of overwriting the new one),
and a lease past its expiry is taken over with `If-Match` on the stale ETag: a dead holder's run
is resumed by the next trial once `ttl_s` has passed. Expiry is the holder's wall clock; nodes
are assumed to agree within a small fraction of ttl_s (NTP).

The run is trained in a local directory (the files the training loop, DCP and the restricted
checkpoint reader expect) that starts as a copy of the run's objects, checkpoints included
(scalelab.store.checkpoint_files.pull_checkpoints takes only complete ones). A second thread uploads what
changed every ttl_s/3 and once more at the end, in the order that keeps the store consistent at
every instant: the records, then the checkpoints they cover (manifest last), then status.json.
A holder whose lease was taken stops uploading (fencing by silence) and its trial fails, so Tune
retries it behind the new holder.
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
from scalelab.store.checkpoint_files import list_checkpoints, pull_checkpoints, upload_checkpoint

LEASE_TTL_S = 30.0  # a dead holder's run is taken over this long after its last heartbeat
LEASES = ".leases"
NOT_SYNCED = ("status.json", ".lock")  # status.json is uploaded last, on its own; .lock is local


class LeaseLost(RuntimeError):
    """Another holder took the lease (this one missed its renewals for ttl_s)."""


class Lease:
    """One holder's lease on an object (see the module docstring)."""

    def __init__(self, url: str, ttl_s: float = LEASE_TTL_S, holder: str | None = None):
        self.url, self.ttl_s = url, ttl_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.etag: str | None = None
        self.lost = threading.Event()

    def _body(self) -> bytes:
        now = time.time()
        return json.dumps({"holder": self.holder, "renewed_at": now, "expires_at": now + self.ttl_s}).encode()

    def current(self) -> dict | None:
        got = objects.read(self.url)
        if got is None:
            return None
        try:
            return dict(json.loads(got[0]), etag=got[1])
        except (json.JSONDecodeError, TypeError):
            return {"holder": "?", "expires_at": 0.0, "etag": got[1]}  # unreadable: treat as expired

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it or its holder's expiry has passed; True on success."""
        try:
            self.etag = objects.write_bytes(self.url, self._body(), if_none_match=True)
            return True
        except Exception as e:  # noqa: BLE001 - botocore's ClientError, sorted by is_precondition_failure
            if not objects.is_precondition_failure(e):
                raise
        cur = self.current()
        if cur is None or cur["expires_at"] > time.time():
            return False  # held (or released just now: the next try takes it)
        try:
            self.etag = objects.write_bytes(self.url, self._body(), if_match=cur["etag"])
            return True
        except Exception as e:  # noqa: BLE001
            if objects.is_precondition_failure(e):
                return False  # another taker was faster
            raise

    def acquire(self, wait_s: float | None) -> None:
        """Take the lease, waiting up to wait_s (None: as long as a live holder renews it)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while not self.try_acquire():
            if deadline is not None and time.monotonic() > deadline:
                cur = self.current() or {}
                raise RuntimeError(
                    f"{self.url} is leased by {cur.get('holder')} (expires in "
                    f"{cur.get('expires_at', 0) - time.time():.0f} s); waited {wait_s:.0f} s"
                )
            time.sleep(min(1.0, self.ttl_s / 4))

    def renew(self) -> None:
        """Extend the lease; LeaseLost if another holder has it now."""
        try:
            self.etag = objects.write_bytes(self.url, self._body(), if_match=self.etag)
        except Exception as e:  # noqa: BLE001
            if objects.is_precondition_failure(e):
                self.lost.set()
                raise LeaseLost(f"{self.url}: lease taken by {(self.current() or {}).get('holder')}") from None
            raise

    def release(self) -> None:
        if self.etag is None or self.lost.is_set():
            return
        try:
            objects.delete(self.url, if_match=self.etag)
        except Exception as e:  # noqa: BLE001
            if not objects.is_precondition_failure(e):
                raise


class RunMirror:
    """A run's objects mirrored in a local directory: pull once, push what changed (ordered)."""

    def __init__(self, url: str, local: Path, fence: threading.Event | None = None):
        self.url, self.local = url, local
        self.fence = fence  # set when the lease is lost: from then on nothing is written
        self.sent: dict[str, str] = {}  # file name -> sha256 of what the store holds

    def _check_fence(self) -> None:
        if self.fence is not None and self.fence.is_set():
            raise LeaseLost(f"{self.url}: lease lost; uploads stopped")

    def pull(self) -> None:
        self.local.mkdir(parents=True, exist_ok=True)
        for rel, meta in objects.list_objects(self.url).items():
            if "/" not in rel:
                objects.download(objects.join(self.url, rel), self.local / rel, meta["mtime"])
                self.sent[rel] = _sha(self.local / rel)
        (self.local / "checkpoints").mkdir(exist_ok=True)
        for name in pull_checkpoints(objects.join(self.url, "checkpoints"), self.local / "checkpoints"):
            self.sent[f"checkpoints/{name}"] = _sha(self.local / "checkpoints" / name / "manifest.json")

    def push(self) -> None:
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
            manifest = _read(path / "manifest.json")
            if manifest is None or self.sent.get(rel) == hashlib.sha256(manifest).hexdigest():
                continue
            self._check_fence()
            try:
                upload_checkpoint(path, objects.join(self.url, rel))
            except FileNotFoundError:
                continue  # pruned by keep_last while uploading: its objects go below
            self.sent[rel] = hashlib.sha256(manifest).hexdigest()
        ckpt_url = objects.join(self.url, "checkpoints")
        remote = objects.list_objects(ckpt_url)
        for rel in remote:  # pruned checkpoints, and uploads cut short, once newer ones are up
            if rel.partition("/")[0] not in kept:
                self._check_fence()
                objects.delete(objects.join(ckpt_url, rel))
        self._put("status.json", status)

    def _put(self, rel: str, data: bytes | None) -> None:
        if data is None:
            return
        digest = hashlib.sha256(data).hexdigest()
        if self.sent.get(rel) != digest:
            self._check_fence()
            objects.write_bytes(objects.join(self.url, rel), data)
            self.sent[rel] = digest


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
def remote_run(sweep_url: str, run_id: str, wait_s: float | None, ttl_s: float = LEASE_TTL_S) -> Iterator[Path]:
    """Hold run_id's lease and yield a local working copy of the run, synced to the store.

    Raises:
        LeaseLost: (on exit) the lease was taken over while this holder trained; nothing of this
            holder's was uploaded after that.
    """
    lease = Lease(lease_url(sweep_url, run_id), ttl_s)
    lease.acquire(wait_s)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    top, pulled = None, False
    try:
        top = Path(tempfile.mkdtemp(prefix=f"scalelab-run-{run_id}-"))
        mirror = RunMirror(objects.join(sweep_url, "runs", run_id), top / run_id, fence=lease.lost)
        mirror.pull()
        pulled = True
        # Renewing and uploading run apart: a long checkpoint upload never delays a renewal.
        threads = [
            threading.Thread(target=_every, args=(ttl_s / 3, stop, lease.renew), name=f"lease-{run_id}", daemon=True),
            threading.Thread(target=_every, args=(ttl_s / 3, stop, mirror.push), name=f"sync-{run_id}", daemon=True),
        ]
        for t in threads:
            t.start()
        yield mirror.local
    finally:
        stop.set()
        for t in threads:
            t.join()
        try:
            if pulled and not lease.lost.is_set():  # a copy pulled only in part is never pushed
                lease.renew()  # the final upload happens under a lease that is still ours
                mirror.push()
        finally:
            lease.release()
            if top is not None:
                if Path.cwd().is_relative_to(top):  # the trial chdir'd into the copy; Ray reuses its actor
                    os.chdir(tempfile.gettempdir())
                shutil.rmtree(top, ignore_errors=True)
    if lease.lost.is_set():
        raise LeaseLost(f"{lease.url}: taken by another holder while this trial trained; its uploads stopped")


def _every(period_s: float, stop: threading.Event, fn) -> None:
    """fn() every period_s until stop is set or the lease is lost; a failed call is retried next time."""
    while not stop.wait(period_s):
        try:
            fn()
        except LeaseLost:
            return
        except Exception:  # noqa: BLE001 - a network error: the next period tries again
            continue
