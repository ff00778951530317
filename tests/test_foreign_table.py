"""A foreign table that this machine's nft cannot read cannot kill nftrec.

The table is written over raw netlink, as a newer nft writes it: a set whose user data
holds a `typeof` key description this nft's parser dereferences without checking (nft
1.1.3 writes it for every set; nft 1.0.6 and 0.9.8 segfault reading it). Beside it, a
cold `apply`, `cleanup` and `doctor` each finish with a clear message or succeed, none
crashes, and the foreign table stays byte for byte as it was; `watch` outlives it.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import struct
import subprocess
import time

import pytest

from nsutil import EXAMPLES, in_ns
from reconciler.kernel import NamespaceThread, in_child, run, run_nft
from test_cli_kernel import CONFIG, nftrec
from watchproc import Watch

pytestmark = pytest.mark.kernel

_NFNL_SUBSYS_NFTABLES = 10
_NEWTABLE, _NEWSET, _GETSET = 0, 9, 10
_BATCH_BEGIN, _BATCH_END = 0x10, 0x11
_REQUEST, _ACK, _CREATE, _DUMP = 0x1, 0x4, 0x400, 0x300
_AF_INET = 2
_TABLE = "foreign"

# NFTA_SET_USERDATA as nft 1.1.3 writes it for `set s { type ipv4_addr; comment "…"; }`:
# key byte order (big endian), the key's `typeof` (expression type 4, a value, and an empty
# data attribute: older nft calls that type's missing udata parser), and the comment.
_USERDATA = (bytes.fromhex("0004" "02000000") + bytes.fromhex("0308" "0004" "04000000" "0100")
             + b"\x07\x13written by new nft\x00")


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _msg(kind: int, flags: int, seq: int, family: int, attrs: bytes, res_id: int = 0) -> bytes:
    body = struct.pack("=BBH", family, 0, socket.htons(res_id)) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def _talk(sock: socket.socket, data: bytes, dump_seq: int | None = None) -> list[bytes]:
    """Send, then read until every request is acknowledged (or the dump is done)."""
    sock.send(data)
    msgs = []
    while True:
        buf = sock.recv(1 << 16)
        off = 0
        while off + 16 <= len(buf):
            length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", buf, off)
            if kind == 2:  # NLMSG_ERROR: an ack (0) or an errno
                (err,) = struct.unpack_from("=i", buf, off + 16)
                assert err == 0, f"netlink request {seq} failed: errno {-err}"
                if dump_seq is None and seq == 3:
                    return msgs
            elif kind == 3:  # NLMSG_DONE
                return msgs
            else:
                msgs.append(buf[off:off + length])
            off += (length + 3) & ~3


def write_foreign_table() -> None:
    """NFT_MSG_NEWTABLE + NFT_MSG_NEWSET in one batch, on the calling thread's namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12) as sock:  # NETLINK_NETFILTER
        sock.bind((0, 0))
        sub = _NFNL_SUBSYS_NFTABLES << 8
        name = _TABLE.encode() + b"\0"
        set_attrs = (_attr(1, name) + _attr(2, b"s\0") + _attr(4, struct.pack(">I", 7))  # table, name, ipv4_addr
                     + _attr(5, struct.pack(">I", 4)) + _attr(10, struct.pack(">I", 1))  # key len, set id
                     + _attr(13, _USERDATA))
        batch = (_msg(_BATCH_BEGIN, _REQUEST, 0, 0, b"", res_id=_NFNL_SUBSYS_NFTABLES)
                 + _msg(sub | _NEWTABLE, _REQUEST | _CREATE | _ACK, 1, _AF_INET, _attr(1, name))
                 + _msg(sub | _NEWSET, _REQUEST | _CREATE | _ACK, 3, _AF_INET, set_attrs)
                 + _msg(_BATCH_END, _REQUEST, 4, 0, b"", res_id=_NFNL_SUBSYS_NFTABLES))
        _talk(sock, batch)


def foreign_sets() -> list[bytes]:
    """The kernel's NFT_MSG_GETSET answers for the foreign table, bytes after the header."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12) as sock:
        sock.bind((0, 0))
        req = _msg((_NFNL_SUBSYS_NFTABLES << 8) | _GETSET, _REQUEST | _DUMP, 9, _AF_INET,
                   _attr(1, _TABLE.encode() + b"\0"))
        return [m[16:] for m in _talk(sock, req, dump_seq=9)]


def in_thread(ns: str, fn):
    worker = NamespaceThread(ns)
    try:
        return worker.call(fn)
    finally:
        worker.close()


@pytest.fixture
def poisoned(netns):
    """The namespace with the foreign table, after checking that this nft crashes on it
    (a newer nft reads it: then the scenario does not exist here)."""
    in_thread(netns, write_foreign_table)
    probe = run_nft(netns, ["list", "ruleset"], timeout=30)
    if not probe.crashed:
        pytest.skip(f"this nft reads the table ({probe.reason() if not probe.ok else 'listed it'}): nothing to guard")
    return netns


def _no_crash(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode not in (139, -signal.SIGSEGV, 134, -signal.SIGABRT), \
        f"{' '.join(proc.args)} crashed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def test_apply_cleanup_doctor_beside_an_unreadable_table(poisoned, tmp_path):
    before = in_thread(poisoned, foreign_sets)
    assert len(before) == 1
    state = tmp_path / "state"
    apply = nftrec("apply", str(EXAMPLES / "edge-small"), state=state, ns=poisoned)
    _no_crash(apply)
    # nft cannot build a transaction without reading every table here: a clear refusal
    assert apply.returncode == 1, apply.stdout + apply.stderr
    assert "libnftables crashed (SIGSEGV)" in apply.stderr and "ip foreign" in apply.stderr, apply.stderr
    assert "nothing was changed" in apply.stderr

    cleanup = nftrec("cleanup", "--kube-proxy", state=state, ns=poisoned)
    _no_crash(cleanup)
    assert cleanup.returncode in (0, 1) and "Traceback" not in cleanup.stderr
    assert "not present: table ip nftrec" in cleanup.stdout, cleanup.stdout

    doctor = nftrec("doctor", state=state, ns=poisoned)
    _no_crash(doctor)
    assert "crashed (SIGSEGV)" in doctor.stdout and "newer nft" in doctor.stdout, doctor.stdout
    assert in_thread(poisoned, foreign_sets) == before


def test_a_child_that_crashes_hangs_or_fails_is_an_outcome_with_its_reason():
    ok = in_child(lambda: b"x" * (1 << 20), what="work", timeout=30)
    assert ok.ok and ok.stdout == b"x" * (1 << 20)  # more than a pipe holds
    crash = in_child(lambda: ctypes.string_at(0), what="libnftables", timeout=30)
    assert crash.crashed and crash.signal == signal.SIGSEGV
    assert crash.reason("reading the ruleset") == ("libnftables crashed (SIGSEGV) reading the ruleset: a table "
                                                   "written by a newer nft, which this one cannot read?")
    hang = in_child(lambda: time.sleep(60), what="work", timeout=0.5)
    assert hang.timed_out and not hang.crashed and "did not finish in time" in hang.reason()
    failed = in_child(lambda: 1 / 0, what="work", timeout=30)
    assert failed.returncode == 1 and b"division by zero" in failed.stderr
    missing = run(None, ["nftrec-no-such-program"], timeout=5)
    assert missing.missing and not missing.ok and "is not installed" in missing.reason()


def test_a_program_runs_inside_the_namespace(netns):
    in_ns(netns, "nft", "add", "table", "ip", "marker")
    listed = run_nft(netns, ["list", "tables"], timeout=30)
    assert listed.ok and b"table ip marker" in listed.stdout
    exited = run_nft(netns, ["list", "table", "ip", "absent"], timeout=30)
    assert exited.returncode == 1 and "No such file or directory" in exited.reason()


def test_watch_outlives_an_unreadable_table_and_recovers(netns, tmp_path):
    """The daemon's own repair of its tables (here the full sync's, every second) meets the
    table: the sync fails with the reason, the daemon lives on, and once the table is gone
    the next sync restores nftrec's tables."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.read_text().replace("syncPeriod: 30s", "syncPeriod: 1s")
                      .replace("fullSyncPeriod: 1h", "fullSyncPeriod: 1s"))
    watch = Watch(netns, EXAMPLES / "edge-small", config, tmp_path / "state", metrics=False)
    try:
        watch.wait_sync(0)
        since = len(watch.lines)
        in_ns(netns, "nft", "flush", "ruleset")
        in_thread(netns, write_foreign_table)
        if not run_nft(netns, ["list", "ruleset"], timeout=30).crashed:
            pytest.skip("this nft reads the table: nothing to guard")
        failed = watch.wait(lambda: next((x for x in watch.events("sync", since) if x.get("ok") is False), None),
                            timeout=30, what="a failed sync")
        assert "libnftables crashed (SIGSEGV)" in failed["msg"] and "ip foreign" in failed["msg"], failed
        assert in_thread(netns, foreign_sets)  # untouched
        since = len(watch.lines)
        in_ns(netns, "nft", "flush", "ruleset")  # nft reads no table to flush them all
        watch.wait_sync(since)
        assert "table ip nftrec" in in_ns(netns, "nft", "list", "tables").stdout
    finally:
        assert watch.stop() == 0
