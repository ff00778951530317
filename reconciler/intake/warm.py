"""Both cores for a cold read: forked children fill the intake cache while the main
process reads its own share of the files.

Pipeline position: inside intake/cache.py's read, before load -> validate -> model.

A child parses, checks and models its share of the files exactly as the main process
would (cache._parse_file), writes each result as an ordinary cache entry and exits. The
main process then reads those files through the ordinary cached path, so what a child
hands back is the cache's format: JSON data with a checksum, never code or pickles, and
the result is the one a warm read gives (the property tests compare that with a plain
read). Whatever a child fails to write (it crashed, the file changed, its result names
its path) is simply a cache miss, parsed by the main process as without children.
Once the main process has parsed its own share, one more child (the writer) encodes
and writes those entries from the results it inherited, while the main process goes on.

Why fork and not a pool: a forked child starts in ~1 ms with the parser, the compiled
validators and the code digest already in memory; a spawned or forkserver worker would
import nftrec first (~0.3 s, more than it saves at 1,000 Services). A child never returns
into the caller's code, logs nothing and flushes no stream: it ends with os._exit, so
locks held by another thread at fork time (the progress ticker's) are never needed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, TypeVar

from reconciler import logs

MIN_FILES = 8  # below this a cold read is short, and a fork would not pay for itself
# The main process also decodes the children's entries (~13 % of what parsing them
# costs), so it takes a smaller share than a child; its own entries are encoded and
# written by a writer child (~10 %), hence not much smaller.
MAIN_WEIGHT = 0.95

Job = tuple[str, Path, bytes, str]  # display path, real path, bytes read, cache key
J = TypeVar("J")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _fork_is_safe() -> bool:
    """Fork only when no thread but the main one and the progress ticker (which a child
    never touches) runs: another thread may hold a lock the child would need."""
    if not hasattr(os, "fork"):  # pragma: no cover - not POSIX
        return False
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    return all(t.name == "nftrec-progress" for t in others)


def split(jobs: list[Job], workers: int | None = None) -> tuple[list[Job], list[list[Job]]]:
    """(the main process' share, one share per child), each in `jobs` order. No children
    when there are few jobs, one core, or forking is not safe here; `workers` overrides
    the core count. Shares are balanced by bytes (parsing and checking cost about the
    same per byte; Services and EndpointSlices differ in size and sort apart)."""
    n = cores() if workers is None else workers
    if n < 2 or (workers is None and len(jobs) < MIN_FILES) or not jobs:
        return jobs, []
    if not _fork_is_safe():
        logs.log.debug(f"intake: reading {len(jobs)} files in one process (other threads run: "
                       f"{', '.join(t.name for t in threading.enumerate())})")
        return jobs, []
    weights = [MAIN_WEIGHT] + [1.0] * (n - 1)
    loads = [0.0] * n
    owner = {}
    size = [len(job[2]) + 1 for job in jobs]
    for i in sorted(range(len(jobs)), key=lambda i: -size[i]):  # biggest first, then in order
        share = min(range(n), key=lambda k: (loads[k] + size[i]) / weights[k])
        loads[share] += size[i]
        owner[i] = share
    shares: list[list[Job]] = [[] for _ in range(n)]
    for i, job in enumerate(jobs):
        shares[owner[i]].append(job)
    return shares[0], [s for s in shares[1:] if s]


def start(shares: list[list[J]], work: Callable[[J], None]) -> list[int]:
    """Fork one child per share, each running `work` on its jobs; their pids."""
    pids = []
    for share in shares:
        try:
            pid = os.fork()
        except OSError:  # no memory or process slots: the main process reads these itself
            break
        if pid == 0:  # the child: never returns
            code = 1
            try:
                for job in share:
                    work(job)
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
