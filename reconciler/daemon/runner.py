"""kube-proxy's BoundedFrequencyRunner: when the daemon's sync function runs.

File events ask for a run; runs are coalesced, kept `minSyncPeriod` apart, and a timer
brings the next one after `fullSyncPeriod` (or `syncPeriod` after a failure).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from reconciler import logs


class SyncFailed(Exception):
    """A sync that failed; the runner retries after syncPeriod (already logged)."""


class Fatal(SyncFailed):
    """The daemon cannot go on (its network namespace is gone): it exits 1 (already logged)."""


class Runner:
    """kube-proxy's BoundedFrequencyRunner: `fn` runs when `run()` was called (coalesced)
    or its timer fires, never sooner than `min_interval` after the last run. The timer is
    `max_interval` after a run, `min(retry_interval, max_interval)` after a failed one;
    fn may return seconds to shorten it. `delay(now)` and `run_once()` are the whole logic.
    """

    def __init__(self, fn: Callable[[], float | None], min_interval: float, retry_interval: float,
                 max_interval: float, clock: Callable[[], float] = time.monotonic):
        self._fn = fn
        self._clock = clock
        self._cond = threading.Condition()  # an RLock: signal handlers may call run()/stop()
        self._pending = False
        self._stopped = False
        self._last_end: float | None = None
        self._timer: float | None = None
        self.runs = 0
        self.tick: Callable[[], None] = lambda: None  # called at each turn of loop() (the watchdog)
        self.set_intervals(min_interval, retry_interval, max_interval)

    def set_intervals(self, min_interval: float, retry_interval: float, max_interval: float) -> None:
        if max_interval < min_interval:
            raise ValueError(f"fullSyncPeriod ({max_interval}s) must not be shorter than minSyncPeriod ({min_interval}s)")
        with self._cond:
            self.min_interval, self.retry_interval, self.max_interval = min_interval, retry_interval, max_interval
            self._cond.notify_all()

    def run(self) -> None:
        """Ask for a run (non-blocking; coalesces with a pending one)."""
        with self._cond:
            self._pending = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def delay(self, now: float) -> float | None:
        """Seconds until the next run is due (<= 0: due now); None: nothing is scheduled."""
        due = None
        if self._pending:
            due = now
        if self._timer is not None:
            due = self._timer if due is None else min(due, self._timer)
        if due is None:
            return None
        if self._last_end is not None:
            due = max(due, self._last_end + self.min_interval)
        return due - now

    def run_once(self) -> bool:
        """Run fn now; schedule the timer. True when fn succeeded."""
        with self._cond:
            self._pending = False
            self._timer = None
        ok, hint = True, None
        try:
            hint = self._fn()
        except Exception as e:  # crash-protected like kube-proxy's runner
            ok = False
            if not isinstance(e, SyncFailed):
                logs.log.exception(f"sync crashed: {e}; retrying after syncPeriod")
        end = self._clock()
        with self._cond:
            self.runs += 1
            self._last_end = end
            wait = self.max_interval if ok else min(self.retry_interval, self.max_interval)
            if ok and hint is not None:
                wait = min(wait, max(hint, 0.0))
            self._timer = end + wait
        return ok

    def loop(self) -> None:
        """Run until stop(). Waits are bounded so signals and clock jumps are noticed."""
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    self.tick()
                    d = self.delay(self._clock())
                    if d is not None and d <= 0:
                        break
                    self._cond.wait(1.0 if d is None else min(d, 1.0))
            self.run_once()
