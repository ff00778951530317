"""git's objects read in-process (dulwich), each checked against its id before a byte of it
is parsed: the commit a checkout is (`find_checkout`, from the files under `.git`), its
commits, tags, trees and blobs (`Store`), whether one commit descends from another where
history may be cut off (`Store.descends`), and the manifest files of a commit's tree
(`manifest_files`). No git process, no repository config, no replace refs, no grafts.
"""

# Every object comes from the object store by id (loose or packed, dulwich's DiskObjectStore)
# as raw bytes, whose hash is computed here and compared with the id asked for; only then
# does dulwich parse it. The worktree and the index are never read: whoever writes them
# (git-sync's user) cannot change what a commit id means. manifest_files applies
# load.manifest_files' rules to a tree: recursive, `*.yaml` `*.yml` `*.json`, hidden
# entries skipped, symlinks followed only inside the tree, submodules warned about.

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reconciler.intake.fleet import FLEET_FILE
from reconciler.intake.load import SUFFIXES
from reconciler.intake.parse import MAX_FILE_BYTES
from reconciler.intake.problems import ERROR, WARNING, Problem, show

MAX_WALK = 100_000  # commits Store.descends reads before it calls history not available
MAX_LIST = 64 << 20  # bytes of packed-refs or shallow read at most

_SHA_RE = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
_KINDS = {"commit": 1, "tree": 2, "blob": 3, "tag": 4}
_NAMES = {n: k for k, n in _KINDS.items()}


class ObjectError(Exception):
    """An object is missing, damaged, not what its id says, or of a repository format
    this dulwich cannot read."""


@dataclass(frozen=True)
class Checkout:
    """A directory inside a git checkout: the worktree's top, its git directory, the common
    directory (the main repository's, for a linked worktree as git-sync makes them), the
    commit checked out, and the directory's path below the top ("." at the top)."""
    top: Path
    gitdir: Path
    common: Path
    commit: str
    sub: str


def _read(path: Path, limit: int = 4096) -> str | None:
    """A small file under .git as text; None when it is missing, not a regular file (a
    FIFO would block) or over `limit` bytes. Whoever writes the checkout writes these."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw.decode("utf-8", "replace").strip() if len(raw) <= limit else None


def _gitdir_of(dot_git: Path) -> Path | None:
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git)  # a linked worktree (git-sync's): "gitdir: /repo/.git/worktrees/x"
    if text and text.startswith("gitdir:"):
        return (dot_git.parent / text[7:].strip()).resolve()
    return None


def common_dir(gitdir: Path) -> Path:
    """The directory holding the objects and refs: `commondir` of a linked worktree."""
    commondir = _read(gitdir / "commondir")
    return (gitdir / commondir).resolve() if commondir else gitdir


def _ref(common: Path, ref: str) -> str | None:
    value = _read(common / ref)
    if value is None:
        packed = _read(common / "packed-refs", MAX_LIST) or ""
        value = next((ln.split()[0] for ln in packed.splitlines() if ln.endswith(" " + ref)), None)
    return value


def head_commit(gitdir: Path) -> str | None:
    """HEAD's commit read from the git directory's files, symbolic refs followed a few levels."""
    head = _read(gitdir / "HEAD")
    common = common_dir(gitdir)
    for _ in range(5):
        if head is None:
            return None
        if _SHA_RE.fullmatch(head):
            return head
        if not head.startswith("ref:"):
            return None
        ref = head[4:].strip()
        head = _read(gitdir / ref) or _ref(common, ref)
    return None


def find_checkout(root: Path) -> Checkout | None:
    """The checkout a resolved directory is in, from the files under .git, or None."""
    for top in (root, *root.parents):
        dot_git = top / ".git"
        if dot_git.exists():
            gitdir = _gitdir_of(dot_git)
            commit = head_commit(gitdir) if gitdir else None
            if not commit:
                return None
            return Checkout(top, gitdir, common_dir(gitdir), commit, root.relative_to(top).as_posix())
    return None


def tag_refs(common: Path) -> dict[str, str]:
    """{tag name: object id} of the repository's tags, loose and packed (loose win)."""
    tags: dict[str, str] = {}
    for line in (_read(common / "packed-refs", MAX_LIST) or "").splitlines():
        oid, _, ref = line.partition(" ")
        if ref.startswith("refs/tags/") and _SHA_RE.fullmatch(oid):
            tags[ref[10:]] = oid
    base = common / "refs" / "tags"
    for dirpath, _dirs, names in os.walk(base):
        for name in names:
            oid = _read(Path(dirpath) / name)
            if oid and _SHA_RE.fullmatch(oid):
                tags[(Path(dirpath) / name).relative_to(base).as_posix()] = oid
    return tags


def _object_format(common: Path) -> str:
    """"sha1" or "sha256", from the repository's config (extensions.objectFormat)."""
    from dulwich.config import ConfigFile

    try:
        cfg = ConfigFile.from_path(str(common / "config"))
        value = cfg.get((b"extensions",), b"objectformat")
    except KeyError:
        return "sha1"
    except (OSError, ValueError) as e:
        raise ObjectError(f"cannot read the repository's config {common / 'config'} ({e})") from None
    return value.decode("ascii", "replace").lower()


class Store:
    """The objects of the repository whose common directory is `common`; every object read
    is checked against its id. `trees`: parsed trees by id, shared between stores (a tree
    never changes). close() (or `with`) closes its packs."""

    def __init__(self, common: Path, trees: dict | None = None):
        from dulwich.object_store import DiskObjectStore

        self.common = common
        self.algorithm = _object_format(common)
        extra: dict = {}
        if self.algorithm == "sha256":
            try:
                from dulwich.object_format import SHA256
            except ImportError:
                import dulwich

                raise ObjectError(f"the repository at {common} uses sha256 object ids, which this dulwich "
                                  f"{'.'.join(map(str, dulwich.__version__))} cannot read; install dulwich 1.2 or "
                                  "later (Python 3.10 or later), or sync a sha1 repository") from None
            extra["object_format"] = SHA256
        elif self.algorithm != "sha1":
            raise ObjectError(f"the repository at {common} uses {show(self.algorithm)} object ids; nftrec reads "
                              "sha1 and sha256 repositories")
        self._parse = extra
        self._store = DiskObjectStore(str(common / "objects"), **extra)
        shallow = _read(common / "shallow", MAX_LIST) or ""
        self.shallow = frozenset(shallow.split())
        self._trees: dict[str, list] = trees if trees is not None else {}

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _get(self, oid: str) -> tuple[str, bytes]:
        """(type, bytes) of object `oid`, its hash checked."""
        try:
            type_num, raw = self._store.get_raw(oid.encode("ascii"))
        except KeyError:
            raise ObjectError(f"object {oid} is not in the repository at {self.common}") from None
        except Exception as e:  # a damaged loose object or pack: dulwich's and zlib's errors
            raise ObjectError(f"object {oid} cannot be read from the repository at {self.common} ({e})") from None
        name = _NAMES.get(type_num, "?")
        h = hashlib.new(self.algorithm, b"%s %d\0" % (name.encode(), len(raw)))
        h.update(raw)
        if h.hexdigest() != oid:
            raise ObjectError(f"object {oid} in the repository at {self.common} does not hash to its id: "
                              "the object store was changed")
        return name, raw

    def raw(self, oid: str, kind: str) -> bytes:
        """The bytes of object `oid` of type `kind`, its hash checked."""
        name, raw = self._get(oid)
        if name != kind:
            raise ObjectError(f"object {oid} is a {name}, not a {kind}")
        return raw

    def kind(self, oid: str) -> str:
        """The type of object `oid` (commit, tree, blob, tag), its hash checked."""
        return self._get(oid)[0]

    def _object(self, oid: str, kind: str):
        from dulwich.objects import ShaFile

        raw = self.raw(oid, kind)
        try:
            return ShaFile.from_raw_string(_KINDS[kind], raw, oid.encode("ascii"), **self._parse)
        except Exception as e:  # ObjectFormatException, and whatever else odd bytes raise in the parser
            raise ObjectError(f"{kind} {oid} is malformed ({type(e).__name__}: {e})") from None

    def commit(self, oid: str):
        """dulwich's Commit `oid`."""
        return self._object(oid, "commit")

    def tag(self, oid: str):
        """dulwich's Tag `oid`."""
        return self._object(oid, "tag")

    def tree(self, oid: str) -> list[tuple[str, str, str]]:
        """[(name, mode as git writes it, object id)] of tree `oid`."""
        entries = self._trees.get(oid)
        if entries is None:
            entries = [(e.path.decode("utf-8", "surrogateescape"), "%06o" % e.mode, e.sha.decode("ascii"))
                       for e in self._object(oid, "tree").iteritems()]
            if any(name in ("", ".", "..") or "/" in name for name, _, _ in entries):
                raise ObjectError(f"tree {oid} is malformed (an entry named '', '.', '..' or with a '/')")
            if len(self._trees) > 4096:
                self._trees.clear()
            self._trees[oid] = entries
        return entries

    def descends(self, new: str, old: str, limit: int = MAX_WALK) -> bool | None:
        """Whether commit `old` is `new` or one of its ancestors: True, False, or None when
        history is not available (a shallow boundary, a missing commit, over `limit`)."""
        seen, queue, cut = {new}, deque([new]), False
        while queue:
            oid = queue.popleft()
            if oid == old:
                return True
            if oid in self.shallow:
                cut = True  # its parents were not fetched
                continue
            if len(seen) > limit:
                return None
            try:
                parents = [p.decode("ascii") for p in self.commit(oid).parents]
            except ObjectError:
                cut = True  # pruned (gc) or never fetched
                continue
            for p in parents:
                if p not in seen:
                    seen.add(p)
                    queue.append(p)
        return None if cut else False

    def listing(self, commit: str, sub: str) -> dict[str, tuple[str, str]] | None:
        """{path below `sub`: (mode, object id)} of every entry (not directories) of the
        commit's tree below `sub` ("." or "": the whole tree); None when `sub` is not a
        directory there."""
        tree = self.commit(commit).tree.decode("ascii")
        for part in ([] if sub in (".", "") else sub.split("/")):
            found = next((oid for name, mode, oid in self.tree(tree) if name == part and mode == "040000"), None)
            if found is None:
                return None
            tree = found
        out: dict[str, tuple[str, str]] = {}
        stack = [("", tree)]
        while stack:
            prefix, oid = stack.pop()
            for name, mode, child in self.tree(oid):
                if mode == "040000":
                    stack.append((prefix + name + "/", child))
                else:
                    out[prefix + name] = (mode, child)
        return out


@dataclass(frozen=True)
class ManifestFiles:
    """A commit's manifest files below a directory, as load_blobs takes them: (display
    path, object id, bytes; the size for a blob over the size limit; None for a blob the
    caller said it holds), in display order, and the problems of the listing. A fleet
    root's (`fleet` set, commit_files) holds no files when read for one node (its layers
    are listed once the node's projection names them), else all but fleet.yaml."""
    revision: str
    root: str
    files: tuple
    problems: tuple
    fleet: FleetRoot | None = None


@dataclass(frozen=True)
class FleetRoot:
    """A fleet root listed from a commit or an archive: fleet.yaml (display, object id,
    bytes or size), every directory below the root (relative paths, for a missing layer),
    and the repository the layers' blobs are read from when a node's projection names them
    (layer_files); None: every manifest file is in ManifestFiles.files already."""
    common: Path | None
    sub: str
    file: tuple
    dirs: frozenset
    held: Callable[[str, str], bool] | None = field(default=None, compare=False)
    trees: dict | None = field(default=None, compare=False, repr=False)


def blob_id(raw, hexlen: int) -> str:
    """git's object id of a blob with these bytes (`hexlen`: the id's length in hex digits,
    40 for sha1 repositories, 64 for sha256)."""
    h = hashlib.sha1() if hexlen == 40 else hashlib.sha256()
    h.update(b"blob %d\0" % len(raw))
    h.update(raw)
    return h.hexdigest()


def _link(store: Store, rel: str, oid: str) -> tuple[str, str | None]:
    """(target as written, path it names below the tree's top, None when outside) of the
    symlink `rel`."""
    target = store.raw(oid, "blob").decode("utf-8", "surrogateescape")
    dest = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return target, None if target.startswith("/") or dest == ".." or dest.startswith("../") else dest


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def manifest_files(store: Store, commit: str, sub: str, root: str,
                   held: Callable[[str, str], bool] | None = None, within: tuple[str, ...] | None = None
                   ) -> ManifestFiles:
    """The manifest files of `commit` below `sub`, displayed as `root` + their path there,
    read with the rules of a directory on disk (module comment). `held(display, oid)`:
    True when the caller holds that blob's bytes already (they are not read). `within`:
    only the paths starting with one of these (`dir/`) are listed (a fleet node's layers);
    symlinks still resolve anywhere below `sub`, as on disk."""
    entries = store.listing(commit, sub)
    problems: list[Problem] = []
    if entries is None:
        problems.append(Problem(root, 0, 0, "", "", "", f"there is no directory {show(sub)} in revision "
                                f"{commit[:12]}", ERROR))
        return ManifestFiles(commit, root, (), tuple(problems))
    shown = (lambda rel: root + rel)
    wanted: dict[str, str] = {}  # display -> rel of the blob to read (a link's target)
    read_once: set[str] = set()
    for rel in sorted(entries):
        mode, oid = entries[rel]
        if _hidden(rel) or (within is not None and not (rel + "/").startswith(within)):  # (a link may be a layer)
            continue
        if mode == "160000":
            problems.append(Problem(shown(rel), 0, 0, "", "", "", "this is a git submodule; nftrec does not read "
                                    "submodules, so its manifests were skipped", WARNING))
        elif mode == "120000":
            target, dest = _link(store, rel, oid)
            if dest is None:
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
                    below = r[len(dest) + 1:]
                    if r.endswith(SUFFIXES) and not _hidden(below) and r not in read_once:
                        read_once.add(r)
                        wanted[shown(f"{rel}/{below}")] = r
            else:
                problems.append(Problem(shown(rel), 0, 0, "", "", "", "this symlink is dangling or points at "
                                        "another link; fix or remove it", ERROR))
        elif rel.endswith(SUFFIXES) and rel not in read_once:
            read_once.add(rel)
            wanted[shown(rel)] = rel
    files = []
    for display in sorted(wanted):
        oid = entries[wanted[display]][1]
        if held is not None and held(display, oid):
            files.append((display, oid, None))
            continue
        raw = store.raw(oid, "blob")
        files.append((display, oid, raw if len(raw) <= MAX_FILE_BYTES else len(raw)))
    return ManifestFiles(commit, root, tuple(files), tuple(problems))


def commit_files(store: Store, commit: str, sub: str, root: str,
                 held: Callable[[str, str], bool] | None = None, whole: bool = False) -> ManifestFiles:
    """manifest_files of `commit` below `sub`; for a fleet root (fleet.yaml at its top) only
    fleet.yaml's blob is read, the layers wait for a node's projection (layer_files), or
    with `whole` every manifest file but fleet.yaml is read now (many nodes' projections
    of one revision: `diff --git --fleet`). fleet.yaml that is not a regular file (a link,
    a submodule) is an error."""
    entries = store.listing(commit, sub)
    found = entries.get(FLEET_FILE) if entries is not None else None
    if found is None:
        return manifest_files(store, commit, sub, root, held)
    mode, oid = found
    display = root + FLEET_FILE
    if mode not in ("100644", "100755"):
        return ManifestFiles(commit, root, (), (Problem(display, 0, 0, "", "", "", "fleet.yaml is not a regular file "
                                                        "in this revision (a symlink or a submodule); commit the "
                                                        "file itself", ERROR),))
    raw = store.raw(oid, "blob")
    dirs = {d for rel in entries for d in _parents(posixpath.dirname(rel))}
    for rel, (mode, oid) in entries.items():  # a link to a directory of the tree may be a layer, as on disk
        dest = _link(store, rel, oid)[1] if mode == "120000" and not _hidden(rel) else None
        if dest is not None and dest in dirs:
            dirs.add(rel)
    fleet = FleetRoot(None if whole else store.common, sub, (display, oid, raw if len(raw) <= MAX_FILE_BYTES else len(raw)),
                      frozenset(dirs), held, store._trees)
    if not whole:
        return ManifestFiles(commit, root, (), (), fleet)
    listed = manifest_files(store, commit, sub, root, held)
    return ManifestFiles(commit, root, tuple(f for f in listed.files if f[0] != display), listed.problems, fleet)


def _parents(rel: str) -> list[str]:
    """`a/b/c` -> [a, a/b, a/b/c]; "" -> []."""
    parts = rel.split("/") if rel else []
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def layer_files(files: ManifestFiles, layers: tuple[str, ...]) -> ManifestFiles:
    """The manifest files of a fleet root's (commit_files) directories `layers` (relative
    to the root; existing ones, FleetRoot.dirs), read from the object store with the rules
    of manifest_files: symlinks may point anywhere in the fleet root. ObjectError when an
    object is missing or damaged."""
    fleet = files.fleet
    if not layers:
        return ManifestFiles(files.revision, files.root, (), ())
    with Store(fleet.common, fleet.trees) as store:
        return manifest_files(store, files.revision, fleet.sub, files.root, fleet.held,
                              within=tuple(rel + "/" for rel in layers))
