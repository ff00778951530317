"""State-store writes off the sync path.

Recording an applied revision encodes the whole ruleset, which takes long for a big
one, so the daemon commits, appends its small commit record (engine/commits.py), logs
its sync line and hands the heavy write to this thread. It runs writes in order once the
daemon was idle for IDLE seconds or as long as the last write took (with the GIL, a
write during a sync slows it), or a write waited MAX_DELAY; flush() writes now. A crash
before a write leaves status and history behind the kernel, never ahead: the commit
record names what the kernel holds, and the next start keeps its ruleset from a listing.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from reconciler import logs

IDLE = 1.0  # seconds without a sync or a file event before queued writes run
MAX_DELAY = 30.0  # ... unless the oldest one has waited this long (revisions back to back)


class StateWriter:
    """One thread running submitted writes in order (module doc)."""

    def __init__(self, *, idle: float = IDLE, max_delay: float = MAX_DELAY,
                 after_write: Callable[[], object] | None = None) -> None:
        self.idle, self.max_delay = idle, max_delay
        self.after_write = after_write  # e.g. reconcile.trim_heap: a write frees the ruleset's JSON
        self._cond = threading.Condition()
        self._queue: list[tuple[str | None, Callable[[], object]]] = []
        self._busy = False
        self._closed = False
        self._flushing = 0
        self._active = time.monotonic()  # the last sync's start or end
        self._oldest: float | None = None  # when the oldest queued write was submitted
        self._cost = 0.0  # how long the last write took: a write waits for that much idle time
        self.dropped = 0  # superseded writes (for tests)
        self._thread = threading.Thread(target=self._loop, name="nftrec-state", daemon=True)
        self._thread.start()

    def submit(self, write: Callable[[], object], *, supersedes: str | None = None) -> None:
        """Queue `write`. A queued write with the same `supersedes` tag that has not
        started yet is dropped (only the newest applied revision needs recording)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the state writer is closed")
            if supersedes is not None:
                before = len(self._queue)
                self._queue = [q for q in self._queue if q[0] != supersedes]
                self.dropped += before - len(self._queue)
            self._queue.append((supersedes, write))
            if self._oldest is None:
                self._oldest = time.monotonic()
            self._cond.notify_all()

    def active(self) -> None:
        """A sync starts or ends, or a file event came (a sync follows it): queued writes
        wait until the daemon is idle again. Any thread."""
        with self._cond:
            self._active = time.monotonic()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted write ran; False on timeout."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)
            finally:
                self._flushing -= 1

    def close(self, timeout: float = 60.0) -> None:
        """Run what is queued (a stop records the last revision), then end the thread."""
        if not self.flush(timeout):
            logs.log.warning(f"state writes still running after {timeout:g}s at exit; `nftrec status` may be stale")
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)

    def _due(self) -> float:
        """Seconds until the queued writes may run (<= 0: now)."""
        if self._flushing or self._closed:
            return 0.0
        now = time.monotonic()
        # Idle for as long as a write takes: revisions that came faster than that are
        # likely to come again while it runs.
        quiet = max(self.idle, self._cost)
        return min(self._active + quiet, (self._oldest or now) + self.max_delay) - now

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                while (wait := self._due()) > 0:
                    self._cond.wait(wait)
                _, write = self._queue.pop(0)
                if not self._queue:
                    self._oldest = None
                self._busy = True
            began = time.monotonic()
            try:
                try:
                    write()
                finally:
                    # the write's closure holds the revision it records: dropped now, not
                    # when the next write comes, so after_write can free it
                    write = None
                if self.after_write is not None:
                    self.after_write()
            except Exception as e:  # the write functions log their own errors; never kill the thread
                logs.log.exception(f"state write crashed: {e}")
            finally:
                with self._cond:
                    self._cost = time.monotonic() - began
                    self._busy = False
                    self._cond.notify_all()
