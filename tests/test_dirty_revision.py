"""A manifest directory in a git checkout is named by its commit only when its manifest
files are the commit's: an edited, added or deleted manifest file names it
`<commit>+dirty:sha256:<digest>`, so two contents never share a name. The comparison is
in-process (no git runs, so nothing the repository's config names runs either), the same
for every reader (one-shot, cached, the watch's), and `verify` still reads the signed
commit's blobs, never the worktree.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nsutil import EXAMPLES
from reconciler.intake.digests import input_digest
from reconciler.intake.incremental import Intake
from reconciler.intake.inventory import load_manifests, read_inventory
from test_cli_kernel import nftrec, ok
from test_verify_signed import git, live_ips, needs_ssh, ssh_setup, status


def commit_all(repo: Path, message: str = "x") -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example", "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def checkout(tmp_path) -> tuple[Path, str]:
    """edge-small under `manifests/` of a repository with a sibling directory; (its
    manifest directory, the commit)."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "edge-small", repo / "manifests")
    (repo / "other").mkdir()
    (repo / "other" / "x.yaml").write_text("a: 1\n")
    git(repo, "init", "-q")
    return repo / "manifests", commit_all(repo)


def revisions(d: Path, cache: Path) -> set[str]:
    """The revision every reader gives `d`: one name, or the test fails."""
    names = {read_inventory(d).inventory.revision, read_inventory(d, cache_dir=cache).inventory.revision,
             load_manifests(d).revision, input_digest(d).revision, Intake(d).read().revision}
    assert len(names) == 1, names
    return names


def test_clean_is_the_commit_and_each_dirty_content_has_its_own_name(checkout, tmp_path):
    d, sha = checkout
    cache = tmp_path / "cache"
    assert revisions(d, cache) == {sha}
    services = d / "services.yaml"
    original = services.read_bytes()
    names = []
    for edit in (lambda: services.write_bytes(original + b"# one\n"),        # modified
                 lambda: services.write_bytes(original + b"# two\n"),        # modified otherwise
                 lambda: (d / "apps" / "new.yaml").write_text("# new\n"),    # untracked manifest
                 lambda: (d / "apps" / "deployment.yaml").unlink()):         # deleted
        edit()
        (name,) = revisions(d, cache)
        digest = read_inventory(d).digest
        assert name == f"{sha}+dirty:sha256:{digest}"
        names.append(name)
        git(d, "checkout", "-q", "--", ".")
        git(d, "clean", "-qfd", ".")
        assert revisions(d, cache) == {sha}
    assert len(set(names)) == len(names)
    # what nftrec does not read leaves the name alone: other files, hidden files, other directories
    (d / "README.txt").write_text("notes\n")
    (d / ".hidden.yaml").write_text("a: 1\n")
    (d.parent / "other" / "x.yaml").write_text("a: 2\n")
    assert revisions(d, cache) == {sha}


def test_the_watch_names_an_edit_and_its_revert(checkout):
    d, sha = checkout
    intake = Intake(d)
    assert intake.read().revision == sha
    (d / "services.yaml").write_bytes((d / "services.yaml").read_bytes() + b"# edit\n")
    assert intake.read().revision.startswith(f"{sha}+dirty:sha256:")
    git(d, "checkout", "-q", "--", "services.yaml")
    assert intake.read().revision == sha


def test_no_program_the_repository_config_names_is_run(checkout, tmp_path):
    """A checkout's owner may name programs in its config (core.fsmonitor, hooks): git
    would run them as root; the check runs none."""
    d, sha = checkout
    marker = tmp_path / "ran"
    git(d, "config", "core.fsmonitor", f"touch {marker}; false")
    hooks = d.parent / ".git" / "hooks"
    for hook in ("post-index-change", "post-checkout"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / hook).chmod(0o755)
    (d / "services.yaml").write_bytes((d / "services.yaml").read_bytes() + b"# edit\n")
    assert read_inventory(d).inventory.revision.startswith(f"{sha}+dirty:")
    assert not marker.exists()


def test_validate_and_apply_record_the_dirty_name(checkout, tmp_path, netns):
    d, sha = checkout
    (d / "services.yaml").write_bytes((d / "services.yaml").read_bytes() + b"# edit\n")
    name = json.loads(ok(nftrec("validate", str(d), "-o", "json", config=False)).stdout)["revision"]
    assert name == f"{sha}+dirty:sha256:{read_inventory(d).digest}"
    state = tmp_path / "state"
    applied = ok(nftrec("apply", str(d), state=state, ns=netns))
    assert f"{sha[:12]}+dirty:sha256:" in applied.stdout + applied.stderr
    st = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=netns)).stdout)
    assert st["lastAppliedRevision"] == name


@needs_ssh
def test_verify_reads_the_signed_commit_and_keeps_its_name(tmp_path, netns):
    """With `verify`, an edited worktree changes nothing: the signed commit's blobs are
    parsed and the revision is the commit."""
    _ops, repo, cfg = ssh_setup(tmp_path)
    good = repo.commit("10.96.0.10")
    repo.publish(good)
    web = repo.current / "web.yaml"
    web.write_text(web.read_text().replace("10.96.0.10", "10.96.0.99"))
    state = tmp_path / "state"
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns) and "10.96.0.99" not in live_ips(netns)
    assert status(state, netns, cfg)["lastAppliedRevision"] == good
