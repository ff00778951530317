"""A progress line on stderr for any step that takes longer than a second, only on a
terminal (`with progress.step("listing the kernel's table"): ...`). Elsewhere a step
costs one isatty() call. A daemon thread redraws one line for the innermost step and
erases it at the end; a diagnostic logged meanwhile erases it first. Any stage may use it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO

from reconciler import logs

DELAY = 1.0  # seconds a step runs before the line appears
TICK = 0.25
_CLEAR = "\r\033[K"
_SPIN = "|/-\\"


def enabled(stream: TextIO) -> bool:
    if os.environ.get("NFTREC_PROGRESS") == "0" or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


def _delay() -> float:
    try:
        return max(0.0, float(os.environ.get("NFTREC_PROGRESS_DELAY", DELAY)))
    except ValueError:
        return DELAY


class _Line(logging.Filter):
    """The one progress line on screen: the step stack, the ticker thread, and the log
    filter that erases the line before a diagnostic is written."""

    def __init__(self, stream: TextIO):
        super().__init__()
        self.stream = stream
        self.lock = threading.Lock()
        self.steps: list[tuple[str, float]] = []
        self.drawn = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nftrec-progress", daemon=True)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def erase(self) -> None:
        with self.lock:
            if self.drawn:
                self._write(_CLEAR)
                self.drawn = False

    def filter(self, record: logging.LogRecord) -> bool:  # logging.Filter: runs before each diagnostic
        self.erase()
        return True

    def _run(self) -> None:
        if self.stop.wait(_delay()):
            return
        n = 0
        while not self.stop.is_set():
            with self.lock:
                if self.steps and not self.stop.is_set():
                    what, since = self.steps[-1]
                    width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
                    text = f"{_SPIN[n % 4]} {logs.escape(what)}... {time.monotonic() - since:.0f}s"
                    self._write(_CLEAR + text[:width])  # never wraps: \r must reach its start
                    self.drawn = True
            n += 1
            self.stop.wait(TICK)


_active: _Line | None = None
_guard = threading.Lock()


@contextmanager
def step(what: str, *, stream: TextIO | None = None) -> Iterator[None]:
    """Show `what` on a progress line while the block runs, if it runs longer than a
    second and stderr (or `stream`) is a terminal."""
    global _active
    stream = stream if stream is not None else sys.stderr
    if not enabled(stream):
        yield
        return
    with _guard:
        line, outer = (_active, False) if _active is not None else (_Line(stream), True)
        if outer:
            _active = line
    entry = (what, time.monotonic())
    with line.lock:
        line.steps.append(entry)
    handlers = list(logs.log.handlers) if outer else []
    for h in handlers:
        h.addFilter(line)
    if outer:
        line.thread.start()
    try:
        yield
    finally:
        with line.lock:
            line.steps.remove(entry)
        if outer:
            line.stop.set()
            line.thread.join()
            line.erase()
            for h in handlers:
                h.removeFilter(line)
            with _guard:
                _active = None
