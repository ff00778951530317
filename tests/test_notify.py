"""systemd's notification protocol as `nftrec watch` speaks it, received on a real
AF_UNIX datagram socket given as $NOTIFY_SOCKET (a path, and an abstract name), with the
real daemon in a throwaway namespace: READY=1 only once the kernel holds the first sync's
ruleset, WATCHDOG=1 repeatedly from the sync loop with $WATCHDOG_USEC, RELOADING=1 then
READY=1 around SIGHUP, STOPPING=1 on SIGTERM; nothing without $NOTIFY_SOCKET, and no
watchdog when $WATCHDOG_PID names another process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest

from reconciler.daemon.notify import Notifier
from test_cli_kernel import CONFIG, EDGE
from watchproc import Watch


class Listener:
    """A bound datagram socket and the messages it received, each with whether the
    namespace's kernel held nftrec's table at that moment (`ns`)."""

    def __init__(self, address: str, ns: str | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.ns, self.got, self.stop = ns, [], False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop:
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            held = None
            if self.ns and "READY=1" in data.split("\n"):
                held = subprocess.run(["ip", "netns", "exec", self.ns, "nft", "list", "table", "ip", "nftrec"],
                                      capture_output=True).returncode == 0
            self.got.append((time.monotonic(), data.split("\n"), held))

    def lines(self, name: str) -> list:
        return [(t, held) for t, lines, held in self.got if name in lines]

    def wait(self, name: str, count: int = 1, timeout: float = 20):
        deadline = time.monotonic() + timeout
        while len(self.lines(name)) < count:
            assert time.monotonic() < deadline, f"{count} x {name} not received: {self.got}"
            time.sleep(0.05)

    def close(self):
        self.stop = True
        self.t.join(2)
        self.sock.close()


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_messages_arrive_and_the_variables_leave_the_environment(tmp_path, abstract):
    address = f"@nftrec-test-{uuid.uuid4().hex[:8]}" if abstract else str(tmp_path / "notify")
    listener = Listener(address)
    try:
        env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid()), "X": "1"}
        n = Notifier(env)
        assert env == {"X": "1"}  # no child inherits them
        assert n.interval == 1.0
        n.synced(True, "revision abc\napplied")
        n.tick()
        n.tick()  # not due yet: one WATCHDOG=1
        listener.wait("WATCHDOG=1")
        time.sleep(0.3)
        assert [lines for _, lines, _ in listener.got] == [["READY=1", "STATUS=revision abc applied"],
                                                            ["WATCHDOG=1"]]
    finally:
        listener.close()


def test_nothing_without_notify_socket_and_no_watchdog_for_another_pid(tmp_path):
    n = Notifier({"WATCHDOG_USEC": "2000000"})
    assert n.address == "" and n.interval is None
    n.synced(True, "x")  # no socket: nothing happens, nothing fails
    other = Notifier({"NOTIFY_SOCKET": str(tmp_path / "s"), "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.interval is None


@pytest.mark.kernel
def test_the_daemon_is_ready_after_its_first_sync_and_pings_from_its_loop(netns, tmp_path, monkeypatch):
    listener = Listener(str(tmp_path / "notify"), ns=netns)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    w = Watch(netns, EDGE, CONFIG, tmp_path / "state")
    try:
        listener.wait("READY=1")
        assert listener.lines("READY=1") == [(listener.lines("READY=1")[0][0], True)]  # the table was there
        start = len(listener.lines("WATCHDOG=1"))
        listener.wait("WATCHDOG=1", start + 3, timeout=10)  # about one a second: half of 2 s, on the loop's turn
        assert any(line.startswith("STATUS=revision") for _, lines, _ in listener.got for line in lines)
        w.proc.send_signal(signal.SIGHUP)
        listener.wait("RELOADING=1")
        listener.wait("READY=1", 2)
        assert listener.lines("RELOADING=1")[0][0] <= listener.lines("READY=1")[1][0]
    finally:
        rc = w.stop()
        listener.wait("STOPPING=1", timeout=5)
        listener.close()
    assert rc == 0
