"""What nftrec reads of git: the commit a checkout is (`revision_of`, from the files under
`.git`; `+dirty` when its manifest files are not the commit's), what a checkout's commit
holds (`checkout_blobs`, for the watch on git-sync's worktrees), and the manifests of one revision (`revision_files`, `nftrec diff --git DIR
A..B`: no checkout). Objects are read in-process (intake/gitobjects.py); a git process runs
only to resolve revision names for `diff --git`, and only in the caller's own repository.
"""

# revision_files reads the revision's copy of DIR with the rules of a directory on disk
# (gitobjects.manifest_files). Positions are git's object names, `REV:path/in/repo.yaml:12:3`,
# so `git show REV:path/in/repo.yaml` opens the file. git (rev-parse, merge-base) runs under
# the repository's own config: only where the repository (worktree, git directory, common
# directory) is owned by the user running nftrec, never for another user's checkout.

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from reconciler.intake.gitobjects import (
    Checkout, ManifestFiles, ObjectError, Store, blob_id, commit_files, find_checkout, manifest_files,
)
from reconciler.intake.load import LoadResult
from reconciler.intake.problems import WARNING, Problem, show
from reconciler.intake.sources import load_blobs

GIT_TIMEOUT = 120.0  # seconds, per git process; reading a big repository's tree is fast


def _checkout_of(root: Path) -> tuple[str | None, Checkout | None]:
    """(the commit `root` is named after, None) or (None, the checkout it is in, or None).

    Order: a `.git` at the root itself (git-sync worktree); a root named after a commit
    (`rev-<sha>` or `<sha>`, git-sync's worktree names); a `.git` in an ancestor."""
    if not (root / ".git").exists():
        m = re.fullmatch(r"(?:rev-)?([0-9a-f]{40}(?:[0-9a-f]{24})?)", root.name)
        if m:
            return m.group(1), None
    return None, find_checkout(root)


def revision_of(resolved: Path | None, digest: str, chunks: Sequence[bytes] = (), prefix: str = "",
                memo: dict | None = None, recorded: tuple[str | None, str | None] = (None, None),
                scope: tuple[str, ...] = ()) -> str:
    """A manifest tree's revision: the name of the OCI artifact it is, when it lies in a
    store this process opened as an `oci://` source (checked first: the state directory
    may sit in a git checkout), else the commit of the checkout it is (`<commit>+dirty:
    sha256:<digest>` when the files read, `chunks` under `prefix` (load.chunk), are not
    the commit's: see dirty), else `sha256:<digest>`. What lies in a directory never
    makes it an artifact. `recorded`: (digest, revision) of an earlier read (the last
    apply's), whose name stands for the same files in a checkout of the same commit (it
    would differ only for those files at another directory of that commit): the no-op
    plan then opens no object store. `scope`: a fleet node's read (load.Walk.scope): only
    those of the commit's files count."""
    if resolved is None:
        return ""
    if any(p.name.startswith("sha256-") for p in (resolved, *resolved.parents)):  # (links already resolved)
        from reconciler.intake.oci import source_artifact  # only then: other reads do not import the OCI source

        artifact = source_artifact(resolved)
        if artifact is not None:
            return artifact.name
    named, co = _checkout_of(resolved if resolved.is_dir() else resolved.parent)
    if named is not None:
        return named
    if co is None:
        return f"sha256:{digest}"
    if recorded[0] == digest and recorded[1] is not None and recorded[1].split("+dirty:")[0] == co.commit:
        return recorded[1]
    return f"{co.commit}+dirty:sha256:{digest}" if dirty(co, resolved, chunks, prefix, memo, scope) else co.commit


def dirty(co: Checkout, resolved: Path, chunks: Sequence[bytes], prefix: str, memo: dict | None = None,
          scope: tuple[str, ...] = ()) -> bool:
    """Whether the manifest files read under `resolved` (`chunks`, display paths under
    `prefix`) differ from what the checkout's commit holds there, read with the rules of a
    directory (gitobjects.manifest_files): a file added, removed or changed. Each file's
    git blob id is computed from its bytes, in-process (no git, no index); `memo` keeps
    them by display path for a caller that reads again. A commit that cannot be read
    leaves the checkout named by its commit."""
    try:
        with Store(co.common) as store:
            if resolved.is_dir():
                listed = manifest_files(store, co.commit, co.sub, prefix, held=lambda _display, _oid: True)
                want = {display: oid for display, oid, _ in listed.files}
            else:
                entry = (store.listing(co.commit, co.sub) or {}).get(resolved.name)
                want = {prefix: entry[1]} if entry is not None and entry[0] != "120000" else {}
    except (ObjectError, OSError):
        return False
    if scope:
        dirs = tuple(s for s in scope if s.endswith("/"))
        want = {d: oid for d, oid in want.items() if d in scope or d.startswith(dirs)}
    memo = memo if memo is not None else {}
    have = 0
    for c in chunks:
        if not c:
            continue  # refused unread (unreadable, too big): the count below tells
        display = bytes(c[:c.index(b"\0")]).decode("utf-8", "surrogateescape")
        oid = want.get(display)
        if oid is None:
            return True
        known = memo.get(display)
        if known is None or known[0] is not c or len(known[1]) != len(oid):
            known = memo[display] = (c, blob_id(memoryview(c)[len(display.encode("utf-8", "surrogateescape")) + 1:-1],
                                                len(oid)))
        if known[1] != oid:
            return True
        have += 1
    return have != len(want)


class GitError(Exception):
    """git is missing, DIR is not in a repository, a revision does not exist, ..."""


@dataclass(frozen=True)
class RevisionRange:
    old: str
    new: str
    merge_base: bool  # `A...B`: from the merge base of A and B (a pull request's changes)


def parse_range(spec: str) -> RevisionRange:
    """`A..B` or `A...B` (git's notation; `A...B` diffs against the merge base, which is
    what a pull request changes). An empty side is HEAD, as in git."""
    for sep, base in (("...", True), ("..", False)):
        if sep in spec:
            old, new = spec.split(sep, 1)
            return RevisionRange(old or "HEAD", new or "HEAD", base)
    raise GitError(f"{show(spec)} is not a revision range; write OLD..NEW (e.g. origin/main..HEAD) or "
                   f"OLD...NEW (changes since their merge base)")


def _own(directory: Path) -> Path:
    """The top of the checkout `directory` is in, when the user running nftrec owns it,
    its git directory and its common directory: git then runs under that user's own
    config. GitError otherwise: nftrec never runs git under another user's config."""
    if not directory.is_dir():
        raise GitError(f"{directory} is not a directory; give `--git` the manifest directory in a clone")
    co = find_checkout(directory.resolve())
    if co is None:
        raise GitError(f"{directory} is not inside a git working tree; give `--git` the manifest "
                       "directory of a clone")
    me = os.getuid()
    configs = [c for c in (co.common / "config", co.gitdir / "config.worktree") if os.path.lexists(c)]
    for path in (co.top, co.top / ".git", co.gitdir, co.common, *configs):  # configs: what git reads and obeys
        try:
            owner = path.stat().st_uid
        except OSError as e:
            raise GitError(f"cannot stat {path} ({e.strerror})") from None
        if owner != me:
            raise GitError(f"{path} belongs to uid {owner}, not to uid {me} running nftrec; `diff --git` runs git, "
                           "which would run programs that repository's config names: run it as the repository's "
                           "owner, or on your own clone")
    return co.top


def _git(directory: Path, *args: str) -> bytes:
    top = _own(directory)
    env = dict(os.environ, LC_ALL="C", GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GIT_NO_REPLACE_OBJECTS="1")
    try:
        done = subprocess.run(["git", "-C", str(top), *args], capture_output=True, stdin=subprocess.DEVNULL,
                              timeout=GIT_TIMEOUT, env=env, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed (or not on PATH); `diff --git` runs the git command") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"`git {' '.join(args[:2])}` in {directory} took longer than {GIT_TIMEOUT:.0f} s; "
                       "is the repository on a slow or hung filesystem?") from None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"`git {' '.join(args[:2])}` in {directory} failed: "
                       f"{said[0] if said else f'exit {done.returncode}'}")
    return done.stdout


def _check_revision(rev: str) -> None:
    if not rev or rev.startswith("-") or any(c in rev for c in "\0\n"):
        raise GitError(f"{show(rev)} is not a revision name")


def resolve_revision(directory: Path, rev: str) -> str:
    """The commit a revision name means."""
    _check_revision(rev)
    try:
        out = _git(directory, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError as e:
        if "failed" not in str(e):
            raise
        raise GitError(f"the revision {show(rev)} does not exist in the repository of {directory} "
                       "(in CI, fetch it first: `git fetch origin main`, and clone with enough depth)") from None
    return out.decode().strip()


def merge_base(directory: Path, a: str, b: str) -> str:
    try:
        return _git(directory, "merge-base", a, b).decode().strip()
    except GitError as e:
        if "failed" not in str(e):
            raise
        raise GitError(f"{show(a)} and {show(b)} have no merge base in the repository of {directory} "
                       "(a shallow clone? fetch with more depth, or use OLD..NEW)") from None


def revision_files(directory: Path, rev: str, commit: str | None = None) -> ManifestFiles:
    """The manifest files under `directory` as revision `rev` has them (no checkout), read
    whole from the object store; displayed `REV:path/in/repo.yaml`. Of a fleet root,
    fleet.yaml apart (ManifestFiles.fleet) and every layer's files: one read of the
    revision, from which fleetlisting.listed_node picks each node's files."""
    commit = commit or resolve_revision(directory, rev)
    co = find_checkout(Path(directory).resolve())
    if co is None:
        raise GitError(f"{directory} is not inside a git working tree; give `--git` the manifest "
                       "directory of a clone")
    prefix = "" if co.sub == "." else co.sub + "/"
    try:
        with Store(co.common) as store:
            return commit_files(store, commit, co.sub, f"{rev}:{prefix}", whole=True)
    except ObjectError as e:
        raise GitError(f"cannot read revision {show(rev)} in the repository of {directory}: {e}") from None


def load_listed(listed: ManifestFiles) -> LoadResult:
    """A plain tree's revision_files, loaded as load_manifests loads a checkout of it. The
    result's revision is the commit."""
    root = listed.root
    loaded = load_blobs([(display, raw) for display, _oid, raw in listed.files], revision=listed.revision, root=root,
                        problems=list(listed.problems))
    if not listed.files and not listed.problems:
        loaded.problems.append(Problem(root, 0, 0, "", "", "", "no manifest files here in this "
                                       "revision; it compiles to an empty ruleset", WARNING))
    return loaded


def checkout_blobs(root: Path) -> dict[str, tuple[str, str]] | None:
    """{path below root: (mode, object id)} of every file of the commit checked out at
    `root` (inside a git checkout, e.g. a git-sync worktree), from the object store; None
    when not in a checkout or the commit cannot be read. git-sync never edits a worktree it
    published, so it holds its commit's files."""
    co = find_checkout(root)
    if co is None:
        return None
    try:
        with Store(co.common) as store:
            return store.listing(co.commit, co.sub)
    except ObjectError:
        return None
