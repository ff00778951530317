"""`nftrec watch` on a fleet root (SPEC §2.4, §6): the incremental reader stays incremental
(an edit in another site's layer costs a Paris node a stat of fleet.yaml and nothing
more; an edit in base re-reads that file for every node; a fleet.yaml change re-projects),
always equal to read_inventory (the oracle, as in tests/test_watch.py), across git-sync
swaps; and the real daemon keeps the last good ruleset when fleet.yaml turns invalid.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_fleet_intake import fleet_tree, ident, node_config, svc
from test_watch import listing

NFTREC = str(Path(sys.executable).with_name("nftrec"))


def same_as_read_inventory(intake, root: Path, identity, changed: set[str] | None = None):
    from reconciler.intake import read_inventory

    snap = intake.read(changed)
    ref = read_inventory(root, identity=identity)
    assert snap.problems == ref.problems
    assert snap.inventory == ref.inventory
    assert snap.revision == ref.inventory.revision and snap.digest == ref.digest and snap.files == ref.files
    return snap


def test_an_edit_elsewhere_costs_nothing_and_base_costs_its_file(tmp_path, monkeypatch):
    from reconciler.intake import Intake, incremental

    monkeypatch.setattr(incremental, "RACY_SECONDS", 0)  # no file looked at again for its age: the counters are exact
    root = fleet_tree(tmp_path / "f")
    paris, lyon = ident(), ident("edge-3", "lyon")
    ip, il = Intake(root, identity=paris), Intake(root, identity=lyon)
    same_as_read_inventory(ip, root, paris)
    same_as_read_inventory(il, root, lyon)
    edited = root / "sites" / "lyon" / "lyon.yaml"
    edited.write_text(svc("lyon", "10.96.0.77"))
    snap = same_as_read_inventory(ip, root, paris, {str(edited)})  # the watcher's changed paths
    assert ip.looked == 0 and ip.parsed == 0 and ip.checked == 0 and snap.ok
    snap = same_as_read_inventory(ip, root, paris)  # a full walk stats the node's own files only
    assert ip.looked == 4 and ip.parsed == 0 and ip.compared == 0 and snap.ok
    snap = same_as_read_inventory(il, root, lyon, {str(edited)})
    assert il.parsed == 1 and "10.96.0.77" in str(snap.inventory.services)
    base = root / "base" / "web.yaml"
    base.write_text(svc("web", "10.96.0.10", 81))
    for intake, who in ((ip, paris), (il, lyon)):
        same_as_read_inventory(intake, root, who, {str(base)})
        assert intake.parsed == 1 and intake.looked == 1


def test_a_fleet_yaml_change_reprojects_and_an_invalid_one_is_an_error(tmp_path):
    from reconciler.intake import Intake

    root = fleet_tree(tmp_path / "f")
    who = ident()
    intake = Intake(root, identity=who)
    snap = same_as_read_inventory(intake, root, who)
    assert "default/cache" in {s.key for s in snap.inventory.services}
    fleet = root / "fleet.yaml"
    good = fleet.read_text()
    fleet.write_text(good.replace("sites/${labels.site}", "sites/lyon"))  # the node moves to lyon's layer
    snap = same_as_read_inventory(intake, root, who, set())
    keys = {s.key for s in snap.inventory.services}
    assert "default/lyon" in keys and "default/cache" not in keys
    assert intake.parsed == 1  # lyon's one file; base's stand (the same variables)
    fleet.write_text(good.replace("variables: {dnsIP: 10.96.0.53}", "variables: {dnsIP: 10.96.0.54}"))
    snap = same_as_read_inventory(intake, root, who, set())
    assert intake.parsed == 4 and "10.96.0.54" in str(snap.inventory.services)  # new variables: every file again
    fleet.write_text(good.replace("kind: Fleet", "kind: Fleet\nrollout: {}"))
    snap = same_as_read_inventory(intake, root, who, set())
    assert not snap.ok and all(p.file == str(fleet) for p in snap.problems if p.is_error)
    fleet.write_text(good)
    assert same_as_read_inventory(intake, root, who, set()).ok


def test_identity_changes_and_leaving_fleet_mode_equal_the_oracle(tmp_path):
    from reconciler.intake import Intake

    root = fleet_tree(tmp_path / "f")
    intake = Intake(root, identity=ident())
    same_as_read_inventory(intake, root, ident())
    intake.identity = ident("edge-2")  # SIGHUP: another nodeName (nodes/edge-2 is walked, though no event came)
    snap = same_as_read_inventory(intake, root, ident("edge-2"), set())
    assert "default/cache" not in {s.key for s in snap.inventory.services}
    (root / "fleet.yaml").unlink()  # a plain directory now: every file, the override's stub an error
    same_as_read_inventory(intake, root, ident("edge-2"))
    (root / "fleet.yaml").write_text(
        (Path(__file__).parent / "test_fleet_intake.py").read_text().split('FLEET = """\\\n')[1].split('"""')[0])
    assert same_as_read_inventory(intake, root, ident("edge-2")).ok


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=env, timeout=60).stdout.strip()


def test_a_git_sync_swap_compares_only_the_nodes_files(tmp_path, monkeypatch):
    """git-sync's layout (a worktree per commit, `current` swapped): a commit that changes
    another site's layer reads no file for a Paris node (git says its files are the
    same: no walk, no compare) and names the new commit; one in its own layer reads that
    file; each read equals the oracle."""
    from reconciler.intake import Intake, incremental

    walks = []
    real_walk = incremental.walk_fleet
    monkeypatch.setattr(incremental, "walk_fleet", lambda *a, **k: walks.append(a) or real_walk(*a, **k))
    src = fleet_tree(tmp_path / "src")
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "0")
    gs = tmp_path / "gs"

    def publish() -> str:
        sha = _git(src, "rev-parse", "HEAD")
        wt = gs / ".worktrees" / sha
        _git(src, "worktree", "add", "-q", "--detach", str(wt), sha)
        (gs / "tmp-link").symlink_to(wt.relative_to(gs))
        os.replace(gs / "tmp-link", gs / "current")
        return sha

    sha = publish()
    cur = gs / "current"
    who = ident()
    intake = Intake(cur, identity=who)
    assert same_as_read_inventory(intake, cur, who).revision == sha
    (src / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.77"))
    (src / "sites" / "lyon" / "more.yaml").write_text(svc("more", "10.96.0.78"))
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "1")
    sha = publish()
    walks.clear()
    snap = same_as_read_inventory(intake, cur, who)
    assert snap.revision == sha and intake.git and intake.parsed == 0 and intake.compared == 0
    assert not walks  # git said the node's files are the same: the old walk stands, re-rooted
    (src / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.79"))
    _git(src, "commit", "-q", "-am", "2")
    sha = publish()
    snap = same_as_read_inventory(intake, cur, who)
    assert snap.revision == sha and intake.parsed == 1 and "10.96.0.79" in str(snap.inventory.services)


@pytest.mark.kernel
def test_an_invalid_fleet_yaml_keeps_the_last_good_ruleset(netns, tmp_path):
    from watchproc import Watch

    root = fleet_tree(tmp_path / "f")
    cfg = node_config(tmp_path)
    cfg.write_text(cfg.read_text() + "minSyncPeriod: 0s\nsyncPeriod: 1s\nfullSyncPeriod: 30s\n")
    w = Watch(netns, root, cfg, tmp_path / "state")
    try:
        first = w.wait_sync(0, kind="full")
        before = listing(netns)
        assert "10.96.0.12" in before and "10.96.0.13" not in before  # paris's cache, not lyon's
        mark = len(w.lines)
        (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.77"))  # another site: no change
        (root / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.12", 81))
        s = w.wait_sync(mark)
        assert s["servicesChanged"] == ["~default/cache"], s
        good = listing(netns)
        fleet = root / "fleet.yaml"
        text = fleet.read_text()
        mark = len(w.lines)
        fleet.write_text(text.replace("- path: base\n", "- path: base\n  colour: blue\n"))
        bad = w.wait(lambda: w.find("invalid", mark), what="the invalid revision")
        errors = [x for x in w.lines[mark:] if x.get("severity") == "error"]
        assert errors and errors[0]["file"] == str(fleet), errors
        assert listing(netns) == good  # the last good ruleset stays
        st = w.status(lambda st: st["lastAttemptedRevision"] == bad["revision"])
        assert st["lastAppliedRevision"] == s["revision"] != bad["revision"]
        p = subprocess.run([NFTREC, "--state-dir", str(w.state), "status", "--netns", netns, "--config", str(cfg)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "attempted: revision" in p.stdout and "invalid input" in p.stdout, p.stdout
        mark = len(w.lines)
        fleet.write_text(text.replace("sites/${labels.site}", "sites/lyon"))  # re-projected: lyon's layer
        s = w.wait_sync(mark)
        changed = set(s["servicesChanged"])  # web: base's again (paris's replaced it)
        assert {"+default/lyon", "-default/cache"} <= changed and changed & {"~default/web", "+default/web"}, s
        assert "10.96.0.77" in listing(netns)
        assert first and w.stop() == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def test_a_verified_commits_files_are_read_as_the_nodes(tmp_path):
    """With `verify`, the watch parses the commit's blobs (Intake.read_files): on a fleet
    root only the node's layers' blobs, substituted and merged, equal to read_inventory of
    the same checkout; a commit changing another site looks at none of them."""
    from reconciler.intake import Intake
    from reconciler.intake.gitobjects import Store, commit_files, find_checkout

    root = fleet_tree(tmp_path / "f")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "0")
    who = ident()
    intake = Intake(root, identity=who)

    def read():
        co = find_checkout(root)
        with Store(co.common) as store:
            files = commit_files(store, co.commit, co.sub, f"{root}/", held=intake.holds)  # as Verifier.check
        snap = intake.read_files(files, root)  # the node's layers' blobs read from the object store now
        from reconciler.intake import read_inventory

        ref = read_inventory(root, identity=who)
        assert snap.problems == ref.problems and snap.inventory == ref.inventory and snap.digest == ref.digest
        assert snap.revision == co.commit == ref.inventory.revision
        return snap

    assert read().ok and intake.parsed == 4
    (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.77"))
    _git(root, "commit", "-q", "-am", "1")
    assert read().ok and intake.parsed == 0 and intake.looked == 0
    (root / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.79"))
    _git(root, "commit", "-q", "-am", "2")
    snap = read()
    assert intake.parsed == 1 and "10.96.0.79" in str(snap.inventory.services)
