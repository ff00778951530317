"""Compiling every Service of a one-shot command on both cores: the Services in chunks,
which this process and a forked child each take from a shared queue (forks.Pull) when
free (issue 8 item 7).

Pipeline position: inside compile_oneshot, between the model and `assemble`.

After intake, a cold `apply` ran on one core (compile, plan, commit, verification) while
the other idled; compile_service is ~0.25 s of that at 1,000 Services, ~2.5 s at 10,000.
Pulling, not a fixed split: on a shared machine the child often does not get its core,
and this process then takes the chunks it leaves (intake/warm.py does the same). The
child appends each chunk's fragments to an unlinked temporary file; once the queue is
empty this process waits for it only about as long as a chunk takes, then compiles what
is missing itself. The fragments are plain data (chains, rules, elements), so they come
back pickled: the child is this process' own fork and nothing is kept (the intake cache,
which outlives a run, stays JSON). They are put back in the order of `services`, so
`assemble` sees exactly what one process would give it.

Whatever goes wrong in the child (an exception, a crash, a late or short write) is not
an error: this process compiles those chunks itself, so errors are raised as without a
child. The child logs nothing and ends with os._exit (forks.start).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import tempfile
import time

from reconciler.compile.services import compile_service
from reconciler.forks import Pull, cores, start

MIN_SERVICES = 200  # below this the fork and the pickles cost about what they save
CHUNKS = 16
_HEADER = struct.Struct("=IQ")  # chunk number, bytes of its pickle


def compile_services(services: list, by_svc: dict, config, contexts: dict, *, fork: bool = True) -> list:
    """[compile_service(svc, by_svc.get(svc.key, ()), config, contexts) for svc in
    services], shared with a forked child when that pays."""

    def compile_chunk(k: int) -> list:
        return [compile_service(svc, by_svc.get(svc.key, ()), config, contexts)
                for svc in services[k * len(services) // CHUNKS:(k + 1) * len(services) // CHUNKS]]

    if not fork or len(services) < MIN_SERVICES or cores() < 2 or not hasattr(os, "fork"):
        return [f for k in range(CHUNKS) for f in compile_chunk(k)]
    parts: list = [None] * CHUNKS  # None: not compiled (yet), or its compile raised
    try:
        pull = Pull([1] * CHUNKS)  # in order
        out = tempfile.TemporaryFile(prefix="nftrec-compile-")
    except OSError:
        return [f for k in range(CHUNKS) for f in compile_chunk(k)]
    pids: list[int] = []
    try:
        # The nft worker thread may run: the child touches nothing of it (it compiles,
        # writes to its own file and exits), so no lock that thread holds is needed.
        pids = start([lambda: _child(pull, out.fileno(), compile_chunk)])
        took, mine = time.monotonic(), 0
        while (k := pull.take()) is not None:
            try:
                parts[k] = compile_chunk(k)
            except Exception:  # raised below, in chunk order, as one process would
                pass
            mine += 1
        if pids:
            _wait(pids.pop(), timeout=2 * (time.monotonic() - took) / max(mine, 1) + 0.05)
            try:
                _read(out.fileno(), parts)
            except Exception:  # pragma: no cover - our own child's pickles: compile here
                pass
    finally:
        for pid in pids:  # this process was interrupted: the child is of no use now
            _wait(pid, timeout=0)
        pull.close()
        out.close()
    return [f for k in range(CHUNKS) for f in (parts[k] if parts[k] is not None else compile_chunk(k))]


def _child(pull: Pull, fd: int, compile_chunk) -> None:
    while (k := pull.take()) is not None:
        data = pickle.dumps(compile_chunk(k), protocol=pickle.HIGHEST_PROTOCOL)
        record = memoryview(_HEADER.pack(k, len(data)) + data)
        while record:
            record = record[os.write(fd, record):]


def _wait(pid: int, timeout: float) -> None:
    """Reap the child; if it is not done within `timeout` seconds (its last chunk should
    take about as long as one of ours), kill it: its finished chunks are in the file."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # pragma: no cover - Linux < 5.3: no pidfd
        fd = None
    try:
        done = select.select([fd], [], [], timeout)[0] if fd is not None else timeout > 0  # else: block
        if not done:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):  # pragma: no cover - already gone
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _read(fd: int, parts: list) -> None:
    """The child's chunks from its file into `parts` (a cut-off last one is left out)."""
    data = memoryview(os.pread(fd, os.fstat(fd).st_size, 0))
    at = 0
    while at + _HEADER.size <= len(data):
        k, n = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if k >= len(parts) or at + n > len(data):
            return
        if parts[k] is None:
            parts[k] = pickle.loads(data[at:at + n])
        at += n
