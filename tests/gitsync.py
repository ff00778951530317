"""git-sync v4's layout and defaults, driven with its own git commands (kubernetes/git-sync
main.go: fetch, worktree add, reset, publishSymlink, cleanup): a root repository, a
`--depth 1` fetch of a ref or commit id from the remote, a detached worktree per commit
under `.worktrees`, the `current` link swapped atomically, the old worktree removed,
reflogs expired and `git gc` (its default `--git-gc=always`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from test_verify_signed import git


class GitSync:
    """A git-sync root at `root` syncing from the repository `remote` (a file:// URL)."""

    def __init__(self, root: Path, remote: Path):
        self.root, self.remote = root, f"file://{remote}"
        self.root.mkdir(parents=True)
        git(self.root, "init", "-q", "-b", "git-sync")

    @property
    def current(self) -> Path:
        return self.root / "current"

    def sync(self, ref: str) -> str:
        """One sync of `ref` (a branch or a commit id), as git-sync does it; its commit."""
        git(self.root, "fetch", self.remote, ref, "--verbose", "--no-progress", "--prune", "--no-auto-gc",
            "--depth", "1")
        sha = git(self.root, "rev-parse", "FETCH_HEAD^{commit}")
        git(self.root, "reset", "--soft", sha, "--")
        old = os.path.realpath(self.current) if self.current.is_symlink() else None
        wt = self.root / ".worktrees" / sha
        if not wt.exists():
            git(self.root, "worktree", "add", "--force", "--detach", str(wt), sha, "--no-checkout")
            git(wt, "reset", "--hard", sha, "--")
        link = self.root / "tmp-link"
        link.symlink_to(wt.relative_to(self.root))
        os.rename(link, self.current)
        if old is not None and old != str(wt):
            shutil.rmtree(old)
            git(self.root, "worktree", "prune", "--verbose")
            git(self.root, "reflog", "expire", "--expire-unreachable=all", "--all")
            git(self.root, "gc")
        return sha

    def prune(self) -> None:
        """`git gc --prune=now`: objects no ref, index or worktree reaches are deleted."""
        git(self.root, "gc", "--prune=now")


def remote(tmp: Path, src: Path) -> Path:
    """A bare repository serving `src`'s branch by name and any commit by id (git-sync
    fetches commit ids too)."""
    bare = tmp / "remote.git"
    git(tmp, "init", "-q", "--bare", str(bare))
    git(bare, "config", "uploadpack.allowAnySHA1InWant", "true")
    push(src, bare)
    return bare


def push(src: Path, bare: Path) -> None:
    git(src, "push", "-q", "--force", str(bare), "HEAD:refs/heads/main")
