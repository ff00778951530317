"""daemon/statewriter.py: state writes in order, off the sync path, deferred while the
daemon is busy, superseded applied records dropped, everything written by flush/close."""

from __future__ import annotations

import threading
import time

from reconciler.daemon.statewriter import StateWriter


def test_writes_wait_for_idle_run_in_order_and_supersede():
    w = StateWriter(idle=0.3, max_delay=30)
    done: list[str] = []
    w.active()
    w.submit(lambda: done.append("attempt 1"))
    w.submit(lambda: done.append("applied 1"), supersedes="applied")
    w.submit(lambda: done.append("attempt 2"))
    w.submit(lambda: done.append("applied 2"), supersedes="applied")
    time.sleep(0.1)
    assert done == []  # the daemon was active 0.1 s ago: nothing written yet
    deadline = time.monotonic() + 5
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert done == ["attempt 1", "attempt 2", "applied 2"] and w.dropped == 1
    w.close()


def test_flush_writes_now_and_close_drains():
    w = StateWriter(idle=60, max_delay=60)
    done: list[int] = []
    w.active()
    w.submit(lambda: done.append(1))
    assert w.flush(timeout=5) and done == [1]
    w.submit(lambda: done.append(2))
    w.close(timeout=5)
    assert done == [1, 2]


def test_max_delay_bounds_the_wait_and_a_crashing_write_does_not_stop_the_thread():
    w = StateWriter(idle=60, max_delay=0.2)
    done = threading.Event()
    stop = threading.Event()

    def busy():  # a sync every 50 ms: never idle
        while not stop.is_set():
            w.active()
            time.sleep(0.05)

    t = threading.Thread(target=busy)
    t.start()
    try:
        w.submit(lambda: 1 / 0)
        w.submit(done.set)
        assert done.wait(5)
    finally:
        stop.set()
        t.join()
        w.close()


def test_a_finished_write_is_not_kept_alive_by_the_thread():
    """The revision a write records is freed once written, not held while the thread
    waits for the next write."""
    import gc
    import weakref

    class Revision:
        pass

    w = StateWriter(idle=0, max_delay=0)
    rev = Revision()
    gone = weakref.ref(rev)
    w.submit(lambda rev=rev: rev)
    del rev
    assert w.flush(timeout=5)
    gc.collect()
    assert gone() is None
    w.close()
