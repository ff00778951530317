"""The durable queue of status records and the thread that pushes it. `put` writes one
file per record (atomic, fsynced) and returns: no git, no network. The pusher sends the
queue in order (one push per node for everything queued), with exponential backoff and
jitter while the remote fails, and deletes what it sent. Consecutive records that differ
only in their time are coalesced into the latest, so a node that repeats one outcome
while its remote is down queues one record, and every outcome's latest state is kept.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import itertools
import json
import os
import random
import re
import threading
import time
from pathlib import Path

from reconciler.atomic import atomic_write
from reconciler.engine.statusgit import GIT_TIMEOUT, Repo, StatusGitError, push, shown
from reconciler.logs import log

MAX_QUEUED = 1000  # records kept while the remote is down, after coalescing (module doc)
_NAME = re.compile(r"([0-9]{20})-([0-9]+)\.json")


class Queue:
    """Records (canonical JSON, as record_json writes them) waiting in `directory`, and
    the pusher thread that sends them to `remote`."""

    def __init__(self, directory: Path, remote: str, ssh_key: str | None, *, backoff: tuple[float, float]):
        self.directory = Path(directory)
        self.remote = remote
        self.ssh_key = ssh_key
        self.backoff = backoff
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._repo: Repo | None = None

    # --- the caller's side: never blocks on the network -----------------------------------

    def put(self, raw: bytes) -> None:
        """Write `raw` as the newest queued record and wake the pusher. An unwritable state
        directory is logged, not raised: a status record never fails a sync."""
        try:
            with self._lock:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._seq = max(self._seq, *(int(m.group(1)) for m in self._listed()), 0) + 1
                atomic_write(self.directory / f"{self._seq:020d}-{os.getpid()}.json", raw, 0o600)
        except OSError as e:
            log.error("status record not queued: cannot write %s (%s)", self.directory, e.strerror or e)
            return
        self._wake.set()

    def pending(self) -> int:
        return len(self._listed())

    def send_all(self, timeout: float) -> bool:
        """send_once until the queue is empty, all within `timeout` seconds: whether it is.
        A push that fails ends the attempt (its error in last_error); no retry, no thread."""
        deadline = time.monotonic() + timeout
        try:
            while self.send_once(max(0.0, deadline - time.monotonic())):
                pass
        except StatusGitError as e:
            self.last_error = str(e)
        return not self.pending()

    def _listed(self) -> list[re.Match]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted((m for m in map(_NAME.fullmatch, names) if m), key=lambda m: (int(m.group(1)), m.group(0)))

    # --- the pusher ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="nftrec-status", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the pusher (a running git is killed); what is queued stays queued."""
        self._stopping.set()
        self._wake.set()
        repo = self._repo
        if repo is not None:
            repo.cancel()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                sent = self.send_once()
            except StatusGitError as e:
                if self._stopping.is_set():
                    break
                failures += 1
                if self.last_error != str(e):
                    log.warning("status records for %s not pushed (kept queued, retrying): %s", shown(self.remote), e)
                self.last_error = str(e)
                low, high = self.backoff
                delay = min(high, low * 2 ** min(failures - 1, 30))
                self._stopping.wait(random.uniform(delay / 2, delay))
                continue
            except Exception as e:  # a bug must not kill the pusher: it retries, slowly
                log.error("status pusher: %s: %s", type(e).__name__, e)
                self._stopping.wait(self.backoff[1])
                continue
            failures = 0
            if sent is None:  # another process pushes this queue: look again soon
                self._stopping.wait(self.backoff[0])
            elif not sent:
                self._wake.wait()

    def send_once(self, timeout: float = GIT_TIMEOUT) -> int | None:
        """Coalesce the queue, push it (`timeout`: seconds for all its git commands), delete
        what was pushed: the number of records pushed (0: nothing queued; None: another
        process is pushing it). StatusGitError."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._push_lock() as locked:
            if not locked:
                return None
            batch = self._coalesced()
            if not batch:
                return 0
            node = batch[0][1]["node"]
            run = list(itertools.takewhile(lambda item: item[1]["node"] == node, batch))
            repo = Repo(self.remote, self.ssh_key, timeout)
            self._repo = repo
            try:
                if self._stopping.is_set():
                    raise StatusGitError("stopped")
                push(repo, node, [(raw, int(doc["time_unix"]), f"{doc['outcome']} {doc['attempted'] or '-'}")
                                  for _, doc, raw in run])
            finally:
                self._repo = None
                repo.close()
            for path, _, _ in run:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self.last_error = None
            return len(run)

    @contextlib.contextmanager
    def _push_lock(self):
        """One pusher per queue, across processes (a one-shot run beside the watch)."""
        fd = os.open(self.directory / ".push.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)  # now: a git forked meanwhile holds a copy of fd until it execs
        finally:
            os.close(fd)

    def _coalesced(self) -> list[tuple[Path, dict, bytes]]:
        """The queue, oldest first, as (file, its JSON, its bytes), after deleting every
        record that the next one repeats but for its time, and, past MAX_QUEUED, the
        oldest of those whose outcome has a later record. A file that is not a record is
        deleted (atomic writes make that a bug, never a crash)."""
        kept: list[tuple[Path, dict, bytes]] = []
        for m in self._listed():
            path = self.directory / m.group(0)
            try:
                raw = path.read_bytes()
                doc = json.loads(raw)
                doc["time_unix"] = _unix(doc["time"])
                same = {k: v for k, v in doc.items() if k not in ("time", "time_unix")}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                log.error("status queue: %s is not a status record (%s); deleted", path, e)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if kept and {k: v for k, v in kept[-1][1].items() if k not in ("time", "time_unix")} == same:
                with contextlib.suppress(OSError):
                    kept[-1][0].unlink()
                kept.pop()
            kept.append((path, doc, raw))
        while len(kept) > MAX_QUEUED:
            last = {d["outcome"]: i for i, (_, d, _) in enumerate(kept)}
            drop = next(i for i, (_, d, _) in enumerate(kept) if last[d["outcome"]] > i)
            log.warning("status queue: over %d records; the %s record of %s dropped", MAX_QUEUED,
                        kept[drop][1]["outcome"], kept[drop][1]["time"])
            with contextlib.suppress(OSError):
                kept[drop][0].unlink()
            del kept[drop]
        return kept


def _unix(text: str) -> int:
    """Whole Unix seconds of an RFC 3339 UTC time as record_json writes it (the commit's date)."""
    return calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
