"""Step watchdog: ends a process whose training step has run far longer than its median (a stuck collective).

    policy = HangPolicy(factor=10.0, min_s=60.0)
    with StepWatchdog(policy, run_dir, rank=0) as wd:
        for step in steps:
            wd.step_begin(step)
            train_step()
            wd.step_end()

A rank blocked in a collective whose peer hangs cannot be interrupted from Python (it waits inside
gloo/NCCL, whose own timeout is many minutes), so the watchdog thread ends the process with
`os._exit(HANG_EXIT_CODE)`, as NCCL's watchdog does: the launcher (Ray Train, Tune) sees a dead
worker and the retry resumes from the run's latest checkpoint. Rank 0 first records the hang in
status.json (status failed with the reason; `hangs` keeps one entry per hang). Every rank runs one, so
whichever rank hangs, its peers blocked in the next collective end too.

The limit is max(factor x the median of this session's completed steps, min_s), armed once min_steps
steps are done (the first steps include warm-up work). Only the step is timed: evaluation and
checkpoint writes, which can take far longer than a step, are not.

Test hook: SCALELAB_TEST_HANG="STEP:RANK:MARKER" makes rank RANK sleep inside step STEP until killed,
once (MARKER is created, so the retry does not hang again). Unset in normal use.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalelab.store.records import read_status, write_status

HANG_EXIT_CODE = 75  # EX_TEMPFAIL: the run is retryable
# Other ranks wait this long before exiting: rank 0, blocked in the same step's collective, fires
# within a poll of them and records the hang; had a peer exited first, rank 0's collective would fail
# with a peer error instead and no record of the hang would be written.
PEER_EXIT_GRACE_S = 5.0
_HANG_ENV = "SCALELAB_TEST_HANG"


@dataclass(kw_only=True, slots=True)
class HangPolicy:
    factor: float  # a step running longer than factor x the median step is a hang
    min_s: float = 60.0  # never call a step a hang before this many seconds (noisy, shared machines)
    min_steps: int = 3  # steps completed in this session before the watchdog arms

    def limit_s(self, median_s: float) -> float:
        return max(self.factor * median_s, self.min_s)


class StepWatchdog:
    """Times each step of this rank; past the policy's limit, records the hang and ends the process."""

    def __init__(
        self,
        policy: HangPolicy | None,
        run_dir: str | Path,
        *,
        rank: int,
        poll_s: float = 0.1,
        after_record: Callable[[], None] | None = None,
    ):
        self.policy, self.run_dir, self.rank, self.poll_s = policy, Path(run_dir), rank, poll_s
        # rank 0, after the hang is in status.json and before the process ends: e.g. upload it
        # (a multi-process run on object storage, whose run_dir is a node-local copy)
        self.after_record = after_record
        self.durations: list[float] = []
        self._step: int | None = None
        self._began = 0.0
        self._lock = threading.Lock()
        self._fired = False  # set (under the lock) when a hang is being recorded: the step may not end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inject = _injected_hang(rank)

    def __enter__(self) -> StepWatchdog:
        if self.policy is not None and self.policy.factor > 0:
            self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def step_begin(self, step: int) -> None:
        with self._lock:
            self._step, self._began = step, time.monotonic()
        if self._inject is not None:
            self._inject(step)

    def step_end(self) -> None:
        with self._lock:
            fired = self._fired
            if not fired:
                self.durations.append(time.monotonic() - self._began)
                self._step = None
        while fired:  # the watchdog is recording this step's hang and ends the process
            time.sleep(1.0)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                if self._step is None or len(self.durations) < self.policy.min_steps:
                    continue
                median_s = statistics.median(self.durations)
                elapsed_s = time.monotonic() - self._began
                step = self._step
            limit_s = self.policy.limit_s(median_s)
            if elapsed_s > limit_s:
                self._fire(step, elapsed_s, median_s, limit_s)

    def _fire(self, step: int, elapsed_s: float, median_s: float, limit_s: float) -> None:
        # The step judged a hang may have ended since (and the run gone on to write its final
        # status): fire only if it is still running, and keep it from ending while the hang is
        # recorded, so the hang record and the final status never overwrite each other.
        with self._lock:
            if self._step != step or self._fired:
                return
            self._fired = True
        reason = (
            f"StepHang: step {step} on rank {self.rank} ran {elapsed_s:.1f} s > {limit_s:.1f} s "
            f"(max({self.policy.factor:g} x median {median_s:.3f} s, {self.policy.min_s:g} s))"
        )
        print(f"watchdog: {reason}; ending this process so the run is retried", file=sys.stderr, flush=True)
        if self.rank == 0:
            hangs = (read_status(self.run_dir) or {}).get("hangs") or []
            hang = dict(step=step, rank=self.rank, elapsed_s=elapsed_s, median_s=median_s, at=time.time())
            write_status(self.run_dir, "failed", error=reason, hangs=hangs + [hang])
            if self.after_record is not None:
                try:
                    self.after_record()
                except Exception as e:  # noqa: BLE001 - the process ends either way; say why the record is missing
                    print(f"watchdog: the hang record was not uploaded ({type(e).__name__}: {e})", file=sys.stderr)
        else:
            time.sleep(PEER_EXIT_GRACE_S)
        os._exit(HANG_EXIT_CODE)


def _injected_hang(rank: int):
    spec = os.environ.get(_HANG_ENV)
    if not spec:
        return None
    step_s, rank_s, marker_s = spec.split(":", 2)
    hang_step, hang_rank, marker = int(step_s), int(rank_s), Path(marker_s)
    if rank != hang_rank:
        return None

    def hang(step: int) -> None:
        if step == hang_step and not marker.exists():
            marker.write_text(str(step))
            while True:  # a rank stuck for good (its peers block in the step's next collective)
                time.sleep(1.0)

    return hang
