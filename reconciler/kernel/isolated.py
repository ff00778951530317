"""Work that may crash or hang, run in a child process with a time bound, so that a crash
there is an answer with its reason rather than the death of nftrec.

An nft older than the tool that wrote a foreign table can segfault reading it, in the
`nft` binary and in-process libnftables alike. `run_nft` runs the binary inside a network
namespace (`run`: any program); `start_nft` starts one for a stream (`nft monitor
trace`; `start`: any program); `in_child` forks the calling thread (and so its namespace) to run a function of
this process.
"""

from __future__ import annotations

import faulthandler
import os
import select
import shutil
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

from reconciler.kernel.netns import NamespaceThread

# Signals that mean the program itself failed, not that someone stopped it.
_CRASHES = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


@dataclass(frozen=True)
class Outcome:
    """How a child ended."""

    what: str  # the program: "nft", "libnftables"
    returncode: int | None  # the exit code; None when a signal ended it or it never started
    signal: int | None = None  # the signal that ended it (SIGKILL after a timeout)
    timed_out: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    missing: str | None = None  # why it could not start (no nft binary)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def crashed(self) -> bool:
        return self.signal in _CRASHES and not self.timed_out

    def reason(self, doing: str = "") -> str:
        """One line: what went wrong, for an error or a doctor finding. `doing` says
        what it was doing ("listing table ip filter")."""
        what = f"{self.what} {doing}".strip()
        if self.missing:
            return f"{what}: {self.missing}"
        if self.timed_out:
            return f"{what}: did not finish in time (killed)"
        if self.signal is not None:
            name = signal.Signals(self.signal).name
            if not self.crashed:
                return f"{self.what} was killed ({name}) {doing}".strip()
            hint = ": a table written by a newer nft, which this one cannot read?" if "nft" in self.what else ""
            return f"{self.what} crashed ({name}) {doing}".strip() + hint
        err = (self.stderr or self.stdout).decode(errors="replace").strip().splitlines()
        return f"{what}: exit {self.returncode}" + (f": {err[0]}" if err else "")


def program(name: str) -> str | None:
    """The path of the command `name`, also where the PATH lacks /usr/sbin; None if absent."""
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)),
                                      None)


def nft_binary() -> str | None:
    return program("nft")


def start_nft(netns: str | None, args: Sequence[str], **popen) -> subprocess.Popen:
    """The nft binary with `args`, started inside `netns`; the caller reads it, bounds it
    and stops it (a stream: `nft monitor trace`). FileNotFoundError without an nft."""
    binary = nft_binary()
    if binary is None:
        raise FileNotFoundError("the nft command is not installed (Debian/Ubuntu: apt-get install nftables)")
    return start(netns, [binary, *args], **popen)


def run_nft(netns: str | None, args: Sequence[str], *, timeout: float, stdin: bytes | None = None) -> Outcome:
    """The nft binary with `args` inside `netns`, killed after `timeout` seconds."""
    binary = nft_binary()
    if binary is None:
        return Outcome("nft", None, missing="the nft command is not installed")
    return run(netns, [binary, *args], timeout=timeout, stdin=stdin, what="nft")


def run(netns: str | None, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None,
        what: str | None = None) -> Outcome:
    """Any program inside `netns`, killed after `timeout` seconds; a missing program is an
    Outcome that says so (`missing`), never an exception."""
    what = what or os.path.basename(argv[0])
    try:
        proc = start(netns, argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        return Outcome(what, None, missing=f"{argv[0]} is not installed")
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return Outcome(what, None, signal.SIGKILL, True, out, err)
    rc = proc.returncode
    return Outcome(what, rc if rc >= 0 else None, -rc if rc < 0 else None, False, out, err)


def start(netns: str | None, argv: Sequence[str], **popen) -> subprocess.Popen:
    """Any program started inside `netns` (a child inherits the network namespace of the
    thread that starts it), in a session of its own; the caller reads, bounds and stops it.
    FileNotFoundError when the program is not installed."""
    worker = NamespaceThread(netns)
    popen.setdefault("start_new_session", True)  # a Ctrl-C on the terminal is nftrec's to handle
    try:
        return worker.call(lambda: subprocess.Popen(list(argv), **popen))
    finally:
        worker.close()


def in_child(fn: Callable[[], bytes], *, what: str, timeout: float) -> Outcome:
    """Fork the calling thread; the child runs `fn` and hands back its bytes (stdout), or
    the text of its exception (stderr, exit 1). Only the calling thread lives on in the
    child, in the calling thread's network namespace; it must touch nothing that another
    thread of this process may hold (a C library call and plain data are fine)."""
    r, w = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns about fork() with threads; see the docstring
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(r)
            os.setsid()  # a Ctrl-C on the terminal is the parent's to handle, as for an in-process call
            faulthandler.disable()  # the parent reports a crash, once, with its reason
            data = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            code, data = 1, str(e).encode(errors="replace")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if os.WIFSIGNALED(status):
        return Outcome(what, None, os.WTERMSIG(status), timed_out, data)
    rc = os.WEXITSTATUS(status)
    return Outcome(what, rc, None, False, data if rc == 0 else b"", data if rc else b"")
