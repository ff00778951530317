"""state.py: layout, atomic writes (incl. a real crash), history pruning, rollback, corruption."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.engine import state as state_mod
from reconciler.compile.ruleset import Chain, Element, NamedSet, Rule, Ruleset, Table
from reconciler.compile.serialize import digest
from reconciler.engine.state import (
    FORMAT_VERSION,
    HOST,
    StateCorrupt,
    StateStore,
    atomic_write,
    default_state_dir,
    namespace_dir,
)

REPO = Path(__file__).resolve().parent.parent


def ruleset(n: int) -> Ruleset:
    """A different ruleset for every n."""
    t = Table("ip", "nftrec")
    t.chains["services"] = Chain("services", rules=(Rule(f"ip daddr 10.0.0.{n} drop"),))
    s = NamedSet("cluster-ips", "ipv4_addr")
    s.add(Element((f"172.30.0.{n}",)))
    t.sets["cluster-ips"] = s
    return Ruleset(tables={"ip": t}, owners={"ip chain services": f"default/svc{n}"})


class Clock:
    def __init__(self):
        self.t = 0

    def __call__(self) -> str:
        self.t += 1
        return f"2026-05-09T12:{self.t // 60:02d}:{self.t % 60:02d}Z"


@pytest.fixture
def store(tmp_path):
    return StateStore(tmp_path, None, "nftrec", clock=Clock())


# --- paths -------------------------------------------------------------------------------


def test_default_state_dir(tmp_path):
    assert default_state_dir({"NFTREC_STATE_DIR": "/x/y"}) == Path("/x/y")
    # this checkout: state/README.md and pyproject.toml sit next to the package
    assert default_state_dir({}) == REPO / "state"
    assert default_state_dir({"NFTREC_STATE_DIR": ""}) == REPO / "state"
    # an installed package (no checkout around it)
    assert default_state_dir({}, repo=tmp_path) == Path("/var/lib/nftrec")


def test_layout(store, tmp_path):
    store.record_applied("rev1", ruleset(1), "fp1", 7)
    assert store.status_path == tmp_path / "host" / "tables" / "nftrec" / "status.json"
    assert store.status_path.is_file()
    assert store.lock_path == tmp_path / "host" / "lock"
    [h] = (tmp_path / "host" / "tables" / "nftrec" / "history").iterdir()
    assert h.name == f"000001-{digest(ruleset(1))[:12]}.jsonl"
    assert namespace_dir(tmp_path, HOST) == namespace_dir(tmp_path, None) == tmp_path / "host"
    # a namespace made with `ip netns add host` is not the host
    assert namespace_dir(tmp_path, "host") == tmp_path / "netns" / "host"
    assert namespace_dir(tmp_path, "blue") == tmp_path / "netns" / "blue"


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../x", ".hidden"])
def test_netns_names_that_are_not_one_path_component_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="network namespace name"):
        StateStore(tmp_path, bad)


def test_table_with_slash_refused(tmp_path):
    with pytest.raises(ValueError, match="table name"):
        StateStore(tmp_path, None, "a/b")


# --- status -------------------------------------------------------------------------------


def test_fresh_status(store):
    st = store.status()
    assert st.netns == HOST and st.table == "nftrec"
    assert not st.ever_applied and st.last_applied_revision is None and st.last_error is None
    assert store.history() == [] and store.previous() is None


def test_record_applied_then_failed_attempt(store):
    rs = ruleset(1)
    store.record_applied("rev1", rs, "fp1", 42, plan_id="p1")
    st = store.status()
    assert st.ever_applied
    assert (st.last_applied_revision, st.last_attempted_revision) == ("rev1", "rev1")
    assert st.desired_digest == digest(rs)
    assert (st.live_fingerprint, st.kernel_generation, st.last_applied_plan_id) == ("fp1", 42, "p1")
    assert st.last_applied_at == "2026-05-09T12:00:01Z"
    assert st.nftrec_version and st.last_error is None

    store.record_attempt("rev2", "services.yaml:3:5: Service default/web: spec.ports[0].port: must be 1-65535")
    st = store.status()
    assert st.last_attempted_revision == "rev2" and st.last_applied_revision == "rev1"
    assert st.last_error.startswith("services.yaml:3:5")
    assert st.last_attempted_at == "2026-05-09T12:00:02Z" and st.last_applied_at == "2026-05-09T12:00:01Z"

    store.record_attempt("rev2b", None)
    assert store.status().last_error is None


def test_cleanup_is_recorded_until_the_next_apply(store):
    store.record_applied("rev1", ruleset(1), "fp1", None)
    store.record_cleanup()
    st = store.status()
    assert st.cleaned_up_at == "2026-05-09T12:00:02Z" and st.last_applied_revision == "rev1"
    doc = json.loads(store.status_path.read_text())
    del doc["cleanedUpAt"]  # as an older nftrec wrote it
    store.status_path.write_text(json.dumps(doc))
    assert store.status().cleaned_up_at is None
    store.record_cleanup()
    store.record_applied("rev2", ruleset(2), "fp2", None)
    assert store.status().cleaned_up_at is None


def test_status_json_is_the_documented_form(store):
    store.record_applied("rev1", ruleset(1), "fp1", None)
    doc = json.loads(store.status_path.read_text())
    assert doc["formatVersion"] == FORMAT_VERSION
    assert set(doc) == {
        "formatVersion", "netns", "table", "lastAppliedRevision", "lastAppliedAt", "lastAppliedPlanId",
        "lastAttemptedRevision", "lastAttemptedAt", "lastError", "desiredDigest", "liveFingerprint",
        "kernelGeneration", "nftrecVersion", "inputDigest", "configDigest", "commitSequence",
        "lastAppliedRevisionTime", "lastAppliedTrust", "cleanedUpAt",
    }
    assert doc["kernelGeneration"] is None and doc["inputDigest"] is None and doc["configDigest"] is None
    readme = (REPO / "state" / "README.md").read_text()
    for key in doc:  # every field is documented
        assert f"`{key}`" in readme, key


# --- atomic writes -------------------------------------------------------------------------


def test_failed_rename_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    atomic_write(target, b"old")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_atomic_write_mode(tmp_path):
    atomic_write(tmp_path / "a", b"x", mode=0o600)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o600


def test_crash_between_temp_write_and_rename(tmp_path):
    """A process killed by SIGKILL just before the rename leaves the old status intact."""
    store = StateStore(tmp_path)
    store.record_applied("rev1", ruleset(1), "fp1", 1)
    before = store.status_path.read_bytes()
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from reconciler.engine.state import StateStore
        real_replace = os.replace
        def crash(src, dst):
            if str(dst).endswith("status.json"):
                os.kill(os.getpid(), signal.SIGKILL)   # the temp file is written and fsynced
            return real_replace(src, dst)
        os.replace = crash
        StateStore({str(tmp_path)!r}).record_attempt("rev2", "boom")
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    assert store.status_path.read_bytes() == before
    leftovers = [p.name for p in store.dir.iterdir() if p.name.startswith(".status.json.tmp-")]
    assert len(leftovers) == 1  # the crash really happened after the temp write
    assert store.status().last_attempted_revision == "rev1"
    # the next successful write sweeps the leftover
    store.record_applied("rev3", ruleset(3), "fp3", 3)
    assert not [p for p in store.dir.iterdir() if p.name.startswith(".")]


# --- history, pruning, rollback ------------------------------------------------------------


def test_history_is_pruned_to_keep(tmp_path):
    store = StateStore(tmp_path, keep=3, clock=Clock())
    for n in range(1, 6):
        store.record_applied(f"rev{n}", ruleset(n), f"fp{n}", n)
    h = store.history()
    assert [e.sequence for e in h] == [3, 4, 5]
    assert [e.revision for e in h] == ["rev3", "rev4", "rev5"]
    assert len(list(store.history_dir.iterdir())) == 3
    assert store.load_ruleset(h[0]) == ruleset(3)


def test_default_keeps_five(store):
    for n in range(1, 9):
        store.record_applied(f"rev{n}", ruleset(n), "fp", None)
    assert [e.revision for e in store.history()] == [f"rev{n}" for n in range(4, 9)]


def test_reapplying_the_same_ruleset_adds_no_history(store):
    store.record_applied("rev1", ruleset(1), "fp", 1)
    store.record_applied("rev2", ruleset(2), "fp", 2)
    store.record_applied("rev3", ruleset(2), "fp", 3)  # e.g. a commit that changed no rule
    assert [e.revision for e in store.history()] == ["rev1", "rev2"]
    assert store.status().last_applied_revision == "rev3"
    assert store.previous().revision == "rev1"


def test_previous_is_the_one_before_the_current(store):
    assert store.previous() is None
    store.record_applied("rev1", ruleset(1), "fp", 1)
    assert store.previous() is None  # nothing to go back to
    store.record_applied("rev2", ruleset(2), "fp", 2)
    store.record_applied("rev3", ruleset(3), "fp", 3)
    prev = store.previous()
    assert prev.revision == "rev2"
    assert store.load_ruleset(prev) == ruleset(2)
    # roll back: an apply of rev2's ruleset; the next rollback goes back to rev3 (like `cd -`)
    store.record_applied(prev.revision, store.load_ruleset(prev), "fp", 4)
    assert store.status().desired_digest == digest(ruleset(2))
    assert store.previous().revision == "rev3"


def test_previous_when_status_is_missing_uses_newest_entry(store):
    store.record_applied("rev1", ruleset(1), "fp", 1)
    store.record_applied("rev2", ruleset(2), "fp", 2)
    store.status_path.unlink()
    assert store.previous().revision == "rev1"


def test_history_survives_status_reset_and_continues_sequence(store):
    store.record_applied("rev1", ruleset(1), "fp", 1)
    store.status_path.write_text("{broken")
    store.reset()
    store.record_applied("rev2", ruleset(2), "fp", 2)
    assert [e.sequence for e in store.history()] == [1, 2]


# --- corruption -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"{not json", "is not valid JSON"),
        (b"\xff\xfe", "is not valid JSON"),
        (b"[]", "not an object"),
        (b'{"formatVersion": 99}', "formatVersion 99 (written by a newer nftrec?)"),
        (b'{"formatVersion": "1"}', "no integer formatVersion"),
    ],
)
def test_corrupt_status_is_reported_with_path(store, content, reason):
    store.dir.mkdir(parents=True)
    store.status_path.write_bytes(content)
    with pytest.raises(StateCorrupt) as e:
        store.status()
    assert e.value.path == store.status_path
    assert reason in str(e.value)
    assert str(store.status_path) in str(e.value)
    assert "move it aside" in str(e.value)
    # writers refuse too, rather than overwrite what they could not read
    with pytest.raises(StateCorrupt):
        store.record_attempt("rev", None)


def test_wrong_field_type_and_missing_field(store):
    store.record_applied("rev1", ruleset(1), "fp", 1)
    doc = json.loads(store.status_path.read_text())
    doc["kernelGeneration"] = "7"
    store.status_path.write_text(json.dumps(doc))
    with pytest.raises(StateCorrupt, match="'kernelGeneration' has the wrong type"):
        store.status()
    del doc["kernelGeneration"]
    store.status_path.write_text(json.dumps(doc))
    with pytest.raises(StateCorrupt, match="lacks the field 'kernelGeneration'"):
        store.status()


def test_status_of_another_namespace_is_refused(tmp_path):
    a = StateStore(tmp_path, None)
    a.record_applied("rev1", ruleset(1), "fp", 1)
    b = StateStore(tmp_path, "blue")
    b.dir.mkdir(parents=True)
    b.status_path.write_bytes(a.status_path.read_bytes())  # copied by hand
    with pytest.raises(StateCorrupt, match="describes netns '@host'"):
        b.status()


def test_reset_moves_corrupt_file_aside(store):
    store.dir.mkdir(parents=True)
    store.status_path.write_text("{garbage")
    moved = store.reset()
    assert moved.name == "status.json.corrupt-20260509T120001Z"
    assert moved.read_text() == "{garbage"  # kept for the operator, not deleted
    assert not store.status_path.exists()
    assert not store.status().ever_applied  # fresh: the caller rebuilds from the kernel
    store.status_path.write_text("{garbage again")
    assert store.reset().name == "status.json.corrupt-20260509T120002Z"
    assert store.reset() is None  # nothing left to move


def test_reset_refuses_paths_outside_the_store(store, tmp_path):
    (tmp_path / "elsewhere").write_text("x")
    with pytest.raises(ValueError, match="not a file of the state store"):
        store.reset(tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere").exists()


def test_edited_history_ruleset_is_detected(store):
    store.record_applied("rev1", ruleset(1), "fp", 1)
    store.record_applied("rev2", ruleset(2), "fp", 2)
    entry = store.previous()
    lines = entry.path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith('["chain",'))
    piece = json.loads(lines[i])
    piece[3]["rules"][0]["body"] = "accept"  # hand edit, as nftrec would write it
    lines[i] = json.dumps(piece, sort_keys=True, separators=(",", ":"))
    entry.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(StateCorrupt, match="do not match the recorded digest") as e:
        store.load_ruleset(entry)
    assert e.value.path == entry.path


def test_corrupt_history_entry_reported_then_reset(store):
    store.record_applied("rev1", ruleset(1), "fp", 1)
    store.record_applied("rev2", ruleset(2), "fp", 2)
    first = store.history()[0].path
    first.write_text("")  # truncated
    with pytest.raises(StateCorrupt) as e:
        store.history()
    assert e.value.path == first
    # recording a new apply is not blocked by it
    store.record_applied("rev3", ruleset(3), "fp", 3)
    store.reset(e.value.path)
    assert [h.revision for h in store.history()] == ["rev2", "rev3"]


def test_unreadable_status_is_corrupt(store):
    if os.geteuid() == 0:
        # root reads any file; use a directory in the file's place instead
        store.status_path.mkdir(parents=True)
    else:
        store.dir.mkdir(parents=True)
        store.status_path.write_text("{}")
        store.status_path.chmod(0)
    with pytest.raises(StateCorrupt, match="cannot be read"):
        store.status()


def test_module_constants():
    assert state_mod.HISTORY_KEEP == 5
    with pytest.raises(ValueError, match="keep at least 2"):
        StateStore(Path("/tmp"), keep=1)


def test_record_noop_moves_the_revision_and_keeps_ruleset_digests_and_token(store):
    store.record_applied("rev1", ruleset(1), "fp1", 7, input_digest="in", config_digest="cfg")
    files = sorted(store.history_dir.iterdir())
    st = store.record_noop("rev2")
    assert (st.last_applied_revision, st.last_attempted_revision, st.last_error) == ("rev2", "rev2", None)
    assert (st.desired_digest, st.kernel_generation, st.input_digest, st.config_digest) == \
        (digest(ruleset(1)), 7, "in", "cfg")
    assert sorted(store.history_dir.iterdir()) == files
    # an apply from a saved plan or a rollback clears them: no fast path afterwards
    assert store.record_applied("rev3", ruleset(2), "fp", 8).input_digest is None


def test_history_entry_is_json_lines_and_the_digest_is_unchanged(tmp_path):
    """A history entry is one JSON value per line (a header, then the ruleset's pieces),
    written in parts; the ruleset digest is the one nftrec always computed (pinned), with
    a body larger than any write buffer and non-ASCII text."""
    t = Table("ip", "nftrec")
    t.chains["services"] = Chain("services", rules=tuple(
        Rule(f"ip daddr 10.0.{i // 250}.{i % 250} drop") for i in range(3000)))
    s = NamedSet("cluster-ips", "ipv4_addr")
    for i in range(5000):
        s.add(Element((f"172.30.{i // 250}.{i % 250}",)))
    t.sets["cluster-ips"] = s
    rs = Ruleset(tables={"ip": t}, owners={f"ip chain svc{i}": f"default/svc\u00e9{i}" for i in range(5000)})
    st = StateStore(tmp_path, None, "nftrec", clock=lambda: "2026-05-09T12:00:00Z")
    status = st.record_applied('rev "1"\u00e9', rs, None, 7, "plan-1")
    (entry,) = st.history_dir.iterdir()
    data = entry.read_bytes()
    assert entry.name == "000001-371d8e9d9d8f.jsonl"
    lines = [json.loads(line) for line in data.decode("ascii").splitlines()]
    assert lines[0] == {"formatVersion": 1, "sequence": 1, "revision": 'rev "1"\u00e9', "digest": status.desired_digest,
                        "appliedAt": "2026-05-09T12:00:00Z", "planId": "plan-1"}
    assert [x[0] for x in lines[1:4]] == ["owners", "table", "chain"] and lines[4][:3] == ["set", "ip", "cluster-ips"]
    assert len(lines) == 5 + 5000 and lines[5] == {"comment": None, "key": ["172.30.0.0"], "value": None}
    assert hashlib.sha256(data).hexdigest() == "c27eb971efc922be8325b8914424208464396d388af82a348a730c6894c834a4"
    assert status.desired_digest == digest(rs) == "371d8e9d9d8f5452936b18fd7a5b24350cb2a2310372e00d9376a27ec31a4489"
    assert st.load_ruleset(st.history()[-1]) == rs


def test_atomic_write_of_parts(tmp_path):
    atomic_write(tmp_path / "a", iter([b"one ", b"", bytearray(b"two "), b"three"]))
    assert (tmp_path / "a").read_bytes() == b"one two three"
