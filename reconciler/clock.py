"""The one clock of rollout decisions, holds and status records: wall time (Unix seconds).
Tests set it in-process (`set_clock`) or, for a daemon they start, with the environment
variable NFTREC_CLOCK_OFFSET (seconds added to the wall time), so a scenario runs waves
of a few seconds without sleeping through real intervals.
"""

from __future__ import annotations

import os
import time
from typing import Callable

_clock: Callable[[], float] | None = None


def now() -> float:
    if _clock is not None:
        return _clock()
    offset = os.environ.get("NFTREC_CLOCK_OFFSET")
    return time.time() + (float(offset) if offset else 0.0)


def set_clock(fn: Callable[[], float] | None) -> None:
    """Tests: make `now()` return fn(); None restores the wall clock."""
    global _clock
    _clock = fn
