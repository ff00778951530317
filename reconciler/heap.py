"""The process's one memory policy: when the cyclic GC runs, and when freed C heap is
given back to the system. Below every stage, beside logs.py: the entry point calls
`for_one_shot`, `watch` `for_daemon`, intake reads under `no_cyclic_gc`, the daemon calls
`settle_heap` after a full sync, and the kernel stage and the state writer call `trim_heap`.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

_malloc_trim = None


def for_one_shot() -> None:
    """Every command but `watch`: it builds large, acyclic structures (manifests, models,
    rulesets, listings) that stay alive until it exits, so the cyclic GC is off: each
    collection would scan all of them again and free nothing. Reference counting still
    frees everything else at once."""
    gc.disable()


def for_daemon() -> None:
    """`watch` lives long and must free cycles: the cyclic GC on, with a young-generation
    threshold for a process that builds large, mostly acyclic structures (at CPython's
    default of 700 allocations, thousands of collections free nothing)."""
    gc.set_threshold(50_000, 10, 10)
    gc.enable()


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic GC paused for a read of the manifests: it allocates millions of objects
    that all stay alive (documents, their data, models) and form no cycles, which every
    collection would scan again. Reference counting still frees everything else at once."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def settle_heap() -> None:
    """After the daemon's full sync, what it holds (manifests, models, rulesets) stays for
    long: collected once, then frozen out of the GC's later scans, which would otherwise walk
    all of it on every full collection. A cycle among frozen objects waits for the next call."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    trim_heap()


def trim_heap() -> None:
    """Return the C heap's free pages to the system (glibc malloc_trim(0): every arena).
    glibc keeps them otherwise, notably in libnftables' worker-thread arena, which the main
    thread never reuses. ctypes drops the GIL for the call; without malloc_trim (musl), nothing."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes

        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)
