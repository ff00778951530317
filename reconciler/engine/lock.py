"""One nftrec at a time per state directory and network namespace: `flock(2)` on
`<root>/<netns>/lock`; its contents (pid, cmdline, started) only name the holder. The
kernel drops a flock when its holder's last descriptor closes, so a dead process never
leaves a stale lock, and the file is never deleted (a waiter would lock another inode).
Files are opened close-on-exec, so `nft` children never inherit the lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from reconciler.engine.state import utc_now


@dataclass(frozen=True)
class Holder:
    pid: int | None
    cmdline: str | None
    started: str | None

    @classmethod
    def me(cls) -> "Holder":
        argv = list(sys.argv) or ["nftrec"]
        argv[0] = os.path.basename(argv[0]) or argv[0]
        return cls(pid=os.getpid(), cmdline=shlex.join(argv), started=utc_now())

    @classmethod
    def parse(cls, text: str) -> "Holder":
        """Best effort: the file is informational, so junk yields unknown fields, not errors."""
        try:
            doc = json.loads(text)
        except ValueError:
            return cls(None, None, None)
        if not isinstance(doc, dict):
            return cls(None, None, None)
        pid, cmd, started = doc.get("pid"), doc.get("cmdline"), doc.get("started")
        return cls(
            pid=pid if type(pid) is int else None,
            cmdline=cmd if isinstance(cmd, str) else None,
            started=started if isinstance(started, str) else None,
        )


class LockHeld(Exception):
    """Another process holds the lock. `holder` fields are None when it has not written them yet."""

    def __init__(self, path: Path, holder: Holder):
        self.path = Path(path)
        self.holder = holder
        self.pid, self.cmdline, self.started = holder.pid, holder.cmdline, holder.started
        who = f"pid {holder.pid}" if holder.pid is not None else "pid unknown"
        if holder.cmdline:
            who += f', "{holder.cmdline}"'
        if holder.started:
            who += f", since {holder.started}"
        super().__init__(f"another nftrec ({who}) holds {self.path}; wait for it or stop it")


class Lock:
    """`with Lock(path):` — exclusive, non-blocking (or polling up to `timeout` seconds).

    Not re-entrant: a second Lock on the same file in the same process is refused too,
    which is what we want (flock is per open file description).
    """

    def __init__(self, path: Path, timeout: float = 0.0, poll: float = 0.1):
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "Lock":
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this Lock object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    if time.monotonic() >= deadline:
                        raise LockHeld(self.path, self._read_holder(fd)) from None
                    time.sleep(self.poll)
            info = json.dumps(asdict(Holder.me())) + "\n"
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Clear our details while still holding the lock; after unlocking, the next
            # holder may already be writing its own.
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def _read_holder(self, fd: int) -> Holder:
        # The holder writes its details right after locking; give it a moment to do so.
        for _ in range(5):
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            if text.strip():
                return Holder.parse(text)
            time.sleep(0.02)
        return Holder(None, None, None)

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
