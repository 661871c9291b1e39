"""A multi-process run on object storage: each rank's node-local copy, its shard uploads, rank 0's records.

    view = LeaseView(lease_url, holder, generation, ttl_s)      # the trial holds the lease
    mirror = RankMirror(run_url, local_dir, view)
    mirror.pull(listing, records=rank == 0)                       # listing: rank 0's, broadcast
    shards = mirror.upload_shards(step, own_files)                # every rank, its own files
    mirror.publish(step, ckpt_dir, all_ranks_shards)              # rank 0, after every rank's succeeded

A run whose layout has N processes trains as a Ray Train group whose workers may sit on N nodes
with no shared file system. The trial (scalelab.sweeps.execution.execute) holds the run's lease
(scalelab.store.lease) and renews it for as long as its TorchTrainer runs, restarts included. Each
rank trains in a directory of its own node and reaches the store directly:

  - resume: rank 0 lists the run once; every rank downloads the complete checkpoints (manifest
    present) of that one listing, whole, so DCP loads (and reshards, at another world size) as it
    does from a local disk; rank 0 also downloads the records. select_resume_checkpoint picks by
    name, so every rank loads its own copy of the same step.
  - a checkpoint (scalelab.train.checkpoint.save_checkpoint): every rank uploads the files it wrote
    (its DCP shards `__<rank>_<i>.distcp`, `rng_rank<rank>.pt`); a collective tells every rank
    whether all uploads succeeded; only then does rank 0 upload the records, `.metadata`,
    train_state.json and, last, manifest.json. A step whose manifest the store already has is not
    uploaded again (a complete checkpoint is never rewritten: training is deterministic, so it
    holds the same state), unless it failed verification at this attempt's resume.
  - records (metrics, evals, status.json) are rank 0's alone, pushed every ttl/3, before each
    manifest and once at the end, as a one-process run's are (RunMirror, records only); rank 0
    also prunes superseded checkpoints (every rank's shard keys, whose ETags it gathered).

Fencing (why a worker of an older lease holder cannot overwrite or delete what a newer one wrote).
The ranks do not hold the lease; they fence with a LeaseView of it:
  1. Validity by this process's monotonic clock, never by comparing clocks: a read of the lease
     sent at local time t that shows the holder and generation the trial gave the ranks, renewed a
     (store clock) seconds ago, means no taker can take over before t + ttl - a - 1 s (a taker
     needs the store's clock to show more than ttl + 1 s since the renewal, and the store received
     the read after t). Every write and delete is made only while that is more than ttl/6 away
     (re-reading the lease when it gets closer), as Lease.check does for the holder itself.
  2. Every write is conditioned on the object as this writer saw it: shard objects are new keys
     (`If-None-Match: *`); a key that exists was left by an earlier attempt (a manifest-less
     checkpoint: an upload cut short, or a fenced-out holder's) and is overwritten only after the
     lease is read back as still this holder's, conditioned on the leftover's ETag (RunMirror's
     rule). A newer holder's object has another ETag, so that write fails and the rank stops
     (LeaseLost). Deletes are `If-Match` the ETag rank 0 uploaded, gathered or took over at its pull.
  3. The manifest is written last, by rank 0, after every rank's uploads succeeded; the manifest
     holds every file's sha256 and every load verifies it, so even a mix of two holders' shards
     (a write delayed past its lease's margin in the network) is never loaded: it is moved aside
     and the run resumes from the checkpoint before.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

from scalelab.store import objects
from scalelab.store.checkpoint_files import MANIFEST
from scalelab.store.lease import CLOCK_SLACK_S, NOT_SYNCED, Lease, LeaseLapsing, LeaseLost, RunMirror, _read


class LeaseView:
    """The run's lease as a rank of its holder's run sees it: check() and confirm() as Lease's."""

    def __init__(self, url: str, holder: str, generation: int, ttl_s: float):
        self.url, self.holder, self.generation, self.ttl_s = url, holder, int(generation), float(ttl_s)
        self.lost = threading.Event()
        self._valid_until = 0.0  # monotonic: no taker can have taken the lease before this

    def _read(self) -> None:
        sent = time.monotonic()
        cur = Lease(self.url, self.ttl_s).current()
        if cur is None or cur.get("holder") != self.holder or int(cur.get("generation") or 0) != self.generation:
            self.lost.set()
            raise LeaseLost(f"{self.url}: held by {(cur or {}).get('holder')} now, not this run's trial; not writing")
        age = float(cur["age_s"]) if cur.get("age_s") is not None else 0.0  # no Date: never taken over early
        self._valid_until = max(self._valid_until, sent + self.ttl_s - age - CLOCK_SLACK_S)

    def remaining_s(self) -> float:
        return 0.0 if self.lost.is_set() else self._valid_until - time.monotonic()

    def check(self) -> None:
        """Before a write: LeaseLost if the lease is another's or lapsed, LeaseLapsing if it is
        valid for less than ttl/6 more (the holder's renewals failing); either way nothing is written."""
        if self.lost.is_set():
            raise LeaseLost(f"{self.url}: lease lost; this rank stops writing")
        if self.remaining_s() < self.ttl_s / 6:
            self._read()
        left = self.remaining_s()
        if left <= 0:
            self.lost.set()
            raise LeaseLost(f"{self.url}: not renewed for {self.ttl_s:g} s by the store's clock; not writing")
        if left < self.ttl_s / 6:
            raise LeaseLapsing(f"{self.url}: lease valid for {left:.1f} s only (renewals failing); not writing now")

    def confirm(self) -> None:
        """Read the lease back: LeaseLost (and lost for good) unless it is still this run's holder's."""
        self.check()
        self._read()


class RankMirror(RunMirror):
    """One rank's node-local copy of a multi-process run and its uploads (module docstring)."""

    def records(self) -> None:
        """Rank 0: upload the records and status.json now (the step watchdog's hang record, before
        it ends the process); superseded checkpoints are pruned as in every push."""
        self.push(checkpoints=False)

    def published(self, step: int) -> bool:
        """Rank 0, before any rank uploads checkpoint `step`: whether the store holds it complete
        (its manifest). Leftovers of `step` taken over at the pull are no longer this holder's to
        prune: the ranks are about to overwrite them, possibly with the same bytes (same ETag),
        and a prune between their upload and the manifest would delete a live shard."""
        with self.lock:
            for key in [k for k in self.owned if k.startswith(f"checkpoints/step_{step}/")]:
                del self.owned[key]
            if any((self.local / "checkpoints").glob(f"step_{step}.corrupt*")):
                return False  # in the store but it did not verify at this attempt's resume: saved again
            return objects.head(objects.join(self.url, "checkpoints", f"step_{step}", MANIFEST)) is not None

    def upload_shards(self, step: int, files: list[Path]) -> dict[str, str]:
        """Upload the files this rank wrote into checkpoint `step`; {key: ETag} of each."""
        with self.lock:
            done = {}
            for f in files:
                rel = f"checkpoints/step_{step}/{f.name}"
                self._put_file(rel, f)
                # not owned until the checkpoint is complete: a push in between must not prune it
                done[rel] = self.owned.pop(rel)
            return done

    def publish(self, step: int, ckpt: Path, shards: dict[str, str]) -> None:
        """Rank 0, once every rank's shards are up: records, then the rest of `ckpt`, manifest last,
        then status.json (this attempt's loaded step and layout: a retry after a node loss counts it)."""
        with self.lock:
            self.owned.update(shards)
            status = _read(self.local / "status.json")
            for f in sorted(self.local.iterdir()):
                if f.is_file() and f.name not in NOT_SYNCED and not f.name.endswith(".tmp"):
                    self._put(f.name, f.read_bytes())
            where = f"checkpoints/{ckpt.name}"
            rest = sorted(p for p in ckpt.iterdir() if p.is_file() and f"{where}/{p.name}" not in shards)
            for f in [p for p in rest if p.name != MANIFEST] + [ckpt / MANIFEST]:  # the manifest last
                self._put_file(f"{where}/{f.name}", f)
            self.sent[where] = hashlib.sha256((ckpt / MANIFEST).read_bytes()).hexdigest()
            self._put("status.json", status)
