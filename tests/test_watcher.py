"""daemon/watcher.py on a real inotify: git-sync's link swap triggers a sync, also when
watchdog does not pair the rename's two halves (its pairing delay is off: module doc of
_no_move_pairing_delay)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from reconciler.daemon.watcher import Watcher


def _swap(gs: Path, rev: str) -> None:
    tmp = gs / ".tmp-link"
    tmp.symlink_to(rev)
    os.replace(tmp, gs / "current")  # a rename: IN_MOVED_FROM .tmp-link, IN_MOVED_TO current


def test_link_swaps_trigger_and_moves_are_not_held(tmp_path):
    from reconciler.daemon.watcher import _move_pairing_holder

    holder = _move_pairing_holder()
    assert holder is not None  # watchdog 6 (Python 3.9) and 7 both have one
    gs = tmp_path / "gitsync"
    for r in ("rev-a", "rev-b"):
        (gs / r).mkdir(parents=True)
        (gs / r / "svc.yaml").write_text("kind: Service\n")
    (gs / "current").symlink_to("rev-a")
    fired = threading.Event()
    w = Watcher(gs / "current", fired.set, debounce=0.01, debounce_max=0.1)
    # constructing a Watcher switched the pairing delay off (an IN_MOVED_FROM waited up to
    # 0.5 s, and held every later event with it)
    assert holder.delay == 0
    w.start()
    try:
        w.follow(str(gs / "rev-a"))
        for i, rev in enumerate(["rev-b", "rev-a"] * 5):
            fired.clear()
            w.take_changes()
            _swap(gs, rev)
            assert fired.wait(10), f"swap {i} to {rev} never triggered"
            assert w.take_changes() is None  # a swap asks for a walk of the tree
    finally:
        w.stop()


def test_watchdog_move_pairing_is_found():
    """The watcher turns off watchdog's IN_MOVED_FROM pairing delay through a class of
    watchdog's internals (6.x InotifyBuffer, 7.x InotifyMoveEventGrouper); a watchdog
    that moved it elsewhere must fail here, not silently delay every link swap."""
    from reconciler.daemon.watcher import _move_pairing_holder

    holder = _move_pairing_holder()
    assert holder is not None, "watchdog's move-pairing class not found: update _move_pairing_holder"
    assert isinstance(holder.delay, (int, float))
