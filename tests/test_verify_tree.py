"""The signed tree from the object store: Verifier.check runs no git process, hands back
the commit's own manifest files (hash-checked), whatever the worktree or the index hold,
ignores replace refs, and in Tag modes accepts only a tag whose target is the commit.

Real git and SSH keys made here; no kernel (Verifier.check is called directly).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from reconciler.intake import Baseline, TrustError, Verifier, Verify
from test_verify_signed import SERVICE, Repo, git, needs_ssh, needs_ssh_git, ssh_key


class Git:
    """A `git` first on PATH that logs each call and runs the real one."""

    def __init__(self, tmp: Path, monkeypatch):
        real = shutil.which("git")
        self.bin, self.log = tmp / "bin", tmp / "git-calls"
        self.bin.mkdir()
        (self.bin / "git").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {self.log}\nexec {real} "$@"\n')
        (self.bin / "git").chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.bin}:{os.environ['PATH']}")

    def during(self, f) -> tuple:
        """(f(), the git command lines it ran)."""
        self.log.unlink(missing_ok=True)
        out = f()
        ran = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return out, ran


@pytest.fixture
def signed(tmp_path):
    """(Repo signing with ops's SSH key, a Verifier trusting it); closed after the test."""
    ops = ssh_key(tmp_path / "keys", "ops")
    repo = Repo(tmp_path)
    repo.use_ssh(ops)
    with Verifier(Verify(mode="HEAD", keys=(f"{ops}.pub",))) as v:
        yield repo, v


def files_of(verdict) -> dict[str, bytes]:
    return {display.rsplit("/", 1)[-1]: raw for display, _oid, raw in verdict.files.files}


@needs_ssh
def test_no_git_process_and_the_rule_that_decided(signed, tmp_path, monkeypatch):
    repo, v = signed
    calls = Git(tmp_path, monkeypatch)
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    verdict, ran = calls.during(lambda: v.check(repo.current))
    assert verdict.ok and ran == [] and verdict.signer == "ops@example"
    assert files_of(verdict) == {"web.yaml": SERVICE.format(ip="10.96.0.10").encode()}
    assert verdict.time == int(git(repo.src, "log", "-1", "--format=%ct", first))
    second = repo.commit("10.96.0.11")
    repo.publish(second)
    verdict, ran = calls.during(lambda: v.check(repo.current, first))
    assert verdict.ok and not verdict.rollback_allowed and verdict.message == "" and ran == []
    repo.commit("10.96.0.12")
    fourth = repo.commit("10.96.0.13")
    repo.publish(fourth)
    verdict, ran = calls.during(lambda: v.check(repo.current, Baseline(first, 0, "commits")))
    assert verdict.ok and ran == []
    # an older one after it, history present: ancestry decides
    repo.publish(second)
    verdict, ran = calls.during(lambda: v.check(repo.current, fourth))
    assert verdict.reason == "rollback" and ran == [] and verdict.signer == "ops@example", verdict
    assert "does not descend" in verdict.message and "history between them is present" in verdict.message
    assert "--allow-rollback" in verdict.message
    verdict = v.check(repo.current, fourth, allow_rollback=True)
    assert verdict.ok and verdict.rollback_allowed and "allowed" in verdict.describe()
    # a last applied commit of another history (every ancestor read): not a descendant
    assert "does not descend" in v.check(repo.current, "f" * 40).message
    # committer dates out of order (a clock set wrong): ancestry, not time, decides
    repo.env["GIT_COMMITTER_DATE"] = "2030-01-01T00:00:00Z"
    repo.commit("10.96.0.14")
    repo.env["GIT_COMMITTER_DATE"] = "2001-01-01T00:00:00Z"
    sixth = repo.commit("10.96.0.15")
    del repo.env["GIT_COMMITTER_DATE"]
    repo.publish(sixth)
    assert v.check(repo.current, fourth).ok


@needs_ssh
def test_the_commits_files_whatever_the_worktree_and_index_hold(signed, tmp_path):
    """Edits, untracked files, a forged or torn index, skip-worktree, staged changes: the
    verdict's files are the commit's blobs (what git-sync's user writes does not count)."""
    repo, v = signed
    (repo.src / "m" / "d").mkdir(parents=True)
    (repo.src / "m" / "d" / "b.yaml").write_text(SERVICE.format(ip="10.96.0.20").replace("web", "b"))
    (repo.src / "m" / "link.yaml").symlink_to("d/b.yaml")
    (repo.src / "m" / "notes.txt").write_text("not a manifest\n")
    sha = repo.commit("10.96.0.10")
    wt = repo.publish(sha)
    pristine = v.check(wt / "m")
    assert pristine.ok and [d for d, _, _ in pristine.files.files] == [f"{wt / 'm'}/d/b.yaml"]  # the link: read once
    whole = files_of(v.check(repo.current))
    (wt / "web.yaml").write_text(SERVICE.format(ip="10.96.0.19"))
    (wt / "extra.yaml").write_text("{}")
    (wt / "m" / "d" / "b.yaml").unlink()
    git(wt, "update-index", "--skip-worktree", "m/link.yaml")
    (wt / "m" / "link.yaml").unlink()
    (wt / "m" / "link.yaml").write_text(SERVICE.format(ip="10.96.0.66"))
    (wt / "staged.yaml").write_text("{}")
    git(wt, "add", "staged.yaml")
    assert files_of(v.check(repo.current)) == whole
    assert v.check(wt / "m").files.files == pristine.files.files
    Path(git(wt, "rev-parse", "--absolute-git-dir"), "index").write_bytes(b"DIRC torn")
    assert files_of(v.check(repo.current)) == whole


@needs_ssh
def test_replace_refs_are_ignored(signed, tmp_path):
    """A signed commit of another history (a force-push's) published after `third`: a
    `git replace --graft` of its root onto `third` makes git log call it a descendant;
    the object store says otherwise."""
    repo, v = signed
    repo.commit("10.96.0.10")
    third = repo.commit("10.96.0.12")
    git(repo.src, "checkout", "-q", "--orphan", "old")
    root = repo.commit("10.96.0.98")
    old = repo.commit("10.96.0.99")
    repo.publish(old)
    git(repo.src, "replace", "--graft", root, third)
    assert git(repo.src, "log", "--ancestry-path", "--format=%H", f"{third}..{old}").split() == [old, root]  # git is fooled
    verdict = v.check(repo.current, third)
    assert verdict.reason == "rollback" and "does not descend" in verdict.message, verdict
    second = old
    # the checked out commit replaced by another signed one: its own tree is what is read
    other = repo.commit("10.96.0.13")
    git(repo.src, "replace", second, other)
    verdict = v.check(repo.current)
    assert verdict.ok and verdict.revision == second
    assert files_of(verdict) == {"web.yaml": SERVICE.format(ip="10.96.0.99").encode()}


@needs_ssh
@needs_ssh_git
def test_tag_mode_checks_the_tag_object_and_its_target(signed, tmp_path):
    repo, _ = signed
    ops = tmp_path / "keys" / "ops"
    tagged = repo.commit("10.96.0.10", sign=False)
    git(repo.src, "tag", "-s", "-m", "v1", "v1", tagged)
    head = repo.commit("10.96.0.11", sign=False)
    git(repo.src, "tag", "light", head)  # lightweight: no tag object
    repo.publish(head)
    with Verifier(Verify(mode="Tag", keys=(f"{ops}.pub",))) as v:
        verdict = v.check(repo.current)  # v1 is signed, but its target is another commit
        assert not verdict.ok and verdict.reason == "no-tag", verdict
        git(repo.src, "tag", "-a", "-m", "v2", "v2", head)  # annotated, unsigned
        verdict = v.check(repo.current)
        assert verdict.reason == "unsigned" and "tag 'v2'" in verdict.message, verdict
        git(repo.src, "tag", "-s", "-m", "v3", "v3", head)
        git(repo.src, "pack-refs", "--all")  # packed refs are read too
        verdict = v.check(repo.current)
        assert verdict.ok and verdict.signer == "ops@example", verdict
    with Verifier(Verify(mode="TagAndHEAD", keys=(f"{ops}.pub",))) as v:
        assert v.check(repo.current).reason == "unsigned"  # the commit itself is not signed


@needs_ssh
def test_damaged_objects_and_sha256_on_an_old_dulwich(signed, tmp_path, monkeypatch):
    repo, v = signed
    sha = repo.commit("10.96.0.10")
    repo.publish(sha)
    blob = git(repo.src, "rev-parse", f"{sha}:web.yaml")
    loose = repo.src / ".git" / "objects" / blob[:2] / blob[2:]
    other = git(repo.src, "hash-object", "-w", "--stdin", "--path", "x")  # an empty blob's object
    loose.chmod(0o644)
    loose.write_bytes((repo.src / ".git" / "objects" / other[:2] / other[2:]).read_bytes())
    verdict = v.check(repo.current)
    assert not verdict.ok and verdict.reason == "bad-object" and "does not hash to its id" in verdict.message
    git(repo.src, "config", "extensions.objectFormat", "sha256")
    monkeypatch.setitem(sys.modules, "dulwich.object_format", None)  # a dulwich before 1.2
    with pytest.raises(TrustError, match="sha256 object ids, which this dulwich"):
        v.check(repo.current)


@needs_ssh
def test_watch_reparses_only_the_edited_blob(signed, tmp_path):
    """watch with `verify`: each revision's verified blobs go to Intake.read_files, which
    keeps its per-file results by blob id; a one-file edit reads and parses one blob, and
    the snapshot equals read_inventory of a checkout of that commit."""
    from reconciler.intake import Intake, read_inventory

    repo, v = signed
    for i in range(20):
        (repo.src / f"s{i:02d}.yaml").write_text(SERVICE.format(ip=f"10.96.1.{i}").replace("name: web", f"name: s{i}"))
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    intake = Intake(repo.current)
    verdict = v.check(repo.current, held=intake.holds)
    snap = intake.read_files(verdict.files, repo.current.resolve())
    assert snap.ok and intake.parsed == 21 and len(snap.inventory.services) == 21
    second = repo.commit("10.96.0.11")  # web.yaml edited
    wt = repo.publish(second)
    (wt / "s00.yaml").write_text("garbage: [")  # the worktree is not read
    verdict = v.check(repo.current, first, held=intake.holds)
    assert [d for d, _, raw in verdict.files.files if raw is not None] == [f"{repo.current}/web.yaml"]
    snap = intake.read_files(verdict.files, repo.current.resolve())
    assert intake.parsed == 1 and snap.revision == second and snap.ok
    git(wt, "checkout", "--", "s00.yaml")
    oracle = read_inventory(repo.current)
    assert snap.inventory == oracle.inventory and snap.digest == oracle.digest
