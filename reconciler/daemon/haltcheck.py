"""The halt's read of the earlier waves' status records, off the sync thread: a remote
that is slow or hangs (fetch_records waits up to its timeout) must not delay syncs and
repairs of the applied revision. `HaltCheck` is watch's Gate.fetch: until the first
answer for the held revision is known it says so (the revision stays held), and each
answer wakes the sync loop; later calls re-read in the background, the last answer
standing. `stop` kills a read under way (its git would outlive the daemon on a hung remote).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from reconciler import logs
from reconciler.engine import fetch_records, shown

READ_TIMEOUT = 30.0  # seconds for one read of the records (every git process of it)
REREAD = 1.0  # seconds: an answer younger than this is used without reading again


class HaltCheck:
    """Gate.fetch for watch (module doc): `()` returns (records, error or None), or a
    string (the reason the revision is held) while the first answer is not known.
    `settings()`: the node config's `status` (read at each read, so SIGHUP counts);
    `wake()`: asks the runner for a sync when an answer arrives (any thread)."""

    def __init__(self, settings: Callable[[], object], wake: Callable[[], None], timeout: float = READ_TIMEOUT):
        self.settings, self.wake, self.timeout = settings, wake, timeout
        self._lock = threading.Lock()
        self._answer: tuple | None = None
        self._at = 0.0  # time.monotonic() of the answer
        self._generation = 0  # reset() drops the answer of a read under way
        self._reading = False
        self._repos: set = set()  # the reads' statusgit.Repo, for stop()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    def reset(self) -> None:
        """A new revision is held: its decision waits for a read that starts after now."""
        with self._lock:
            self._generation += 1
            self._answer, self._reading = None, False

    def __call__(self) -> tuple | str:
        settings = self.settings()
        with self._lock:
            if not self._reading and not self._stopped and (
                    self._answer is None or time.monotonic() - self._at >= REREAD):
                self._reading = True
                thread = threading.Thread(target=self._read, args=(settings, self._generation),
                                          name="nftrec-halt-check", daemon=True)
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                thread.start()
            if self._answer is not None:
                return self._answer
        return f"held: halt check: reading the earlier waves' records from {shown(settings.remote)}"

    def _read(self, settings, generation: int) -> None:
        repos = []

        def started(repo) -> None:
            with self._lock:
                repos.append(repo)
                self._repos.add(repo)
                if self._stopped:
                    repo.cancel()

        try:
            answer = fetch_records(settings.remote, settings.ssh_key, timeout=self.timeout, started=started)
        except Exception as e:  # never the thread's end without an answer: the revision would stay held
            answer = (), f"cannot read the status records: {type(e).__name__}: {e}"
        with self._lock:
            self._repos.difference_update(repos)
            if generation != self._generation or self._stopped:
                return
            self._answer, self._at, self._reading = answer, time.monotonic(), False
        logs.log.debug(f"halt check: {len(answer[0])} status record(s) read" +
                       (f" ({answer[1]})" if answer[1] else ""))
        self.wake()

    def stop(self, timeout: float = 2.0) -> None:
        """The daemon stops: the reads under way are killed (their git and temporary repository)."""
        with self._lock:
            self._stopped = True
            repos, threads = list(self._repos), list(self._threads)
        for repo in repos:
            repo.cancel()
        for thread in threads:
            thread.join(timeout)
