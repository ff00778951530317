"""The progress line (reconciler/progress.py): only on a terminal, only for a step longer
than the delay, erased when the step ends, and out of the way of diagnostics."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler import logs, progress

ROOT = Path(__file__).resolve().parent.parent
CLEAR = "\r\033[K"


@pytest.fixture
def tty():
    """A text stream on a pseudo-terminal, and a function returning what reached it."""
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w", buffering=1)

    def output() -> str:
        stream.flush()
        chunks = []
        while select.select([master], [], [], 0.05)[0]:
            chunks.append(os.read(master, 65536))
        return b"".join(chunks).decode()

    yield stream, output
    stream.close()
    os.close(master)


def test_nothing_is_written_when_the_stream_is_not_a_terminal(monkeypatch):
    monkeypatch.setenv("NFTREC_PROGRESS_DELAY", "0")
    buf = io.StringIO()
    ran = []
    with progress.step("reading", stream=buf):
        time.sleep(0.3)
        ran.append(1)
    assert ran == [1]
    assert buf.getvalue() == ""


def test_a_long_step_shows_its_line_and_erases_it(tty, monkeypatch):
    monkeypatch.setenv("NFTREC_PROGRESS_DELAY", "0.1")
    stream, output = tty
    with progress.step("compiling 3 Services", stream=stream):
        time.sleep(0.5)
    out = output()
    assert "compiling 3 Services... 0s" in out
    assert out.endswith(CLEAR)  # nothing of the line is left on screen


def test_a_short_step_writes_nothing(tty, monkeypatch):
    monkeypatch.setenv("NFTREC_PROGRESS_DELAY", "1")
    stream, output = tty
    with progress.step("quick", stream=stream):
        time.sleep(0.05)
    assert output() == ""


def test_nested_steps_show_the_innermost_and_the_line_goes_when_the_outer_ends(tty, monkeypatch):
    monkeypatch.setenv("NFTREC_PROGRESS_DELAY", "0")
    stream, output = tty
    with progress.step("outer", stream=stream):
        with progress.step("inner", stream=stream):
            time.sleep(0.4)
        mid = output()
        time.sleep(0.4)
    end = output()
    assert "inner..." in mid
    assert "outer..." in end and end.endswith(CLEAR)


def test_a_diagnostic_during_a_step_erases_the_line_first(tty, monkeypatch):
    monkeypatch.setenv("NFTREC_PROGRESS_DELAY", "0")
    stream, output = tty
    monkeypatch.setattr(sys, "stderr", stream)  # logs writes to whatever sys.stderr is
    with progress.step("listing", stream=stream):
        time.sleep(0.4)
        logs.log.warning("something to say")
        time.sleep(0.05)
    out = output()
    before, _, _after = out.partition("nftrec: warning: something to say")
    assert "listing... 0s" in before
    assert before.endswith(CLEAR), repr(out[-200:])
    # the filter that erased the line is gone with the step
    assert not any(isinstance(f, progress._Line) for h in logs.log.handlers for f in h.filters)


def test_progress_can_be_turned_off(tty, monkeypatch):
    monkeypatch.setenv("NFTREC_PROGRESS_DELAY", "0")
    monkeypatch.setenv("NFTREC_PROGRESS", "0")
    stream, output = tty
    with progress.step("x", stream=stream):
        time.sleep(0.3)
    assert output() == ""


def test_the_command_line_shows_progress_on_a_terminal_stderr_only(tmp_path):
    """`nftrec render` with stderr on a terminal: the reading and compiling steps appear
    there and are erased; stdout (a pipe) carries only the script."""
    master, slave = pty.openpty()
    env = dict(os.environ, NFTREC_PROGRESS_DELAY="0", TERM="xterm")
    env.pop("NFTREC_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "render", str(ROOT / "examples" / "edge-small"),
                             "--config", str(ROOT / "examples" / "edge-small.config.yaml")],
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out, _ = proc.communicate(timeout=120)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = b"".join(chunks).decode()
    assert proc.returncode == 0
    assert out.decode().startswith("#!/usr/sbin/nft -f") or "table ip nftrec" in out.decode()
    assert "\033[K" not in out.decode()
    assert "reading manifests from " in err
    assert err.endswith(CLEAR)  # the last line drawn was erased
