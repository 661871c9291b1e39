"""The two clocks a training run is timed on: wall seconds, and the process's CPU seconds."""

from __future__ import annotations

import time


class TrainClock:
    """The seconds a run spent training: `train_s` (wall) and, for a run trained in this process,
    `train_cpu_s` (CPU seconds over the same interval); a sweep trial's `end`/`fail` event records
    both, `scalelab run` prints them.

    CPU time is the whole process's (time.process_time: user + system of every thread), not the
    calling thread's (RUSAGE_THREAD): Tune runs a function trainable in a thread of its own, and
    torch's intra-op pool (`train.num_threads` > 1) does the run's work in further threads that a
    per-thread clock would miss. The Ray worker holds one trial at a time (reused actors run them
    one after another), so what else the process counts is Ray's own threads in it, small beside
    training. A multi-process run trains in its Ray Train workers, other processes: this process
    only waits for them, and its CPU time would say nothing about theirs, so it is left out.
    Wall time is what the run took on the machine as it was loaded; CPU time is about what it would
    take alone on an idle core (the CPU plan's rate is fitted on it, scalelab.planning.cluster)."""

    def __init__(self, *, in_process: bool):
        self.in_process = in_process
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def seconds(self) -> dict[str, float]:
        out = {"train_s": time.perf_counter() - self.wall0}
        if self.in_process:
            out["train_cpu_s"] = time.process_time() - self.cpu0
        return out
