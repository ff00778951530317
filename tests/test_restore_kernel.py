"""`nftrec apply --restore` against the real kernel, in a throwaway namespace: after
`nft flush ruleset` (what Debian's nftables.service does on stop) the last applied ruleset
comes back from the state directory alone, with the same digest, though a local hold is
set; a missing, damaged or absent record is refused with exit 1 and the kernel's whole
listing (a foreign table included) left as it was; a kernel that already matches is a
no-op that commits nothing (the generation token stays); tables `nftrec cleanup` removed
stay removed; a running watch is left to repair by itself (exit 0)."""

from __future__ import annotations

import json
import shutil

import pytest

from nsutil import in_ns
from reconciler.kernel import Libnftables, kernel_token
from test_cli_kernel import EDGE, EXIT_USAGE, nftrec, ok

pytestmark = pytest.mark.kernel


def _ours(ns: str) -> list[str]:
    """nftrec's tables as nft lists them, line by line (objects come back in creation order)."""
    return sorted((in_ns(ns, "nft", "list", "table", "ip", "nftrec").stdout
                   + in_ns(ns, "nft", "list", "table", "ip6", "nftrec").stdout).splitlines())


def _ruleset(ns: str) -> str:
    return in_ns(ns, "nft", "list", "ruleset").stdout


def _flushed(ns: str) -> str:
    """`flush ruleset`, then a foreign table an admin or another tool made: the listing."""
    in_ns(ns, "nft", "flush", "ruleset")
    in_ns(ns, "nft", "add table inet foreign; add chain inet foreign input { type filter hook input priority 0; }")
    return _ruleset(ns)


def _token(ns: str) -> int:
    nft = Libnftables(ns)
    try:
        return kernel_token(nft)
    finally:
        nft.close()


@pytest.fixture
def applied(netns, tmp_path):
    state = tmp_path / "state"
    ok(nftrec("apply", str(EDGE), state=state, ns=netns))
    return state, state / "netns" / netns / "tables" / "nftrec"


def test_restore_after_a_flush_brings_the_same_ruleset_back_though_held(netns, applied):
    state, table = applied
    before, status = _ours(netns), json.loads((table / "status.json").read_text())
    ok(nftrec("hold", "--reason", "maintenance", state=state, ns=netns, config=False))
    _flushed(netns)
    p = ok(nftrec("apply", "--restore", state=state, ns=netns, config=False))
    assert "Restore complete" in p.stdout and status["desiredDigest"][:12] in p.stdout, p.stdout
    assert _ours(netns) == before
    assert "table inet foreign" in _ruleset(netns)  # a neighbour's table is not nftrec's to remove
    after = json.loads((table / "status.json").read_text())
    assert after["desiredDigest"] == status["desiredDigest"]
    assert after["lastAppliedRevision"] == status["lastAppliedRevision"]
    assert len(list((table / "history").iterdir())) == 1  # a commit, no new history entry
    last = json.loads((table / "commits.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "restore" and last["sequence"] == after["commitSequence"], last
    doc = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=netns)).stdout)
    assert doc["drift"] is False, doc
    # the next apply of the same manifests is the no-op fast path: the record is the kernel's
    p = ok(nftrec("apply", str(EDGE), "--ignore-hold", state=state, ns=netns))
    assert "unchanged since the last apply" in p.stdout, p.stdout


def test_restore_when_the_kernel_already_matches_commits_nothing(netns, applied):
    state, table = applied
    token, commits = _token(netns), (table / "commits.jsonl").read_bytes()
    p = ok(nftrec("apply", "--restore", state=state, ns=netns, config=False))
    assert "Nothing to restore" in p.stdout and "0 operations" in p.stdout, p.stdout
    assert _token(netns) == token
    assert (table / "commits.jsonl").read_bytes() == commits


def _damage_status(table):
    (table / "status.json").write_text('{"formatVersion": 1, "netns": ')


def _drop_entry(table):
    for f in (table / "history").iterdir():
        f.unlink()


def _damage_entry(table):
    for f in (table / "history").iterdir():
        f.write_bytes(f.read_bytes()[:200] + b"\x00junk\n")


def _no_state(table):
    shutil.rmtree(table.parent.parent.parent.parent)


@pytest.mark.parametrize("damage,says", [
    (_damage_status, "status.json"), (_drop_entry, "is not in the history"), (_damage_entry, "history"),
    (_no_state, "records no applied ruleset"),
], ids=["damaged-status", "missing-entry", "damaged-entry", "no-state"])
def test_restore_refuses_a_missing_or_damaged_record_and_changes_nothing(netns, applied, damage, says):
    state, table = applied
    listing = _flushed(netns)
    damage(table)
    kept = sorted(p.relative_to(state) for p in state.rglob("*")) if state.exists() else None
    p = ok(nftrec("apply", "--restore", state=state, ns=netns, config=False), 1)
    assert "nothing restored" in p.stderr and says in p.stderr, p.stderr
    assert "nftrec apply" in p.stderr, p.stderr  # what to do
    assert _ruleset(netns) == listing
    if kept is None:
        assert not state.exists()  # nothing is created for a state that never was
    else:
        assert sorted(p.relative_to(state) for p in state.rglob("*")) == kept  # nothing moved aside or rebuilt


def test_restore_takes_no_source_and_no_node_config(netns, tmp_path):
    for extra in (["--config", str(EDGE.parent / "edge-small.config.yaml")], [str(EDGE)], ["--rollback"]):
        p = nftrec("apply", "--restore", *extra, state=tmp_path, ns=netns, config=False)
        assert p.returncode == EXIT_USAGE and "--restore takes only --netns" in p.stderr, p.stderr


def test_restore_leaves_a_running_watch_to_repair_by_itself(netns, tmp_path):
    from test_cli_kernel import CONFIG
    from watchproc import Watch

    w = Watch(netns, EDGE, CONFIG, tmp_path / "state", metrics=False)  # its state writer: status.json comes later
    try:
        w.wait_sync(0)
        p = ok(nftrec("apply", "--restore", state=tmp_path / "state", ns=netns, config=False))
        assert "the watch daemon" in p.stdout and "repairs" in p.stdout, p.stdout
    finally:
        assert w.stop() == 0


def test_tables_cleanup_removed_stay_removed(netns, applied):
    state, _table = applied
    ok(nftrec("cleanup", state=state, ns=netns))
    listing = _flushed(netns)
    p = ok(nftrec("apply", "--restore", state=state, ns=netns, config=False))
    assert "Nothing to restore" in p.stdout and "cleanup" in p.stdout, p.stdout
    assert _ruleset(netns) == listing
