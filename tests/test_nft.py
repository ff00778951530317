"""reconciler/kernel: Transaction, Fake, and libnftables against a real kernel.

Real-kernel tests run only inside namespaces made by the `netns` fixture; the host
ruleset is only ever read (`nft list ruleset`), to prove it did not change.
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from nsutil import in_ns, sh
from reconciler import heap
from reconciler.kernel import Fake, Libnftables, NftError, NotFound, Transaction
from reconciler.kernel import libnftables as nftmod
from reconciler.compile.ruleset import BaseHook, Chain, Element, NamedSet, Rule, Table

T = "nftrec"
MAP = NamedSet("service-ips", "ipv4_addr . inet_proto . inet_service", "verdict", comment="svc ips")
CIPS = NamedSet("cluster-ips", "ipv4_addr", comment="Active ClusterIPs")
SVC = Chain("service-AAAAAAAA-ns/web/tcp/http")


def small_tx() -> Transaction:
    tx = Transaction()
    tx.add_table(Table("ip", T, comment="rules for nftrec"))
    tx.add("ip", T, Chain("nat-prerouting", base=BaseHook("nat", "prerouting", -100)))
    tx.add("ip", T, Chain("services"))
    tx.add("ip", T, SVC)
    tx.add("ip", T, MAP)
    tx.add("ip", T, CIPS)
    tx.add_rule("ip", T, "nat-prerouting", Rule("jump services"))
    tx.add_rule("ip", T, "services", Rule("ip daddr . meta l4proto . th dport vmap @service-ips"))
    tx.add_rule("ip", T, SVC.name, Rule("meta l4proto tcp dnat to 10.0.0.5:8080", "web"))
    tx.add("ip", T, Element(("172.30.0.1", "tcp", "80"), f"goto {SVC.name}"), set=MAP)
    tx.add("ip", T, Element(("172.30.0.1",)), set=CIPS)
    return tx


# --- Transaction ---------------------------------------------------------------------------


def test_transaction_counts_ops_and_renders_script():
    tx = small_tx()
    assert len(tx) == 11
    lines = tx.text().splitlines()
    assert lines[0] == 'add table ip nftrec { comment "rules for nftrec" ; }'
    assert lines[1] == "add chain ip nftrec nat-prerouting { type nat hook prerouting priority -100 ; }"
    assert lines[9] == f"add element ip nftrec service-ips {{ 172.30.0.1 . tcp . 80 : goto {SVC.name} }}"
    assert lines[8].endswith('dnat to 10.0.0.5:8080 comment "web"')
    tx2 = Transaction().flush("ip", T, Chain("x")).delete("ip", T, MAP).delete(
        "ip", T, Element(("1.2.3.4", "tcp", "80"), "drop"), set=MAP
    )
    assert tx2.ops == (
        "flush chain ip nftrec x",
        "delete map ip nftrec service-ips",
        "delete element ip nftrec service-ips { 1.2.3.4 . tcp . 80 }",
    )
    # what libnftables reads: the same script, as bytes, built in one join
    assert tx.script() == tx.text().encode() and tx.script().endswith(b"\n")
    assert Transaction().script() == b""
    # big ones are streamed to a file instead: the same bytes, and their size without them
    import io

    tx.raw('add chain ip nftrec café { comment "ünïcode" ; }')
    for t in (tx, Transaction(), Transaction().extend(tx).extend(tx)):
        f = io.BytesIO()
        t.write(f)
        assert f.getvalue() == t.script() and t.size() == len(t.script())
    with pytest.raises(TypeError):
        Transaction().add("ip", T, Element(("1.2.3.4",)))  # an element needs its set
    with pytest.raises(ValueError):
        Transaction().raw("add table ip a\nadd table ip b")


# --- Fake ----------------------------------------------------------------------------------


def test_fake_runs_and_lists():
    f = Fake()
    assert f.list_table("ip", T) is None
    f.run(small_tx())
    assert f.list_tables() == [("ip", T)]
    text = f.list_table("ip", T)
    assert 'comment "rules for nftrec"' in text
    assert "type nat hook prerouting priority -100; policy accept;" in text
    assert f"172.30.0.1 . tcp . 80 : goto {SVC.name}" in text
    assert f.generation() == 1


def test_fake_is_atomic_and_fails_like_the_kernel():
    f = Fake()
    f.run(small_tx())
    before = f.list_table("ip", T)
    bad = Transaction().add("ip", T, Chain("new")).add_rule("ip", T, "missing", Rule("drop"))
    with pytest.raises(NotFound):
        f.run(bad)
    assert f.list_table("ip", T) == before  # nothing of the failed transaction stayed
    assert f.generation() == 1
    with pytest.raises(NotFound):
        f.run(Transaction().delete("ip", T, Chain("nope")))
    with pytest.raises(NotFound):
        f.run(Transaction().delete_table("ip6", T))
    with pytest.raises(NotFound):
        f.run(Transaction().delete("ip", T, Element(("9.9.9.9",)), set=CIPS))
    with pytest.raises(NotFound):  # map value naming a missing chain
        f.run(Transaction().add("ip", T, Element(("1.1.1.1", "tcp", "1"), "goto nope"), set=MAP))
    with pytest.raises(NftError, match="busy"):  # still referenced by the map element
        f.run(Transaction().delete("ip", T, SVC))
    with pytest.raises(NftError, match="busy"):  # set still used by a rule
        f.run(Transaction().delete("ip", T, MAP))
    # Dropping the reference first in the same transaction is fine.
    ok = Transaction().delete("ip", T, Element(("172.30.0.1", "tcp", "80")), set=MAP).delete("ip", T, SVC)
    f.run(ok)
    assert SVC.name not in f.list_table("ip", T)
    with pytest.raises(NftError, match="Operation not supported"):
        f.run(Transaction().add("ip", T, Chain("nat-prerouting", base=BaseHook("nat", "prerouting", -90))))


def test_fake_check_changes_nothing():
    f = Fake()
    f.check(small_tx())
    assert f.list_tables() == []
    with pytest.raises(NotFound):
        f.check(Transaction().add_rule("ip", T, "x", Rule("drop")))


def test_run_script_restores_a_listing(backend):
    """What a confirmed apply's rollback runs: delete the table, then its listing."""
    backend.run(small_tx())
    listing = backend.list_table("ip", T)
    backend.run(Transaction().add("ip", T, Chain("extra")).delete("ip", T, Element(("172.30.0.1",)), set=CIPS))
    backend.run_script(f"add table ip {T}\ndelete table ip {T}\n{listing}")
    assert backend.list_table("ip", T) == listing


def test_every_interface_method_is_on_the_fake_and_libnftables():
    from typing import Protocol

    from reconciler.kernel import Interface

    names = {n for n in vars(Interface) if not n.startswith("_") and n not in vars(Protocol)}
    assert {"run", "run_script", "netns_cookie", "in_namespace", "close"} <= names
    for cls in (Fake, Libnftables):
        assert all(callable(getattr(cls, n, None)) for n in names), cls


# --- libnftables, real kernel --------------------------------------------------------------


def host_ruleset() -> str:
    return sh("nft", "list", "ruleset").stdout  # read-only


def test_libnftables_runs_in_the_namespace_only(netns):
    host_before = host_ruleset()
    my_ns = os.readlink("/proc/thread-self/ns/net")
    with Libnftables(netns=netns) as nft:
        assert nft.list_table("ip", T) is None
        g0 = nft.generation()
        nft.run(small_tx())
        assert nft.generation() > g0
        text = nft.list_table("ip", T)
        assert ("ip", T) in nft.list_tables()
    assert f"goto {SVC.name}" in text
    assert "priority -100;" in text  # numeric priorities in listings
    assert host_ruleset() == host_before
    assert "table ip nftrec" in in_ns(netns, "nft", "list", "tables").stdout
    # the main thread is still in the host namespace
    assert os.readlink("/proc/thread-self/ns/net") == my_ns


def test_libnftables_transaction_is_atomic(netns):
    with Libnftables(netns=netns) as nft:
        nft.run(small_tx())
        before = nft.list_table("ip", T)
        gen = nft.generation()
        tx = Transaction().add("ip", T, Chain("extra")).add_rule("ip", T, "missing-chain", Rule("drop"))
        with pytest.raises(NotFound) as exc:
            nft.run(tx)
        assert "No such file or directory" in exc.value.text
        # nft's own error text, with a command of the batch. (nft 1.0.6 may point at a
        # neighbouring command of the failing one; the errno is right.)
        assert exc.value.text.startswith("Error: Could not process rule")
        assert exc.value.script == tx.text()  # handed over as bytes, reported as the text
        assert nft.list_table("ip", T) == before
        assert nft.generation() == gen


def test_libnftables_check_is_a_dry_run(netns):
    with Libnftables(netns=netns) as nft:
        nft.check(small_tx())
        assert nft.list_table("ip", T) is None
        gen = nft.generation()
        with pytest.raises(NftError):
            nft.check(Transaction().raw("add rule ip nftrec services bogus syntax here"))
        nft.run(small_tx())
        gen2 = nft.generation()
        nft.check(Transaction().add("ip", T, Chain("x")))
        assert nft.generation() == gen2 > gen
        assert "chain x" not in nft.list_table("ip", T)


def test_libnftables_errors(netns):
    with Libnftables(netns=netns) as nft:
        with pytest.raises(NotFound):
            nft.run(Transaction().delete_table("ip", "nope"))
        with pytest.raises(NftError) as exc:
            nft.run(Transaction().raw("add table ip nftrec").raw("add chain ip nftrec c { type bogus ; }"))
        assert not isinstance(exc.value, NotFound)
        assert "Error" in exc.value.text
        assert nft.list_table("ip", T) is None  # the first command did not commit either


def test_missing_netns_is_an_error_never_created():
    name = f"nftrec-t-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NftError, match="does not exist"):
        Libnftables(netns=name)
    assert not os.path.exists(f"/run/netns/{name}")
    with pytest.raises(NftError):
        Libnftables(netns="../etc")


def test_missing_library_message(monkeypatch):
    monkeypatch.setattr(nftmod, "_lib", None)
    monkeypatch.setattr(nftmod.ctypes.util, "find_library", lambda name: None)

    def no_lib(name, *a, **kw):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(nftmod.ctypes, "CDLL", no_lib)
    with pytest.raises(NftError, match="install the nftables package"):
        Libnftables()


def test_one_context_per_process_two_namespaces_in_turn(netns):
    """libnftables before 1.0 frees process-wide symbol tables with each context, so two
    open contexts abort the process (double free): a second Libnftables while one is
    open is refused, on every version; namespaces are worked on in turn."""
    from reconciler.kernel import SecondContext

    other = f"nftrec-t-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", other)
    try:
        a = Libnftables(netns=netns)
        try:
            with pytest.raises(SecondContext):
                Libnftables(netns=other)
            assert nftmod._contexts == 1
            a.run(small_tx())
            assert a.list_table("ip", T) is not None
            # usable from several caller threads; all work happens on the worker thread
            errs = []

            def worker():
                try:
                    for _ in range(20):
                        assert a.list_table("ip", T) is not None
                        a.generation()
                except Exception as e:  # pragma: no cover - reported below
                    errs.append(e)

            ts = [threading.Thread(target=worker) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert errs == []
        finally:
            a.close()
        assert nftmod._contexts == 0
        with Libnftables(netns=other) as b:
            assert b.list_table("ip", T) is None
        assert nftmod._contexts == 0
    finally:
        sh("ip", "netns", "del", other, check=False)


def test_renewed_context_is_freed_first(netns, monkeypatch):
    """A big listing replaces the context (_TRIM_AFTER): the old one is freed before the
    new one is made, so the count never passes one."""
    monkeypatch.setattr(nftmod, "_TRIM_AFTER", 1)
    with Libnftables(netns=netns) as nft:
        nft.run(small_tx())
        for _ in range(3):
            assert nft.list_table("ip", T) is not None
            assert nftmod._contexts == 1
    assert nftmod._contexts == 0


def test_big_transactions_are_read_from_a_file(netns, monkeypatch):
    """A transaction of _TRIM_AFTER bytes or more reaches nft as an unlinked temporary
    file (no copy of the script in memory): the kernel gets the same ruleset as from a
    buffer, and a failure quotes the failing line of the transaction."""
    with Libnftables(netns=netns) as nft:
        nft.run(small_tx())  # small: from memory
        from_buffer = nft.list_table("ip", T)
        nft.run(Transaction().delete_table("ip", T))
        files = []
        real = nftmod.tempfile.TemporaryFile

        def temporary_file(**kw):
            files.append(real(**kw))
            return files[-1]

        monkeypatch.setattr(nftmod.tempfile, "TemporaryFile", temporary_file)
        monkeypatch.setattr(nftmod, "_TRIM_AFTER", 40)
        nft.run(small_tx())
        assert len(files) == 1 and files[0].closed
        assert nft.list_table("ip", T) == from_buffer
        gen = nft.generation()
        bad = Transaction().add("ip", T, Chain("extra")).add_rule("ip", T, "missing-chain", Rule("drop"))
        with pytest.raises(NotFound) as exc:
            nft.run(bad)
        assert exc.value.text.startswith("transaction line 2:")  # not nft's /proc/self/fd/N
        assert "Could not process rule: No such file or directory" in exc.value.text
        assert "add rule ip nftrec missing-chain drop" in exc.value.text  # the failing line itself
        assert exc.value.script == bad.text()
        assert nft.generation() == gen and nft.list_table("ip", T) == from_buffer
        with pytest.raises(NftError):  # check: the same path, nothing committed
            nft.check(bad)
        assert len(files) == 3 and all(f.closed for f in files)
        # no usable temporary directory, or it is full: from memory, as before
        monkeypatch.setattr(nftmod.tempfile, "TemporaryFile", lambda **kw: (_ for _ in ()).throw(OSError("none")))
        nft.run(Transaction().add("ip", T, Chain("extra")).add("ip", T, Chain("extra2")))
        assert "chain extra2" in nft.list_table("ip", T)

        class Full:
            closed = False

            def write(self, data):
                raise OSError(28, "No space left on device")

            def close(self):
                self.closed = True

        full = Full()
        monkeypatch.setattr(nftmod.tempfile, "TemporaryFile", lambda **kw: full)
        nft.run(Transaction().add("ip", T, Chain("extra3")).add("ip", T, Chain("extra4")))
        assert full.closed and "chain extra4" in nft.list_table("ip", T)


def test_big_commands_leave_no_cache_behind(netns, monkeypatch):
    """nft keeps what a command listed or declared in its context's cache (~190 MB after
    listing a 10,000-Service table): after a big command the context is replaced."""
    made = []
    real = nftmod.Libnftables._new_ctx

    def new_ctx(self):
        made.append(real(self))  # the old context is freed first: malloc may reuse its address
        return made[-1]

    monkeypatch.setattr(nftmod.Libnftables, "_new_ctx", new_ctx)
    with Libnftables(netns=netns) as nft:
        nft.run(small_tx())
        listing = nft.list_table("ip", T)
        assert len(made) == 1  # small commands keep their context
        monkeypatch.setattr(nftmod, "_TRIM_AFTER", 100)
        assert nft.list_table("ip", T) == listing
        assert len(made) == 2 and nft._ctx == made[-1]
        monkeypatch.undo()
        nft.run(Transaction().add("ip", T, Chain("after")))  # the new context works
        assert "chain after" in nft.list_table("ip", T)


def test_big_commands_give_back_nfts_memory(netns, monkeypatch):
    """After a command with a big script or output, the C heap is trimmed (nft's freed
    memory stays in the worker thread's arena otherwise); small ones pay nothing."""
    calls = []
    monkeypatch.setattr(nftmod, "trim_heap", lambda: calls.append(1))
    with Libnftables(netns=netns) as nft:
        nft.list_table("ip", T)
        assert calls == []
        nft.run(small_tx())
        assert calls == []  # a small transaction: no trim before or after
        monkeypatch.setattr(nftmod, "_TRIM_AFTER", 100)
        assert "service-ips" in nft.list_table("ip", T)
        assert calls == [1]
        big = Transaction().add("ip", T, Chain("extra")).add("ip", T, Chain("extra2"))
        assert len(big.script()) >= 40
        monkeypatch.setattr(nftmod, "_TRIM_AFTER", 40)
        nft.run(big)
        assert calls == [1, 1, 1]  # before and after a big one
    monkeypatch.undo()
    heap._malloc_trim = None
    heap.trim_heap()  # the real one, twice: looked up once, then called
    heap.trim_heap()
