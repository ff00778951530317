"""Work shared with forked children: a queue each process takes the next job from (Pull),
and starting and reaping the children. Used by a cold intake (intake/warm.py) and by a
one-shot compile (compile/forked.py).

Why fork: a forked child starts in ~1 ms with everything the work needs already in
memory; a spawned worker would import nftrec first (~0.3 s). A child never returns into
the caller's code: it ends with os._exit, flushing no stream and running no handler.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from typing import Callable

_PIPE_MAX = 1 << 20  # bytes of queued job numbers (Linux's default pipe-max-size)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Pull:
    """The job numbers, biggest first, in a pipe that the main process and its children
    read 4 bytes at a time: each takes the next job when it is free.

    Why not a fixed split: on this project's shared 2-core machines a child often does
    not get its core (or the main process is busy with the node config), and a fixed
    share then waits for the slowest; pulling balances itself. A read of 4 bytes from a
    pipe holding whole 4-byte numbers is atomic (the kernel holds the pipe's lock while
    copying), so no number is taken twice. Raises OSError when there is no pipe to be had
    or too many jobs for one (the caller reads them without children)."""

    def __init__(self, sizes: list[int]):
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
        data = b"".join(struct.pack("=I", i) for i in order)
        if len(data) > _PIPE_MAX:
            raise OSError(errno.E2BIG, f"{len(sizes)} jobs are too many to queue")
        r, w = os.pipe()
        try:
            if len(data) > 65536:  # the default capacity; a write must never block here
                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, len(data))
            os.write(w, data)  # all of it: it fits, and the pipe is empty
        except OSError:
            os.close(r)
            raise
        finally:
            os.close(w)  # readers see the end once every number is taken
        self._r = r

    def take(self) -> int | None:
        """The next job number, or None when all are taken."""
        b = os.read(self._r, 4)
        return struct.unpack("=I", b)[0] if len(b) == 4 else None

    def close(self) -> None:
        if self._r >= 0:
            os.close(self._r)
            self._r = -1


def start(works: list[Callable[[], None]]) -> list[int]:
    """Fork one child per function, each running it and exiting; their pids."""
    pids = []
    for work in works:
        try:
            pid = os.fork()
        except OSError:  # no memory or process slots: the main process does this work
            break
        if pid == 0:  # the child: never returns
            code = 1
            try:
                work()
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    return pids


def wait(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # pragma: no cover - reaped elsewhere
            pass
