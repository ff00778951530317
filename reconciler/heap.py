"""The process's one memory policy: when the cyclic GC runs, and when freed C heap is
given back to the system. Below every stage, beside logs.py: the entry point calls
`collect_rarely`, intake reads under `no_cyclic_gc`, the daemon calls `settle_heap` after
a full sync, and the kernel stage and the state writer call `trim_heap`.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

_malloc_trim = None


def collect_rarely() -> None:
    """A young-generation GC threshold for a process that builds large, mostly acyclic
    structures (manifests, models, rulesets, their JSON): at CPython's default of 700
    allocations, thousands of collections free nothing. Older generations keep their ratios."""
    gc.set_threshold(50_000, 10, 10)


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
