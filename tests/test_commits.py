"""engine/commits.py: the commit record's lines, torn and damaged ones, its sequence, its
rewrite, and which commit the history lacks. No kernel."""

from __future__ import annotations

import json

import pytest

from reconciler.engine import commits
from reconciler.engine.commits import append_commit, commit_ahead, decode, newest_commit, read_commits, record_path
from reconciler.engine.state import StateStore
from reconciler.kernel import canonical, fingerprint
from reconciler.intake.signatures import Baseline
from test_state import ruleset


@pytest.fixture
def store(tmp_path):
    return StateStore(tmp_path, None, "nftrec")


def add(store, n: int, **kw):
    args = dict(revision=f"rev{n}", writer="nftrec watch", kind="partial", token=1000 + n, operations=n,
                services=[f"~default/svc{n}"])
    return append_commit(store, **{**args, **kw})


def test_entries_round_trip_with_sequence_and_checksum(store):
    for n in range(1, 4):
        assert add(store, n).sequence == n
    lines = record_path(store).read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4
    doc = json.loads(lines[2])
    assert (doc["sequence"], doc["revision"], doc["token"], doc["services"]) == (3, "rev3", 1003, ["~default/svc3"])
    assert list(doc)[-1] == "check"
    got = read_commits(store)
    assert [c.sequence for c in got] == [1, 2, 3] and got[-1].services == ("~default/svc3",)
    assert got[-1].services_changed == 1 and got[-1].writer == "nftrec watch"


def test_a_torn_last_entry_is_ignored_and_replaced(store):
    for n in range(1, 4):
        add(store, n)
    path = record_path(store)
    whole = path.read_bytes()
    last = whole.rstrip(b"\n").rfind(b"\n") + 1
    for cut in range(last + 1, len(whole)):  # every way an append can be cut short
        path.write_bytes(whole[:cut])
        assert [c.sequence for c in read_commits(store)] == [1, 2], cut
        assert newest_commit(store).revision == "rev2"
    c = add(store, 9)  # the next append rewrites the file without the torn end
    assert c.sequence == 3
    assert path.read_bytes().endswith(b"\n")
    assert [x.revision for x in read_commits(store)] == ["rev1", "rev2", "rev9"]
    assert all(decode(line) for line in path.read_bytes().splitlines())


def test_a_damaged_entry_is_never_trusted(store):
    for n in range(1, 4):
        add(store, n)
    path = record_path(store)
    lines = path.read_bytes().splitlines(keepends=True)
    for bad in (lines[1].replace(b'"rev2"', b'"rev7"'),  # content changed, checksum kept
                lines[1].replace(b'"token":1002', b'"token":"1002"'),  # wrong type
                lines[1][:20] + lines[1][21:],  # a byte lost
                b"\0" * (len(lines[1]) - 1) + b"\n"):  # what a power loss can leave
        path.write_bytes(lines[0] + bad + lines[2])
        assert [c.revision for c in read_commits(store)] == ["rev1", "rev3"]
    path.write_bytes(lines[0] + lines[1] + lines[2].replace(b'"rev3"', b'"rev8"'))
    assert newest_commit(store).revision == "rev2"
    assert add(store, 4).sequence == 3  # after the last whole entry


def test_sequence_continues_from_status_when_the_record_is_gone(store):
    rs = ruleset(1)
    store.record_applied("rev1", rs, None, None, commit=41)
    assert commit_ahead(store, store.status()) is None
    c = add(store, 2)
    assert c.sequence == 42 and commit_ahead(store, store.status()) == c
    store.record_applied("rev2", ruleset(2), None, None, commit=c.sequence)
    assert commit_ahead(store, store.status()) is None and store.status().commit_sequence == 42


def test_record_is_rewritten_past_its_size_bound(store, monkeypatch):
    monkeypatch.setattr(commits, "COMPACT_AT", 2000)
    monkeypatch.setattr(commits, "KEEP", 4)
    for n in range(1, 30):
        assert add(store, n).sequence == n
        assert record_path(store).stat().st_size <= 2000 + 400
    assert [c.sequence for c in read_commits(store)][-1] == 29 and len(read_commits(store)) <= 12


def test_a_long_entry_names_fewer_services(store):
    c = add(store, 1, services=[f"+ns/{'x' * 250}{k}" for k in range(40)])
    assert c.services_changed == 40 and 0 < len(c.services) <= 10
    assert len(record_path(store).read_bytes()) <= 4096


def test_a_listed_entry_gives_way_to_the_same_ruleset_compiled(store):
    """Rollback must never go back to the same rules: a listed entry (kept from the kernel
    after a crash) is deleted when the next entry holds its ruleset."""
    store.record_applied("rev1", ruleset(1), None, None)
    listed = canonical(ruleset(2))
    listed.owners.clear()  # a listing has no owners: another digest
    store.record_applied("rev2", listed, fingerprint(listed), None, listed=True)
    assert len(store.history()) == 2
    store.record_applied("rev2", ruleset(2), None, None)
    assert [e.revision for e in store.history()] == ["rev1", "rev2"]
    assert store.previous().revision == "rev1"
    store.record_applied("rev3", canonical(ruleset(3)), "fp3", None, listed=True)
    store.record_applied("rev4", ruleset(4), None, None)  # another ruleset: the listed entry stays
    assert [e.revision for e in store.history()] == ["rev1", "rev2", "rev3", "rev4"]


def test_rollback_baseline_is_the_newer_record_with_the_signed_time(store):
    """The fsynced record when status.json lags or is damaged; status.json when it is newer
    (the no-op fast path moves it without a commit); the signed time from either."""
    from reconciler.engine.commits import rollback_baseline

    assert rollback_baseline(store) is None  # nothing applied: trust on first use
    c = add(store, 1, revision_time=1000, trust="first-use")
    store.record_applied("rev1", ruleset(1), None, None, commit=c.sequence, revision_time=1000, trust="first-use")
    assert rollback_baseline(store) == Baseline("rev1", 1000, "status")
    add(store, 2, revision_time=2000, trust="signed")  # status.json not written yet
    assert rollback_baseline(store) == Baseline("rev2", 2000, "commits")
    store.status_path.write_text("{ damaged")
    assert rollback_baseline(store) == Baseline("rev2", 2000, "commits")
    store.record_applied("rev2", ruleset(2), None, None, commit=2)  # a record without the time: the other's
    assert rollback_baseline(store) == Baseline("rev2", 2000, "status")
    store.record_noop("rev3")  # newer than the record, which names no later commit
    assert rollback_baseline(store) == Baseline("rev3", None, "status")


def test_entries_of_older_nftrecs_read_without_time_and_trust(store):
    add(store, 1)
    line = record_path(store).read_bytes().rstrip(b"\n")
    doc = json.loads(line)
    for key in ("revisionTime", "trust", "check"):
        del doc[key]
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    record_path(store).write_bytes(body[:-1] + f',"check":"{commits._check(body)}"}}\n'.encode())
    c = newest_commit(store)
    assert c.revision == "rev1" and c.revision_time is None and c.trust is None
