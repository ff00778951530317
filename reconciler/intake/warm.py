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

import os
import threading
from pathlib import Path

from reconciler import logs
from reconciler.forks import Pull, cores, start, wait  # noqa: F401  (cache.py uses them as warm.*)

MIN_FILES = 8  # below this a cold read is short, and a fork would not pay for itself

Job = tuple[str, Path, bytes, str]  # display path, real path, bytes read, cache key


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
