"""What nftrec reads of git: the commit a checkout is (`find_revision`, from the files under
`.git`), what a checkout's commit holds (`checkout_blobs`, for the watch on git-sync's
worktrees), the tree a checkout's index describes and the files that are not it
(`index_tree`, `worktree_change`, for signed revisions), and the manifests of one revision
from the object store (`load_revision`, `nftrec diff --git DIR A..B`: no checkout).
"""

# load_revision reads the revision's copy of DIR with the rules of a directory on disk
# (load.manifest_files): recursive, `*.yaml` `*.yml` `*.json`, hidden entries skipped,
# symlinks followed only inside the tree. Two git processes: `ls-tree` lists the files, one
# `cat-file --batch` reads them all. Positions are git's object names,
# `REV:path/in/repo.yaml:12:3`, so `git show REV:path/in/repo.yaml` opens the file.

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISLNK, S_ISREG

from reconciler.intake.load import SUFFIXES, LoadResult
from reconciler.intake.parse import MAX_FILE_BYTES
from reconciler.intake.problems import ERROR, WARNING, Problem, show
from reconciler.intake.sources import load_blobs

GIT_TIMEOUT = 120.0  # seconds, per git process; reading a big repository's tree is fast


_SHA_RE = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _git_commit(gitdir: Path) -> str | None:
    """HEAD's commit read from the git directory's files (no subprocess)."""
    head = _read(gitdir / "HEAD")
    if head is None:
        return None
    common = gitdir
    commondir = _read(gitdir / "commondir")  # linked worktrees share refs with the main repo
    if commondir:
        common = (gitdir / commondir).resolve()
    for _ in range(5):  # follow symbolic refs a few levels
        if _SHA_RE.fullmatch(head):
            return head
        if not head.startswith("ref:"):
            return None
        ref = head[4:].strip()
        value = _read(gitdir / ref) or _read(common / ref)
        if value is None:
            packed = _read(common / "packed-refs") or ""
            value = next((ln.split()[0] for ln in packed.splitlines() if ln.endswith(" " + ref)), None)
        if value is None:
            return None
        head = value
    return None


def _gitdir_of(dot_git: Path) -> Path | None:
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git)  # a linked worktree (git-sync's): "gitdir: /repo/.git/worktrees/x"
    if text and text.startswith("gitdir:"):
        return (dot_git.parent / text[7:].strip()).resolve()
    return None


def find_revision(root: Path) -> str | None:
    """The git commit the resolved root is a checkout of, or None.

    Order: a `.git` at the root itself (git-sync worktree); a root named after a commit
    (`rev-<sha>` or `<sha>`, git-sync's worktree names); a `.git` in an ancestor."""
    if (root / ".git").exists():
        gd = _gitdir_of(root / ".git")
        commit = _git_commit(gd) if gd else None
        if commit:
            return commit
    m = re.fullmatch(r"(?:rev-)?([0-9a-f]{40}(?:[0-9a-f]{24})?)", root.name)
    if m:
        return m.group(1)
    for parent in root.parents:
        if (parent / ".git").exists():
            gd = _gitdir_of(parent / ".git")
            return _git_commit(gd) if gd else None
    return None


def revision_of(resolved: Path | None, digest: str) -> str:
    """A manifest tree's revision: the name of the OCI artifact it is, when it lies in a
    store this process opened as an `oci://` source (checked first: the state directory
    may sit in a git checkout), else the commit of the checkout it is, else
    `sha256:<digest>`. What lies in a directory never makes it an artifact."""
    if resolved is None:
        return ""
    if any(p.name.startswith("sha256-") for p in (resolved, *resolved.parents)):  # (links already resolved)
        from reconciler.intake.oci import source_artifact  # only then: other reads do not import the OCI source

        artifact = source_artifact(resolved)
        if artifact is not None:
            return artifact.name
    return find_revision(resolved if resolved.is_dir() else resolved.parent) or f"sha256:{digest}"


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


def _git(directory: Path, *args: str, stdin: bytes | None = None) -> bytes:
    env = dict(os.environ, LC_ALL="C", GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0")
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], input=stdin, capture_output=True,
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
        if "not a git repository" in str(e):
            raise GitError(f"{directory} is not inside a git working tree; give `--git` the manifest "
                           "directory of a clone") from None
        raise GitError(f"the revision {show(rev)} does not exist in the repository of {directory} "
                       "(in CI, fetch it first: `git fetch origin main`, and clone with enough depth)") from None
    return out.decode().strip()


def merge_base(directory: Path, a: str, b: str) -> str:
    try:
        return _git(directory, "merge-base", a, b).decode().strip()
    except GitError:
        raise GitError(f"{show(a)} and {show(b)} have no merge base in the repository of {directory} "
                       "(a shallow clone? fetch with more depth, or use OLD..NEW)") from None


def _prefix(directory: Path) -> str:
    if not directory.is_dir():
        raise GitError(f"{directory} is not a directory; give `--git` the manifest directory in a clone")
    try:
        return _git(directory, "rev-parse", "--show-prefix").decode("utf-8", "surrogateescape").strip()
    except GitError:
        raise GitError(f"{directory} is not inside a git working tree; give `--git` the manifest "
                       "directory of a clone") from None


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def _cat(directory: Path, oids: list[str]) -> dict[str, bytes]:
    """Blob contents by object id, in one `git cat-file --batch`."""
    if not oids:
        return {}
    out = _git(directory, "cat-file", "--batch", stdin="".join(f"{o}\n" for o in oids).encode())
    blobs: dict[str, bytes] = {}
    pos = 0
    for _ in oids:
        end = out.index(b"\n", pos)
        header = out[pos:end].decode().split(" ")
        if len(header) != 3:  # "<oid> missing": a damaged or partial (--filter) clone
            raise GitError(f"git cannot read the object {header[0]} in the repository of {directory}: "
                           f"{' '.join(header[1:])}; is it a partial or damaged clone?")
        oid, _kind, size = header
        start = end + 1
        blobs[oid] = out[start:start + int(size)]
        pos = start + int(size) + 1
    return blobs


def load_revision(directory: Path, rev: str, commit: str | None = None) -> LoadResult:
    """The manifests under `directory` as revision `rev` has them, loaded as load_manifests
    loads a checkout of `rev`. The result's revision is the commit."""
    commit = commit or resolve_revision(directory, rev)
    prefix = _prefix(directory)
    listing = _git(directory, "ls-tree", "-r", "-z", "-l", "--full-name", commit, "--", ".")
    entries: dict[str, tuple[str, str, int]] = {}  # path below DIR -> (mode, oid, size)
    for item in listing.split(b"\0"):
        if not item:
            continue
        meta, _, path = item.partition(b"\t")
        mode, _kind, oid, size = meta.decode().split()
        full = path.decode("utf-8", "surrogateescape")
        rel = full[len(prefix):] if full.startswith(prefix) else full
        entries[rel] = (mode, oid, int(size) if size.isdigit() else 0)
    problems: list[Problem] = []
    shown = (lambda rel: f"{rev}:{prefix}{rel}")
    wanted: dict[str, str] = {}  # display -> rel of the blob to read (a link's target)
    links = {rel: oid for rel, (mode, oid, _) in entries.items() if mode == "120000" and not _hidden(rel)}
    targets = _cat(directory, sorted(set(links.values())))
    read_once: set[str] = set()
    for rel in sorted(entries):
        mode, oid, _size = entries[rel]
        if _hidden(rel):
            continue
        if mode == "160000":
            problems.append(Problem(shown(rel), 0, 0, "", "", "", "this is a git submodule; nftrec does not read "
                                    "submodules, so its manifests were skipped", WARNING))
        elif mode == "120000":
            target = targets[oid].decode("utf-8", "surrogateescape")
            dest = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
            if target.startswith("/") or dest == ".." or dest.startswith("../"):
                problems.append(Problem(shown(rel), 0, 0, "", "", "", f"this symlink points outside the manifest "
                                        f"tree (to {show(target)}); nftrec refuses it: copy the file into the tree "
                                        "or remove the link", ERROR))
                continue
            inside = sorted(r for r in entries if r.startswith(dest + "/") and entries[r][0] != "120000")
            if dest in entries and entries[dest][0] != "120000":
                if rel.endswith(SUFFIXES) and dest not in read_once:
                    read_once.add(dest)
                    wanted[shown(rel)] = dest
            elif inside:
                for r in inside:
                    sub = r[len(dest) + 1:]
                    if r.endswith(SUFFIXES) and not _hidden(sub) and r not in read_once:
                        read_once.add(r)
                        wanted[shown(f"{rel}/{sub}")] = r
            else:
                problems.append(Problem(shown(rel), 0, 0, "", "", "", "this symlink is dangling or points at "
                                        "another link; fix or remove it", ERROR))
        elif rel.endswith(SUFFIXES) and rel not in read_once:
            read_once.add(rel)
            wanted[shown(rel)] = rel
    small = sorted({entries[r][1] for r in wanted.values() if entries[r][2] <= MAX_FILE_BYTES})
    blobs = _cat(directory, small)
    files: list[tuple[str, bytes | int]] = []
    for display, rel in wanted.items():
        _, oid, size = entries[rel]
        files.append((display, blobs[oid] if oid in blobs else size))
    loaded = load_blobs(files, revision=commit, root=f"{rev}:{prefix}", problems=problems)
    if not wanted and not problems:
        loaded.problems.append(Problem(f"{rev}:{prefix}", 0, 0, "", "", "", "no manifest files here in this "
                                       "revision; it compiles to an empty ruleset", WARNING))
    return loaded


def find_checkout(root: Path) -> tuple[Path, Path, str, str] | None:
    """(worktree top, its git directory, commit checked out, root's path below the top) of
    a directory inside a git checkout, from the files under .git (no subprocess), or None."""
    for top in (root, *root.parents):
        dot_git = top / ".git"
        if dot_git.exists():
            gitdir = _gitdir_of(dot_git)
            commit = _git_commit(gitdir) if gitdir else None
            return (top, gitdir, commit, root.relative_to(top).as_posix()) if commit else None
    return None


def blob_id(raw, object_format: int) -> str:
    """git's object id of a blob with these bytes (`object_format`: the id's length in hex
    digits, 40 for sha1 repositories, 64 for sha256)."""
    h = hashlib.sha1() if object_format == 40 else hashlib.sha256()
    h.update(b"blob %d\0" % len(raw))
    h.update(raw)
    return h.hexdigest()


def checkout_blobs(root: Path) -> dict[str, tuple[str, str | None]] | None:
    """{path below root: (mode, object id)} of every file of the checkout at `root` (inside
    a git checkout, e.g. a git-sync worktree); None when not in a checkout or git fails.
    From the checkout's index (_index_blobs: an id only where the file's stat is the one
    recorded, else None), otherwise `git ls-tree` of the commit checked out: git-sync never
    edits a worktree it published, so it holds its commit's files."""
    co = find_checkout(root)
    if co is None:
        return None
    top, gitdir, commit, sub = co
    prefix = "" if sub == "." else sub + "/"
    blobs = _index_blobs(gitdir / "index", top, prefix)
    if blobs is not None:
        return blobs
    try:
        out = _git(top, "ls-tree", "-r", "-z", "--full-tree", commit, "--", sub)
    except GitError:
        return None
    blobs = {}
    for item in out.split(b"\0"):
        if not item:
            continue
        meta, _, path = item.partition(b"\t")
        mode, _kind, oid = meta.decode().split(" ")
        full = path.decode("utf-8", "surrogateescape")
        if not full.startswith(prefix):
            return None
        blobs[full[len(prefix):]] = (mode, oid)
    return blobs


_ASSUME_VALID, _EXTENDED, _STAGE = 0x8000, 0x4000, 0x3000  # git's index entry flags (Documentation/gitformat-index.txt)
_SKIP_WORKTREE, _INTENT_TO_ADD = 0x4000, 0x2000  # its extended flags (version 3 and later)
_U32 = 0xFFFFFFFF  # the index keeps the low 32 bits of each stat field
_STAT = struct.Struct(">10I")  # ctime s, ns, mtime s, ns, dev, ino, mode, uid, gid, size
_FLAGS = struct.Struct(">H")


def _read_index(data: bytes, n: int) -> tuple[list[tuple[bytes, tuple, bytes, int, int]], list[bytes]]:
    """The entries of a git index file (versions 2 to 4, object ids of `n` bytes, trailer
    not checked) as (path, stat fields, raw id, flags, extended flags), and the signatures
    of its extensions. ValueError (or struct.error) when it is not one."""
    if data[:4] != b"DIRC":
        raise ValueError("not an index")
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4):
        raise ValueError(f"index version {version}")
    end = len(data) - n
    pos, path, entries = 12, b"", []
    for _ in range(count):
        start = pos
        stat = _STAT.unpack_from(data, pos)
        oid = data[pos + 40:pos + 40 + n]
        (flags,) = _FLAGS.unpack_from(data, pos + 40 + n)
        pos += 42 + n
        extended = 0
        if flags & _EXTENDED:
            (extended,) = _FLAGS.unpack_from(data, pos)
            pos += 2
        if version == 4:  # the path is the previous one less N bytes (git's varint.c), plus a suffix
            c = data[pos]
            strip = c & 0x7F
            while c & 0x80:
                pos += 1
                c = data[pos]
                strip = ((strip + 1) << 7) | (c & 0x7F)
            if strip > len(path):
                raise ValueError("index path compression out of range")
            nul = data.index(b"\0", pos + 1)
            path = path[:len(path) - strip] + data[pos + 1:nul]
            pos = nul + 1
        else:  # NUL-terminated, the entry padded with NULs to a multiple of 8 bytes
            nul = data.index(b"\0", pos)
            path = data[pos:nul]
            pos = start + ((nul - start + 8) & ~7)
        if pos > end:
            raise ValueError("index entries overrun")
        entries.append((path, stat, oid, flags, extended))
    signatures = []
    while pos + 8 <= end:  # extensions: signature, length, data
        signatures.append(data[pos:pos + 4])
        pos += 8 + struct.unpack_from(">I", data, pos + 4)[0]
    if pos != end:
        raise ValueError("index extensions overrun")
    return entries, signatures


@dataclass(frozen=True)
class Index:
    """A checkout's index file as read (checksum verified): its entries (path, stat
    fields, raw id, flags, extended flags), the signatures of its extensions, the length
    of an object id in bytes (20: sha1, 32: sha256)."""
    entries: list
    extensions: list
    id_bytes: int


def read_index(path: Path) -> Index | None:
    """The index file at `path`; None when it is missing, torn (or written without a
    checksum, index.skipHash) or not an index git writes."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    for new_hash in (hashlib.sha1, hashlib.sha256):  # the trailer is the checksum of the rest, in the repository's hash
        n = new_hash().digest_size
        if len(data) > 12 + n and new_hash(memoryview(data)[:-n]).digest() == data[-n:]:
            break
    else:
        return None
    try:
        entries, signatures = _read_index(data, n)
    except (ValueError, IndexError, struct.error):
        return None
    return Index(entries, signatures, n)


def _index_blobs(path: Path, top: Path, prefix: str) -> dict[str, tuple[str, str | None]] | None:
    """checkout_blobs from the index file `path` of the checkout at `top`, for the paths
    under `prefix`: a file's id where its lstat (mtime, ctime, inode, size, as git's status
    check compares them) is the index entry's, None for the rest. None for the whole when
    the index is missing, torn, unmerged, split or sparse: the caller then asks git."""
    # ctime cannot be set back by a user, so an edit after the checkout, even of the same
    # size with the mtime restored, is seen. An entry git calls racily clean (written in
    # the index's own timestamp tick) is taken as the index says, as `git ls-tree` would be.
    index = read_index(path)
    if index is None or b"link" in index.extensions or b"sdir" in index.extensions:
        return None  # split (entries live in a shared index too) or sparse (directories as entries)
    out: dict[str, tuple[str, str | None]] = {}
    for raw, stat, oid, flags, extended in index.entries:
        name = raw.decode("utf-8", "surrogateescape")
        if not name.startswith(prefix):
            continue
        if flags & _STAGE:
            return None  # a merge in progress: not a checkout of one commit
        ctime_s, ctime_ns, mtime_s, mtime_ns, _dev, ino, mode, _uid, _gid, size = stat
        kind = f"{mode:o}"
        trusted = kind in ("100644", "100755") and not flags & _ASSUME_VALID and \
            not extended & (_SKIP_WORKTREE | _INTENT_TO_ADD)
        if trusted:
            try:
                st = os.lstat(f"{top}/{name}")
            except OSError:
                st = None
            trusted = (st is not None
                       and (mtime_s, mtime_ns) == ((st.st_mtime_ns // 1_000_000_000) & _U32, st.st_mtime_ns % 1_000_000_000)
                       and (ctime_s, ctime_ns) == ((st.st_ctime_ns // 1_000_000_000) & _U32, st.st_ctime_ns % 1_000_000_000)
                       and ino == st.st_ino & _U32 and size == st.st_size & _U32)
        out[name[len(prefix):]] = (kind, oid.hex() if trusted else None)
    return out


def index_tree(index: Index) -> str | None:
    """The id of the tree object the index describes (what `git write-tree` would write),
    or None when the index holds what one tree cannot say or nftrec does not read: a split
    or sparse index, an unmerged path, skip-worktree or intent-to-add entries."""
    if b"link" in index.extensions or b"sdir" in index.extensions:
        return None
    root: dict = {}
    for raw, stat, oid, flags, extended in index.entries:
        if flags & _STAGE or extended & (_SKIP_WORKTREE | _INTENT_TO_ADD):
            return None
        *dirs, name = raw.split(b"/")
        d = root
        for part in dirs:
            d = d.setdefault(part, {})
            if not isinstance(d, dict):
                return None  # a file and a directory of one name: not a tree
        if name in d:
            return None
        d[name] = (b"%o" % stat[6], oid)
    algo = "sha1" if index.id_bytes == 20 else "sha256"

    def tree(d: dict) -> bytes:  # git's tree object: "mode name\0<raw id>" for each entry
        items = [(name + b"/", b"40000 " + name + b"\0" + tree(v)) if isinstance(v, dict) else
                 (name, v[0] + b" " + name + b"\0" + v[1]) for name, v in d.items()]
        body = b"".join(entry for _, entry in sorted(items))  # sorted as if a directory's name ended in "/"
        return hashlib.new(algo, b"tree %d\0" % len(body) + body).digest()
    return tree(root).hex()


def worktree_change(top: Path, index: Index, prefix: str) -> tuple[str, str] | None:
    """(reason, path from `top`) of the first file under `prefix` that is not the index's:
    "modified-file" (a tracked file whose bytes or kind differ, or that is missing),
    "untracked-file" (a manifest file the index lacks, ignored ones too); None when all
    are. Hidden entries (never read) are skipped. Every file's bytes are hashed: the stat
    data in the index is not trusted, as whoever can edit the files can write it too. The
    executable bit is not compared: nftrec does not read it. A submodule's files are not
    the commit's: a manifest file in one counts as untracked."""
    hexlen = 2 * index.id_bytes
    tracked: set[str] = set()
    for raw, stat, oid, _flags, _extended in index.entries:
        name = raw.decode("utf-8", "surrogateescape")
        if not name.startswith(prefix):
            continue
        rel = name[len(prefix):]
        tracked.add(rel)
        if _hidden(rel):
            continue
        full = f"{top}/{name}"
        if stat[6] == 0o160000:
            continue  # a submodule: its directory is walked below
        try:
            st = os.lstat(full)
            if stat[6] == 0o120000:
                same = S_ISLNK(st.st_mode) and blob_id(os.fsencode(os.readlink(full)), hexlen) == oid.hex()
            elif S_ISREG(st.st_mode) and stat[6] in (0o100644, 0o100755):
                same = blob_id(Path(full).read_bytes(), hexlen) == oid.hex()
            else:
                same = False
        except OSError:
            same = False
        if not same:
            return "modified-file", name
    return _untracked(top / prefix if prefix else top, "", tracked, prefix)


def _untracked(d: Path | str, rel_dir: str, tracked: set[str], prefix: str) -> tuple[str, str] | None:
    try:
        listing = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError:
        return None
    for e in listing:
        if e.name.startswith("."):
            continue
        rel = rel_dir + e.name
        if e.is_dir(follow_symlinks=False):
            found = _untracked(e.path, rel + "/", tracked, prefix)
            if found:
                return found
        elif rel not in tracked and e.name.endswith(SUFFIXES):
            return "untracked-file", prefix + rel
    return None
