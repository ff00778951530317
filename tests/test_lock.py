"""lock.py: one holder per namespace, fail fast naming the holder, no stale lock after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reconciler.engine.lock import Holder, Lock, LockHeld
from reconciler.engine.state import StateStore

REPO = Path(__file__).resolve().parent.parent

HOLD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from reconciler.engine.lock import Lock
    path = sys.argv[2]
    sys.argv = ["/usr/local/bin/nftrec"] + sys.argv[3:]  # what the nftrec console script sees
    with Lock(path):
        print("locked", flush=True)
        time.sleep(60)
    """
)


def spawn_holder(lock_path: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(REPO), str(lock_path), "apply", "examples/"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_lock_writes_holder_and_clears_it_on_release(tmp_path):
    path = tmp_path / "host" / "lock"
    with Lock(path) as lk:
        assert lk.held
        info = json.loads(path.read_text())
        assert info["pid"] == os.getpid()
        assert isinstance(info["cmdline"], str) and info["cmdline"]
        assert info["started"].endswith("Z")
    assert not lk.held
    assert path.exists() and path.read_text() == ""  # the file stays; its details go


def test_second_acquirer_in_another_process_fails_fast_naming_the_holder(tmp_path):
    path = tmp_path / "host" / "lock"
    holder = spawn_holder(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(LockHeld) as e:
            Lock(path).acquire()
        assert time.monotonic() - t0 < 1.0  # fail fast, no waiting
        err = e.value
        assert err.pid == holder.pid
        assert err.cmdline == "nftrec apply examples/"  # basename of argv[0], then the arguments
        assert err.started and err.started.endswith("Z")
        msg = str(err)
        assert f'another nftrec (pid {holder.pid}, "nftrec apply examples/", since ' in msg
        assert f"holds {path}; wait for it or stop it" in msg
    finally:
        stop(holder)


def test_lock_is_released_when_the_holder_is_killed(tmp_path):
    path = tmp_path / "host" / "lock"
    holder = spawn_holder(path)
    with pytest.raises(LockHeld):
        Lock(path).acquire()
    holder.send_signal(signal.SIGKILL)
    assert holder.wait() == -signal.SIGKILL
    holder.stdout.close()
    # the kernel dropped the flock; the file still names the dead pid, which does not matter
    assert json.loads(path.read_text())["pid"] == holder.pid
    with Lock(path):
        assert json.loads(path.read_text())["pid"] == os.getpid()


RACE = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from reconciler.engine.lock import Lock, LockHeld
    go = sys.argv[3]
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        with Lock(sys.argv[2]):
            print("won", os.getpid(), flush=True)
            time.sleep(1.0)
    except LockHeld as e:
        print("lost", e.pid, flush=True)
    """
)


def test_two_processes_race_exactly_one_wins(tmp_path):
    path = tmp_path / "netns" / "blue" / "lock"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", RACE, str(REPO), str(path), str(go)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    time.sleep(0.3)  # both started and waiting for the signal
    go.touch()
    results = {}
    for p in procs:
        out, _ = p.communicate(timeout=10)
        results[p.pid] = out.split()
    outcomes = sorted(r[0] for r in results.values())
    assert outcomes == ["lost", "won"], results
    [winner] = [pid for pid, r in results.items() if r[0] == "won"]
    [loser] = [r for r in results.values() if r[0] == "lost"]
    assert int(loser[1]) == winner  # the loser names the winner's pid
    assert int(results[winner][1]) == winner


def test_same_process_second_lock_is_refused_too(tmp_path):
    path = tmp_path / "lock"
    with Lock(path):
        with pytest.raises(LockHeld) as e:
            Lock(path).acquire()
        assert e.value.pid == os.getpid()


def test_timeout_waits_for_release(tmp_path):
    path = tmp_path / "lock"
    holder = spawn_holder(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(LockHeld):
            Lock(path, timeout=0.3, poll=0.05).acquire()
        assert 0.25 <= time.monotonic() - t0 < 2
    finally:
        stop(holder)
    with Lock(path, timeout=1):
        pass


def test_the_lock_lives_in_the_namespace_directory(tmp_path):
    assert StateStore(tmp_path).lock_path == tmp_path / "host" / "lock"
    assert StateStore(tmp_path, "blue").lock_path == tmp_path / "netns" / "blue" / "lock"


def test_unknown_holder_details():
    msg = str(LockHeld(Path("/var/lib/nftrec/host/lock"), Holder.parse("garbage")))
    assert msg == "another nftrec (pid unknown) holds /var/lib/nftrec/host/lock; wait for it or stop it"
    h = Holder(1234, "nftrec apply examples/", "2026-05-09T12:00:01Z")
    assert str(LockHeld(Path("/var/lib/nftrec/host/lock"), h)) == (
        'another nftrec (pid 1234, "nftrec apply examples/", since 2026-05-09T12:00:01Z) '
        "holds /var/lib/nftrec/host/lock; wait for it or stop it"
    )


def test_lock_fd_is_not_inherited_by_children(tmp_path):
    """An `nft` child that outlives us must not keep the lock (fds are close-on-exec)."""
    path = tmp_path / "lock"
    lk = Lock(path).acquire()
    child = subprocess.Popen(["sleep", "30"], close_fds=False)  # even when a caller keeps fds open
    try:
        lk.release()
        with Lock(path):  # would fail if `sleep` had inherited the locked descriptor
            pass
    finally:
        child.kill()
        child.wait()
