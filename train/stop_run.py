"""StopRun: the exception a training callback raises to end its run early (torch-free, so that a
spec's early-stopping rule, scalelab.sweeps.tracking.early_stop, can raise it without importing the loop)."""

from __future__ import annotations

from typing import Any


class StopRun(Exception):
    """Raised by a callback to end the run where it is, recorded as `status` with `record`'s fields
    (e.g. sweeps/tracking/early_stop.py at a "checkpoint" event: records flushed, the checkpoint on disk)."""

    def __init__(self, status: str, record: dict[str, Any]):
        super().__init__(status)
        self.status, self.record = status, record
