"""The signed tree without `git status`: the checkout's index, read natively, must hash to
the signed commit's tree, and the files under the directory must be the index's. One git
process per revision (`git log`), counted through a `git` on PATH that logs its calls.

Real git and SSH keys made here; no kernel (Verifier.check is called directly).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from reconciler.intake import Verifier, Verify, git_version
from reconciler.intake import git as G
from test_verify_signed import SERVICE, Repo, git, needs_ssh, needs_ssh_git, ssh_key


def _sha256_ok() -> bool:
    with __import__("tempfile").TemporaryDirectory() as d:
        return subprocess.run(["git", "init", "-q", "--object-format=sha256", d], capture_output=True).returncode == 0


def index_of(wt: Path) -> G.Index:
    gitdir = Path(git(wt, "rev-parse", "--absolute-git-dir"))
    return G.read_index(gitdir / "index")


def tree_of(wt: Path) -> str | None:
    return G.index_tree(index_of(wt))


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_index_tree_is_the_tree_git_writes(tmp_path, fmt, version):
    if fmt == "sha256" and not _sha256_ok():
        pytest.skip("this git cannot make sha256 repositories (git init --object-format=sha256)")
    r = tmp_path / "r"
    git(tmp_path, "init", "-q", f"--object-format={fmt}", str(r))
    # names that sort differently as a tree than as a blob ("a.b", "a-b", "a0" around "a/"),
    # nesting, an executable, a symlink, an empty file, a non-ASCII name, hidden files
    files = {"a.b": "1", "a-b": "2", "a0": "3", "a/x.yaml": "4", "a/b/c/d.yaml": "5", "z/é.yaml": "6",
             ".hidden/h": "7", "empty.yaml": "", "run.sh": "#!/bin/sh\n", "ab": "8"}
    for name, text in files.items():
        (r / name).parent.mkdir(parents=True, exist_ok=True)
        (r / name).write_text(text)
    (r / "run.sh").chmod(0o755)
    (r / "link.yaml").symlink_to("a/x.yaml")
    (r / "dirlink").symlink_to("a")
    git(r, "add", "-A")
    git(r, "update-index", "--index-version", version)
    if version == "3":  # version 3 holds extended flags; one set and cleared keeps it at 3
        git(r, "update-index", "--skip-worktree", "a0")
        git(r, "update-index", "--no-skip-worktree", "a0")
    written = git(r, "write-tree")
    assert tree_of(r) == written and len(written) == (40 if fmt == "sha1" else 64)
    git(r, "commit", "-q", "-m", "c")
    # a submodule (gitlink) entry too
    git(r, "update-index", "--add", "--cacheinfo", f"160000,{git(r, 'rev-parse', 'HEAD')},sub")
    assert tree_of(r) == git(r, "write-tree")
    git(r, "commit", "-q", "-m", "with a gitlink")
    assert tree_of(r) == git(r, "rev-parse", "HEAD^{tree}")
    (r / "a" / "x.yaml").write_text("changed")
    git(r, "add", "a/x.yaml")
    assert tree_of(r) == git(r, "write-tree") != git(r, "rev-parse", "HEAD^{tree}")


def test_index_tree_refuses_what_it_does_not_read(tmp_path):
    """Intent-to-add, skip-worktree, unmerged and split indexes: no tree (git decides)."""
    r = tmp_path / "r"
    git(tmp_path, "init", "-q", str(r))
    (r / "web.yaml").write_text("a\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "c")
    assert tree_of(r) == git(r, "rev-parse", "HEAD^{tree}")
    (r / "new.yaml").write_text("n\n")
    git(r, "add", "-N", "new.yaml")
    assert tree_of(r) is None
    git(r, "rm", "-q", "--cached", "new.yaml")
    git(r, "update-index", "--skip-worktree", "web.yaml")
    assert tree_of(r) is None
    git(r, "update-index", "--no-skip-worktree", "web.yaml")
    git(r, "update-index", "--split-index")
    assert b"link" in index_of(r).extensions and tree_of(r) is None
    git(r, "update-index", "--no-split-index")
    assert tree_of(r) is not None
    (r / "d").mkdir()
    (r / "d" / "f.yaml").write_text("f\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "d")
    try:  # a sparse index: directories as entries (git 2.32 and later)
        git(r, "sparse-checkout", "set", "--cone", "--sparse-index", "nothing")
    except subprocess.CalledProcessError:
        pass
    else:
        assert b"sdir" in index_of(r).extensions and tree_of(r) is None
        git(r, "sparse-checkout", "disable")
        assert tree_of(r) == git(r, "rev-parse", "HEAD^{tree}")
    base = git(r, "rev-parse", "HEAD")
    (r / "web.yaml").write_text("b\n")
    git(r, "commit", "-q", "-am", "b")
    git(r, "checkout", "-q", "-b", "other", base)
    (r / "web.yaml").write_text("c\n")
    git(r, "commit", "-q", "-am", "c")
    with pytest.raises(subprocess.CalledProcessError):
        git(r, "merge", "-q", "master")
    assert "UU web.yaml" in git(r, "status", "--porcelain") and tree_of(r) is None  # unmerged stages


class Git:
    """A `git` first on PATH that logs each call and runs the real one."""

    def __init__(self, tmp: Path, monkeypatch):
        real = shutil.which("git")
        self.bin, self.log = tmp / "bin", tmp / "git-calls"
        self.bin.mkdir()
        (self.bin / "git").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {self.log}\nexec {real} "$@"\n')
        (self.bin / "git").chmod(0o755)
        git_version()  # asked once per process, before the counting starts
        monkeypatch.setenv("PATH", f"{self.bin}:{os.environ['PATH']}")

    def during(self, f) -> tuple:
        """(f(), the git commands it ran: their first word after the options)."""
        self.calls()
        return f(), self.calls()

    def calls(self) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        words = []
        for line in lines:
            argv = line.split(" ")
            while argv and (argv[0] in ("-c", "-C") or argv[0].startswith("safe.") or argv[0].startswith("gpg.")
                            or argv[0].startswith("/")):
                argv.pop(0)
            words.append(argv[0] if argv else "?")
        return words


@pytest.fixture
def signed(tmp_path):
    """(Repo signing with ops's SSH key, a Verifier trusting it); closed after the test."""
    ops = ssh_key(tmp_path / "keys", "ops")
    repo = Repo(tmp_path)
    repo.use_ssh(ops)
    with Verifier(Verify(mode="HEAD", keys=(f"{ops}.pub",))) as v:
        yield repo, v


def refused(v: Verifier, where: Path, reason: str, words: str) -> None:
    verdict = v.check(where)
    assert not verdict.ok and verdict.reason == reason, verdict
    assert words in verdict.message and verdict.signer == "ops@example", verdict


@needs_ssh
@needs_ssh_git
def test_one_git_process_per_new_revision(signed, tmp_path, monkeypatch):
    repo, v = signed
    calls = Git(tmp_path, monkeypatch)
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    verdict, ran = calls.during(lambda: v.check(repo.current))
    assert verdict.ok and ran == ["log"]
    second = repo.commit("10.96.0.11")
    repo.publish(second)
    verdict, ran = calls.during(lambda: v.check(repo.current, first))  # a child of the last applied: %P says so
    assert verdict.ok and not verdict.rollback_allowed and ran == ["log"]
    # git-sync skipped a commit: the same log walks from the last applied one
    repo.commit("10.96.0.12")
    fourth = repo.commit("10.96.0.13")
    repo.publish(fourth)
    verdict, ran = calls.during(lambda: v.check(repo.current, first))
    assert verdict.ok and ran == ["log"]
    # an older one after it: a rollback, refused by that log alone
    repo.publish(second)
    verdict, ran = calls.during(lambda: v.check(repo.current, fourth))
    assert verdict.reason == "rollback" and ran == ["log"]
    # let through: a second log reads the signature
    verdict, ran = calls.during(lambda: v.check(repo.current, fourth, allow_rollback=True))
    assert verdict.ok and verdict.rollback_allowed and verdict.signer == "ops@example" and ran == ["log", "log"]
    # a last applied commit git does not know (another history): not a descendant
    assert v.check(repo.current, "f" * 40).reason == "rollback"
    # committer dates out of order (a clock set wrong): the log still shows the commit
    repo.env["GIT_COMMITTER_DATE"] = "2030-01-01T00:00:00Z"
    repo.commit("10.96.0.14")
    repo.env["GIT_COMMITTER_DATE"] = "2001-01-01T00:00:00Z"
    sixth = repo.commit("10.96.0.15")
    del repo.env["GIT_COMMITTER_DATE"]
    repo.publish(sixth)
    verdict, ran = calls.during(lambda: v.check(repo.current, fourth))
    assert verdict.ok and ran == ["log"]
    # an index nftrec does not read: git status decides, beside the log
    wt = repo.publish(fourth)
    git(wt, "update-index", "--split-index")
    verdict, ran = calls.during(lambda: v.check(repo.current, fourth))
    assert verdict.ok and sorted(ran) == ["log", "status"]
    (wt / "web.yaml").write_text(SERVICE.format(ip="10.96.0.99"))
    _, ran = calls.during(lambda: refused(v, repo.current, "modified-file", "'web.yaml' differs from the signed commit"))
    assert sorted(ran) == ["log", "status"]


@needs_ssh
@needs_ssh_git
def test_tag_mode_is_the_log_and_one_verify_tag(signed, tmp_path, monkeypatch):
    repo, _ = signed
    ops = tmp_path / "keys" / "ops"
    sha = repo.commit("10.96.0.10")
    git(repo.src, "tag", "light", sha)  # lightweight: no tag object, not counted as a tag
    repo.publish(sha)
    calls = Git(tmp_path, monkeypatch)
    with Verifier(Verify(mode="Tag", keys=(f"{ops}.pub",))) as v:
        verdict, ran = calls.during(lambda: v.check(repo.current))
        assert verdict.reason == "no-tag" and ran == ["log", "verify-tag"]
        git(repo.src, "tag", "-s", "-m", "v1", "v1", sha)
        verdict, ran = calls.during(lambda: v.check(repo.current))
        assert verdict.ok and verdict.signer == "ops@example", verdict
        assert ran == ["log", "verify-tag", "verify-tag"]  # "light", then "v1"


@needs_ssh
@needs_ssh_git
def test_files_that_are_not_the_signed_tree_are_refused(signed, tmp_path):
    repo, v = signed
    (repo.src / "m" / "d").mkdir(parents=True)
    (repo.src / "m" / "d" / "b.yaml").write_text(SERVICE.format(ip="10.96.0.20").replace("web", "b"))
    (repo.src / "m" / "link.yaml").symlink_to("d/b.yaml")
    (repo.src / ".gitignore").write_text("ignored.yaml\n")
    (repo.src / "m" / "notes.txt").write_text("not a manifest\n")
    sha = repo.commit("10.96.0.10")
    wt = repo.publish(sha)
    assert v.check(repo.current).ok
    web = wt / "web.yaml"

    # the same size, the mtime restored: the bytes are hashed
    st = web.stat()
    web.write_text(SERVICE.format(ip="10.96.0.19"))
    os.utime(web, ns=(st.st_atime_ns, st.st_mtime_ns))
    refused(v, repo.current, "modified-file", "'web.yaml' differs from the signed commit")
    git(wt, "checkout", "--", "web.yaml")
    assert v.check(repo.current).ok

    # and with the index's stat data forged to the edited file's: still the bytes decide
    web.write_text(SERVICE.format(ip="10.96.0.19"))
    os.utime(web, ns=(st.st_atime_ns - 10**10, st.st_mtime_ns - 10**10))  # not racily clean for git
    forge_stat(wt, "web.yaml")
    assert git(wt, "status", "--porcelain") == ""  # git itself trusts the forged stat
    refused(v, repo.current, "modified-file", "'web.yaml' differs from the signed commit")
    web.write_text(SERVICE.format(ip="10.96.0.10"))
    assert v.check(repo.current).ok

    web.unlink()
    refused(v, repo.current, "modified-file", "'web.yaml' differs")
    git(wt, "checkout", "--", "web.yaml")
    (wt / "m" / "link.yaml").unlink()
    (wt / "m" / "link.yaml").symlink_to("../web.yaml")
    refused(v, repo.current, "modified-file", "'m/link.yaml' differs")
    git(wt, "checkout", "--", "m/link.yaml")
    assert v.check(repo.current).ok

    for name in ("extra.yaml", "m/d/new/extra.json", "ignored.yaml"):
        (wt / name).parent.mkdir(parents=True, exist_ok=True)
        (wt / name).write_text("{}")
        refused(v, repo.current, "untracked-file", f"'{name}' is a manifest file that git does not track")
        (wt / name).unlink()
    (wt / "README.txt").write_text("not a manifest")
    (wt / ".hidden.yaml").write_text("never read")
    assert v.check(repo.current).ok
    # the directory read is m/: a change outside it is not its business
    (wt / "extra.yaml").write_text("{}")
    assert v.check(wt / "m").ok
    (wt / "extra.yaml").unlink()

    # a file staged but not committed: the index is not the commit's tree; git names it
    (wt / "staged.yaml").write_text("{}")
    git(wt, "add", "staged.yaml")
    refused(v, repo.current, "modified-file", "'staged.yaml' differs")
    git(wt, "rm", "-q", "--cached", "staged.yaml")
    (wt / "staged.yaml").unlink()
    assert v.check(repo.current).ok
    # the index changed, the files not: an executable bit, an entry dropped
    git(wt, "update-index", "--chmod=+x", "web.yaml")
    refused(v, repo.current, "modified-file", "'web.yaml' differs")
    git(wt, "update-index", "--chmod=-x", "web.yaml")
    git(wt, "rm", "-q", "--cached", "m/d/b.yaml")
    refused(v, repo.current, "modified-file", "'m/d/b.yaml' differs")
    git(wt, "reset", "-q")
    assert v.check(repo.current).ok


def forge_stat(wt: Path, name: str) -> None:
    """Write the file's current lstat into its index entry, the blob id kept (what an
    attacker who can write .git/index can do), with a valid checksum."""
    path = Path(git(wt, "rev-parse", "--absolute-git-dir")) / "index"
    data = bytearray(path.read_bytes())
    entries, _ = G._read_index(bytes(data), 20)
    assert data[8:12] == struct.pack(">I", len(entries))
    pos = 12
    for raw, stat, _oid, _flags, _ext in entries:  # version 2 entries: fixed part, path, NUL padding
        if raw == name.encode():
            st = os.lstat(wt / name)
            fields = (st.st_ctime_ns // 10**9, st.st_ctime_ns % 10**9, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9,
                      st.st_dev, st.st_ino, stat[6], st.st_uid, st.st_gid, st.st_size)
            struct.pack_into(">10I", data, pos, *(f & 0xFFFFFFFF for f in fields))
            break
        pos += (62 + len(raw) + 8) & ~7
    else:
        raise AssertionError(f"{name} is not in the index")
    data[-20:] = hashlib.sha1(bytes(data[:-20])).digest()
    path.write_bytes(bytes(data))
