"""Compiling every Service of a one-shot command on both cores: a forked child compiles
the last part of the Services while this process compiles the rest (issue 8 item 7).

Pipeline position: inside compile_oneshot, between the model and `assemble`.

After intake, a cold `apply` ran on one core (compile, plan, commit, verification) while
the other idled; compile_service is ~0.25 s of that at 1,000 Services, ~2.5 s at 10,000.
The fragments are plain data (chains, rules, elements), so the child hands its part back
pickled through a pipe: the child is this process' own fork (the same code and memory
image), and nothing is stored, so there is no foreign input to fear here (the intake
cache, which outlives a run, stays JSON). The fragments come back in the order of
`services`, so `assemble` sees exactly what one process would give it.

Whatever goes wrong in the child (an exception, a crash, a short read) is not an error:
this process compiles that part itself, so errors are raised as without a child. The
child logs nothing and ends with os._exit (no stream flushed, no atexit handler run).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct

from reconciler.compile.services import compile_service

MIN_SERVICES = 200  # below this the fork and the pickles cost about what they save
CHILD_SHARE = 0.45  # the child also pickles its part, and this process unpickles it
_HEADER = struct.Struct("=Q")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def compile_services(services: list, by_svc: dict, config, contexts: dict, *, fork: bool = True) -> list:
    """[compile_service(svc, by_svc.get(svc.key, ()), config, contexts) for svc in
    services], the last CHILD_SHARE of them compiled by a forked child when that pays."""

    def compile_all(part) -> list:
        return [compile_service(svc, by_svc.get(svc.key, ()), config, contexts) for svc in part]

    if not fork or len(services) < MIN_SERVICES or _cores() < 2 or not hasattr(os, "fork"):
        return compile_all(services)
    cut = len(services) - int(len(services) * CHILD_SHARE)
    started = _start(lambda: compile_all(services[cut:]))
    if started is None:  # no pipe or no process to be had
        return compile_all(services)
    pid, r = started
    try:
        mine = compile_all(services[:cut])
        theirs = _collect(pid, r)
    except BaseException:
        _stop(pid)
        raise
    finally:
        os.close(r)
    if theirs is None or len(theirs) != len(services) - cut:
        theirs = compile_all(services[cut:])
    return mine + theirs


def _start(work) -> tuple[int, int] | None:
    """Fork a child that runs `work` and writes its pickled result to a pipe: (its pid,
    the pipe's read end), or None."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(r)
            data = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(w, "wb", closefd=True) as out:
                out.write(_HEADER.pack(len(data)))
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _collect(pid: int, r: int) -> list | None:
    """The child's result, once it exited cleanly with all of it written; else None."""
    chunks = []
    while True:
        b = os.read(r, 1 << 20)
        if not b:
            break
        chunks.append(b)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if status != 0 or len(data) < _HEADER.size or _HEADER.unpack_from(data)[0] != len(data) - _HEADER.size:
        return None
    return pickle.loads(memoryview(data)[_HEADER.size:])


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):  # pragma: no cover - already reaped
        pass
