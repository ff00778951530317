"""Both cores for a cold read: forked children fill the intake cache while the main
process reads files too, each taking the next file from a shared queue (Pull).

Pipeline position: inside intake/cache.py's read, before load -> validate -> model.

A child parses, checks and models the files it takes exactly as the main process
would (cache._parse_file), writes each result as an ordinary cache entry and exits. The
main process then reads those files through the ordinary cached path, so what a child
hands back is the cache's format: JSON data with a checksum, never code or pickles, and
the result is the one a warm read gives (the property tests compare that with a plain
read). Whatever a child fails to write (it crashed, the file changed, its result names
its path) is simply a cache miss, parsed by the main process as without children.
Once the queue is empty, one more child (the writer) encodes and writes the entries of
the files the main process parsed, from the results it inherited, while the main process
goes on. Before taking files, the main process may do other work (the node config):
the children start at once.

Why fork and not a pool: a forked child starts in ~1 ms with the parser, the compiled
validators and the code digest already in memory; a spawned or forkserver worker would
import nftrec first (~0.3 s, more than it saves at 1,000 Services). A child never returns
into the caller's code, logs nothing and flushes no stream: it ends with os._exit, so
locks held by another thread at fork time (the progress ticker's) are never needed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
from pathlib import Path
from typing import Callable

from reconciler import logs

MIN_FILES = 8  # below this a cold read is short, and a fork would not pay for itself
_PIPE_MAX = 1 << 20  # bytes of queued file numbers (Linux's default pipe-max-size)

Job = tuple[str, Path, bytes, str]  # display path, real path, bytes read, cache key


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def fork_is_safe() -> bool:
    """Fork only when no thread but the main one and the progress ticker (which a child
    never touches) runs: another thread may hold a lock the child would need."""
    if not hasattr(os, "fork"):  # pragma: no cover - not POSIX
        return False
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    return all(t.name == "nftrec-progress" for t in others)


def children(jobs: list[Job], workers: int | None = None) -> int:
    """How many children to fork for these jobs (besides the main process): none when
    there are few, one core, or forking is not safe here; `workers` overrides the core
    count (processes in all)."""
    n = cores() if workers is None else workers
    if n < 2 or (workers is None and len(jobs) < MIN_FILES) or not jobs:
        return 0
    if not fork_is_safe():
        logs.log.debug(f"intake: reading {len(jobs)} files in one process (other threads run: "
                       f"{', '.join(t.name for t in threading.enumerate())})")
        return 0
    return n - 1


class Pull:
    """The job numbers, biggest file first, in a pipe that the main process and its
    children read 4 bytes at a time: each takes the next file when it is free.

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
            raise OSError(errno.E2BIG, f"{len(sizes)} files are too many to queue")
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
