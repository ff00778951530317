"""The daemon's source of triggers: file events in the manifest directory, debounced.

The directory is watched recursively and its parent too (git-sync swaps a symlink).
Bursts are debounced into one trigger; `take_changes()` hands over the files written since
the last read, and anything else (create, remove, rename, the link swap) asks for a walk.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.intake import SUFFIXES

DEBOUNCE = 0.2  # seconds of quiet after the last file event before a sync is triggered
DEBOUNCE_MAX = 2.0  # a continuous stream of events triggers at least this often


def _no_move_pairing_delay() -> None:
    """watchdog's inotify emitter holds an IN_MOVED_FROM up to 0.5 s to pair it with its
    IN_MOVED_TO, and every event behind it waits, git-sync's link
    swap included. A move, a delete and a create all mean "walk the tree" here, so the
    pairing is switched off: an unpaired move arrives as delete + create, at once."""
    holder = _move_pairing_holder()
    if holder is not None:
        holder.delay = 0


def _move_pairing_holder():
    """The watchdog class whose `delay` holds an IN_MOVED_FROM: InotifyMoveEventGrouper
    from watchdog 7, InotifyBuffer before (6.0 is the last for Python 3.9); None if
    neither (not Linux, or another watchdog layout: its behaviour is kept)."""
    try:
        from watchdog.observers.inotify_move_event_grouper import InotifyMoveEventGrouper
        return InotifyMoveEventGrouper
    except ImportError:
        pass
    try:
        from watchdog.observers.inotify_buffer import InotifyBuffer
        return InotifyBuffer if isinstance(getattr(InotifyBuffer, "delay", None), (int, float)) else None
    except ImportError:
        return None


class Watcher:
    """watchdog on the directory (recursive, following git-sync's link) and its parent
    (the link swap); relevant events are debounced into `trigger()`."""

    def __init__(self, directory: Path, trigger: Callable[[], None], *, debounce: float = DEBOUNCE,
                 debounce_max: float = DEBOUNCE_MAX, activity: Callable[[], None] | None = None):
        self.link = os.path.abspath(directory)
        self.parent = os.path.dirname(self.link) or "/"
        self.trigger, self.debounce, self.debounce_max = trigger, debounce, debounce_max
        self.activity = activity  # told of every relevant event (the state writer waits)
        self._suffixes = SUFFIXES
        self._cond = threading.Condition()
        self._first: float | None = None  # first event of the current burst
        self._last = 0.0
        self._stopped = False
        self._root: str | None = None
        self._root_watch = None
        self._changed: set[str] = set()  # files written in place since take_changes()
        self._rescan = True  # something else happened: the tree must be walked
        self.events = 0
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        _no_move_pairing_delay()

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                watcher._event(event)

        self._handler = Handler()
        self._observer = Observer()
        self._observer.schedule(self._handler, self.parent, recursive=False)
        self._thread = threading.Thread(target=self._debounce_loop, name="nftrec-debounce", daemon=True)

    def start(self) -> None:
        self._observer.start()
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._observer.stop()
        if self._observer.ident is not None:  # stopped before start(): nothing to join
            self._observer.join(timeout=5)

    def follow(self, root: str) -> None:
        """Watch `root` (the resolved directory being read) recursively, instead of the old one."""
        if root == self._root or not os.path.isdir(root):
            return
        if self._root_watch is not None:
            try:
                self._observer.unschedule(self._root_watch)
            except (KeyError, OSError):
                pass
            self._root_watch = None
        try:
            self._root_watch = self._observer.schedule(self._handler, root, recursive=True)
            self._root = root
        except OSError as e:
            logs.log.warning(f"cannot watch {root}: {e}; changes are picked up by the periodic full sync")

    def _relevant(self, event) -> bool:
        if event.event_type in ("opened", "closed_no_write") or (event.is_directory and event.event_type == "modified"):
            return False
        for p in (event.src_path, getattr(event, "dest_path", "") or ""):
            if not p:
                continue
            p = os.fsdecode(p)
            if p == self.link:
                return True  # the directory itself or git-sync's link
            if os.path.dirname(p) == self.parent and not (self._root and p.startswith(self._root + os.sep)):
                continue  # a sibling of the link in the parent: not ours
            name = os.path.basename(p)
            rel = os.path.relpath(p, self._root) if self._root and p.startswith(self._root) else name
            if any(part.startswith(".") for part in rel.split(os.sep)):
                continue  # hidden (.git, .tmp-*, editor swap files): never read
            if event.is_directory or name.endswith(self._suffixes):
                return True
        return False

    def _event(self, event) -> None:
        if not self._relevant(event):
            return
        if self.activity is not None:
            self.activity()
        now = time.monotonic()
        with self._cond:
            if event.event_type in ("modified", "closed") and not event.is_directory:
                self._changed.add(os.fsdecode(event.src_path))
            else:
                self._rescan = True
            self.events += 1
            self._last = now
            if self._first is None:
                self._first = now
            self._cond.notify_all()

    def take_changes(self) -> set[str] | None:
        """The files written in place since the last call, or None when the tree must be
        walked (module doc); resets both."""
        with self._cond:
            out = None if self._rescan else self._changed
            self._changed, self._rescan = set(), False
            return out

    def _debounce_loop(self) -> None:
        while True:
            with self._cond:
                while self._first is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                while not self._stopped:
                    now = time.monotonic()
                    wait = min(self._last + self.debounce, self._first + self.debounce_max) - now
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                self._first = None
            self.trigger()
