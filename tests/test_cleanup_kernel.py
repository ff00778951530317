"""`nftrec cleanup` against the real kernel: it records that the tables were removed on
purpose (status.json's cleanedUpAt), so `status` reports "cleaned up" with exit 0, not
drift; `apply --rollback` is refused (nothing is applied to roll back from); `watch`
applies the manifests afresh as a normal sync, with no drift repair. Beside a foreign
table libnftables cannot read, it deletes nftrec's own tables by netlink, and only those."""

from __future__ import annotations

import json

import pytest

from nsutil import EXAMPLES, in_ns
from reconciler.kernel import run_nft
from reconciler.kernel.netlink import NfTablesSocket
from test_cli_kernel import CONFIG, EDGE, nftrec, ok
from test_foreign_table import foreign_sets, in_thread, write_foreign_table
from watchproc import Watch

pytestmark = pytest.mark.kernel


def _tables(ns: str) -> set[tuple[str, str]]:
    """Every table of the namespace, by a netlink dump (no nft: it may not read them)."""
    def dump():
        sock = NfTablesSocket()
        try:
            return set(sock.tables())
        finally:
            sock.close()
    return in_thread(ns, dump)


def test_cleanup_is_recorded_status_rollback_and_watch(netns, tmp_path):
    state = tmp_path / "state"
    ok(nftrec("apply", str(EDGE), state=state, ns=netns))
    ok(nftrec("cleanup", state=state, ns=netns))
    assert not any(n == "nftrec" for _, n in _tables(netns))
    p = ok(nftrec("status", state=state, ns=netns))
    assert "cleaned up at" in p.stdout and "(nothing applied)" in p.stdout, p.stdout
    doc = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=netns)).stdout)
    assert doc["drift"] is False and doc["cleanedUpAt"], doc
    p = ok(nftrec("apply", "--rollback", state=state, ns=netns), 1)
    assert "nothing to roll back from" in p.stderr and "cleanup" in p.stderr, p.stderr
    assert not any(n == "nftrec" for _, n in _tables(netns))

    w = Watch(netns, EDGE, CONFIG, state)
    try:
        w.wait_sync(0, kind="full")
        st = w.status(until=lambda st: st.get("drift") is False and "cleanedUpAt" not in st)
        assert st["lastAppliedRevision"]
    finally:
        w.stop()
    assert not w.events("drift"), w.events("drift")  # a deliberate cleanup is no incident
    assert json.loads((state / "netns" / netns / "tables" / "nftrec" / "status.json").read_text())["cleanedUpAt"] is None
    ok(nftrec("status", state=state, ns=netns))


def test_cleanup_dry_run_and_a_never_applied_state_record_nothing(netns, tmp_path):
    state = tmp_path / "state"
    ok(nftrec("apply", str(EDGE), state=state, ns=netns))
    ok(nftrec("cleanup", "--dry-run", state=state, ns=netns))
    ok(nftrec("status", state=state, ns=netns))  # nothing removed: still applied, no drift
    other = tmp_path / "other"
    ok(nftrec("cleanup", state=other, ns=netns))
    assert not (other / "netns" / netns / "tables" / "nftrec" / "status.json").exists()


def test_cleanup_beside_an_unreadable_table_deletes_ours_by_netlink(netns, tmp_path):
    state = tmp_path / "state"
    ok(nftrec("apply", str(EXAMPLES / "edge-small"), state=state, ns=netns))
    in_ns(netns, "nft", "add", "table", "inet", "nftrec")  # same name, another family: not ours
    in_thread(netns, write_foreign_table)
    if not run_nft(netns, ["list", "ruleset"], timeout=30).crashed:
        pytest.skip("this nft reads the foreign table: nothing to fall back from")
    before = [m[4:] for m in in_thread(netns, foreign_sets)]  # after nfgenmsg, which carries the generation
    p = ok(nftrec("cleanup", state=state, ns=netns))
    assert "deleted table ip nftrec (by netlink" in p.stdout and "deleted table ip6 nftrec" in p.stdout, p.stdout
    assert _tables(netns) == {("ip", "foreign"), ("inet", "nftrec")}
    assert [m[4:] for m in in_thread(netns, foreign_sets)] == before  # the set, byte for byte
    p = ok(nftrec("status", state=state, ns=netns))
    assert "cleaned up at" in p.stdout, p.stdout
