"""Manifest intake's first step: the manifest tree -> documents (plain data) with positions.

Pipeline position: **load** -> validate -> model -> compile -> ...

`walk` lists the files (symlinks followed only inside the tree, hidden entries skipped),
`read_file` reads and parses one (intake/parse.py), `tree_digest` hashes the tree's bytes.
Nothing keeps per-field positions while parsing: only error messages need them, and
`locate()` re-parses the one file concerned with ruamel's position-keeping ("rt") loader.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from reconciler.intake.model import Source
from reconciler.intake.parse import MAX_DEPTH, MAX_FILE_BYTES, Refused, decode_text, parse_json, parse_yaml, yaml_error
from reconciler.intake.problems import ERROR, UNKNOWN_FIELD, WARNING, Problem, field_path, show, unknown_field

SUFFIXES = (".yaml", ".yml", ".json")
FLEET_FILE = "fleet.yaml"  # fleet.FLEET_FILE, here so that telling a fleet root imports nothing more


@dataclass
class SourceFile:
    """One file read: its display path, real path and bytes (kept for locate())."""

    display: str
    real: str
    text: str
    _rt_docs: list | None = field(default=None, repr=False)


@dataclass
class Document:
    """One Kubernetes object as plain data, with where it came from."""

    data: dict
    source: Source  # file (display path), line, col of the object
    file: str  # display path
    index: int  # YAML document index in the file (0-based)
    path: tuple = ()  # path of the object inside that YAML document: ("items", 3) in a List
    src: SourceFile | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        k = self.data.get("kind")
        return k if isinstance(k, str) else ""


@dataclass
class LoadResult:
    documents: list[Document]
    problems: list[Problem]
    revision: str  # git commit of the worktree, else "sha256:<digest>"
    digest: str  # sha256 of every file read (sorted relative path + bytes)
    files: int  # manifest files read
    root: str  # the resolved directory actually read


# --- the tree: its walk and its digest -----------------------------------------------------


@dataclass(frozen=True)
class Walk:
    """What a walk of the manifest root found."""

    resolved: Path | None  # the root, links resolved; None when it does not exist
    paths: list[tuple[str, Path]]  # (display path, real path), sorted by display path
    problems: tuple[Problem, ...]  # links leaving the tree, unreadable directories, ...
    prefix: str = ""  # what every display path starts with (display_prefix), for tree_digest
    scope: tuple[str, ...] = ()  # a fleet node's: the display paths read (a `/` end: a directory's files); () all


def walk(root: str | Path) -> Walk:
    """The manifest files of a root (a directory, or one file). Never raises for bad input."""
    display_root = str(root)
    problems: list[Problem] = []
    try:
        resolved = Path(root).resolve(strict=True)  # one git-sync revision, read whole
    except (OSError, RuntimeError):
        problems.append(_file_problem(display_root, "this manifest directory does not exist (or is a dangling link); "
                                      "check the path"))
        return Walk(None, [], tuple(problems))
    return Walk(resolved, walk_resolved(resolved, display_root, problems), tuple(problems),
                display_prefix(display_root, resolved))


def is_fleet_root(root: str | Path) -> bool:
    """Whether `root` is a directory holding fleet.yaml as a regular file (one lstat): a
    fleet repository (intake/fleet.py), read per node (intake/fleetread.py)."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(root, FLEET_FILE)).st_mode)
    except OSError:
        return False


def display_prefix(display_root: str, resolved: Path) -> str:
    """The start every display path of a walk shares: the root as it was named, with a
    separator for a directory (`m` and `m/` alike), whole for a one-file root."""
    return display_root if resolved.is_file() else os.path.join(display_root, "")


def walk_resolved(resolved: Path, display_root: str, problems: list[Problem]) -> list[tuple[str, Path]]:
    """walk() of a root already resolved, appending its problems to `problems`."""
    if resolved.is_file():  # a single file is accepted too
        return [(display_root, resolved)]
    if resolved.is_dir():
        link = gitsync_link(resolved)
        if link is not None:
            problems.append(_file_problem(display_root, f"this looks like git-sync's root (.git, .worktrees/ and the "
                                          f"link {link} -> .worktrees/...), not a manifest directory; use "
                                          f"{os.path.join(display_root, link)}"))
            return []
        return manifest_files(resolved, display_root, problems)
    problems.append(_file_problem(display_root, "this is neither a directory nor a file; point nftrec at the "
                                  "manifest directory"))
    return []


def gitsync_link(directory: Path) -> str | None:
    """The name of the link git-sync publishes (`current`, or its --link) when `directory`
    is git-sync's root: a `.git`, a `.worktrees/` and a link into it. The root holds each
    worktree git-sync keeps (two during a swap), so it is refused rather than read."""
    worktrees = directory / ".worktrees"
    if not worktrees.is_dir() or not (directory / ".git").exists():
        return None
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_symlink() and not entry.name.startswith("."):
            target = os.path.realpath(entry.path)
            if os.path.dirname(target) == str(worktrees):
                return entry.name
    return None


def chunk(display: str, raw: bytes) -> bytes:
    """What one file adds to the tree digest: its display path and its bytes."""
    return display.encode("utf-8", "surrogateescape") + b"\0" + raw + b"\0"


def tree_digest(chunks: list[bytes], memo: list | None = None, prefix: str = "") -> str:
    """The manifest tree's digest: sha256 over its files' chunks in path order, each without
    `prefix` (what every display path starts with: the root as named), so that it depends
    on the files' paths in the tree and their bytes only. `memo`: the last call's [(chunk,
    hash state after it)], updated in place; the hash resumes after the longest prefix of
    the same chunk objects (a watch reads a tree where few change)."""
    skip = len(prefix.encode("utf-8", "surrogateescape"))
    i = 0
    if memo is not None:
        while i < len(chunks) and i < len(memo) and memo[i][0] is chunks[i]:
            i += 1
        del memo[i:]
    hasher = memo[i - 1][1].copy() if i else hashlib.sha256()
    for c in chunks[i:]:
        hasher.update(memoryview(c)[skip:])
        if memo is not None:
            memo.append((c, hasher.copy()))
    return hasher.hexdigest()


def read_bytes(real: Path) -> bytes | None:
    """The file's bytes, or None where read_file refuses it unparsed (unreadable, too big)."""
    try:
        if real.stat().st_size > MAX_FILE_BYTES:
            return None
        raw = real.read_bytes()
    except OSError:
        return None
    return raw if len(raw) <= MAX_FILE_BYTES else None


def manifest_files(root: Path, display_root: str, problems: list[Problem], inside: Path | None = None
                   ) -> list[tuple[str, Path]]:
    """Manifest files under root as (display path, real path), sorted by display path.

    Symlinks are followed (git-sync publishes revisions as links) but must stay inside
    `inside` (default root: a fleet's layer may link anywhere in the fleet root); hidden
    entries are skipped.
    """
    inside = inside or root
    out: list[tuple[str, Path]] = []
    seen_dirs = {root, inside}  # a link to the fleet root would read it whole (fleet.yaml, every layer)
    seen_files: set[Path] = set()
    stack: list[tuple[Path, str]] = [(root, display_root)]
    while stack:
        real_dir, shown_dir = stack.pop()
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
        except OSError as e:
            problems.append(_file_problem(shown_dir, f"cannot read this directory ({e.strerror}); check its permissions"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            shown = os.path.join(shown_dir, entry.name)
            real = Path(entry.path)
            if entry.is_symlink():
                try:
                    target = real.resolve(strict=True)
                except (OSError, RuntimeError):
                    problems.append(_file_problem(shown, "this symlink is dangling or loops; fix or remove it"))
                    continue
                if not target.is_relative_to(inside):
                    problems.append(_file_problem(
                        shown, f"this symlink points outside the manifest tree (to {show(str(target))}); "
                        "nftrec refuses it: copy the file into the tree or remove the link"))
                    continue
                real = target
            if real.is_dir():
                resolved = real.resolve()
                if resolved in seen_dirs:
                    continue  # a second link to a directory already read
                seen_dirs.add(resolved)
                stack.append((resolved, shown))
            elif entry.name.endswith(SUFFIXES) and not real.is_file():
                problems.append(Problem(shown, 0, 0, "", "", "", "this is not a regular file (a FIFO, socket or device), "
                                        "so it was skipped; remove it from the manifest directory", WARNING))
            elif real.is_file() and entry.name.endswith(SUFFIXES):
                resolved = real.resolve()
                if resolved in seen_files:
                    continue  # the same file through a second link: read it once
                seen_files.add(resolved)
                out.append((shown, real))
    out.sort(key=lambda t: t[0])
    return out


def _file_problem(file: str, message: str, line: int = 0, col: int = 0) -> Problem:
    return Problem(file, line, col, "", "", "", message, ERROR)


_LIST_FIELDS = ("apiVersion", "kind", "metadata", "items")
_LIST_META_FIELDS = ("continue", "remainingItemCount", "resourceVersion", "selfLink")  # ListMeta


def _check_list_fields(doc: Document, problems: list[Problem]) -> None:
    """The fields of a `kind: List` wrapper itself (its items are checked as objects):
    unknown ones are reported as validate reports an object's (Problem.code)."""
    meta = doc.data.get("metadata")
    paths = [(k,) for k in doc.data if k not in _LIST_FIELDS]
    if isinstance(meta, dict):
        paths += [("metadata", k) for k in meta if k not in _LIST_META_FIELDS]
    for path in paths:
        line, col = locate(doc, path, key=True)
        known = _LIST_FIELDS if len(path) == 1 else _LIST_META_FIELDS
        problems.append(Problem(doc.file, line, col, "List", "", field_path(path), unknown_field(path, known),
                                ERROR, UNKNOWN_FIELD))


def read_file(display: str, real: Path, problems: list[Problem], docs: list[Document], yaml=parse_yaml) -> bytes:
    """Read and parse one manifest file, appending its documents and problems; returns
    its chunk of the tree digest (b"" when it could not be read). `yaml`: parse_yaml or
    a stand-in with its result (the watch's per-document reuse, intake/yamldocs.py).
    `real` needs only `name`, `stat()` and `read_bytes()` (intake/sources.py)."""
    try:
        size = real.stat().st_size
        if size > MAX_FILE_BYTES:
            raise Refused(f"this file is {size} bytes, over the {MAX_FILE_BYTES}-byte limit for one manifest file; split it")
        raw = real.read_bytes()
        if len(raw) > MAX_FILE_BYTES:  # grew while being read
            raise Refused(f"this file is over the {MAX_FILE_BYTES}-byte limit for one manifest file; split it")
    except OSError as e:
        problems.append(_file_problem(display, f"cannot read this file ({e.strerror}); check its permissions"))
        return b""
    except Refused as r:
        problems.append(_file_problem(display, r.message))
        return b""
    read = chunk(display, raw)
    try:
        text = decode_text(raw)
        if real.name.endswith(".json"):
            parsed = parse_json(text)
        else:
            try:
                parsed = yaml(text)
            except YAMLError as e:
                raise yaml_error(e, text) from None
            except RecursionError:
                raise Refused(f"nesting is deeper than {MAX_DEPTH} levels; no Kubernetes object needs that") from None
    except Refused as r:
        problems.append(_file_problem(display, r.message, r.line, r.col))
        return read
    src = SourceFile(display, str(real), text)
    for index, (data, line, col, items) in enumerate(parsed):
        if data is None:
            continue  # an empty document (`---` at the end, comments only)
        if not isinstance(data, dict):
            what = "a list" if isinstance(data, list) else f"a single value ({show(data)})"
            problems.append(_file_problem(display, f"this document is {what}, not a Kubernetes object (a mapping with apiVersion and kind); "
                                          "for several objects use `---` between documents or `kind: List` with `items`", line, col))
            continue
        if data.get("kind") == "List" and "items" in data:
            _check_list_fields(Document(data, Source(display, line, col), display, index, (), src), problems)
            entries = data.get("items")
            if not isinstance(entries, list):
                problems.append(_file_problem(display, "`items` of this List must be a list of objects", line, col))
                continue
            for i, item in enumerate(entries or []):
                iline, icol = items[i] if i < len(items) else (line, col)
                if not isinstance(item, dict):
                    problems.append(_file_problem(display, f"items[{i}] of this List is not an object; each item needs apiVersion and kind", iline, icol))
                    continue
                docs.append(Document(item, Source(display, iline, icol), display, index, ("items", i), src))
            continue
        docs.append(Document(data, Source(display, line, col), display, index, (), src))
    return read


def _rt_docs(src: SourceFile) -> list:
    if src._rt_docs is None:
        try:
            yaml = YAML(typ="rt")
            yaml.allow_duplicate_keys = True  # only positions are wanted here
            src._rt_docs = list(yaml.load_all(src.text))
        except Exception:  # positions are best effort; the document's own line remains
            src._rt_docs = []
    return src._rt_docs


def locate(doc: Document, path: tuple | list, *, key: bool = False) -> tuple[int, int]:
    """1-based (line, col) of a field path inside a document (the deepest part of the
    path that exists). key=True gives the key's position rather than the value's."""
    best = (doc.source.line, doc.source.col)
    if doc.src is None:
        return best
    docs = _rt_docs(doc.src)
    if doc.index >= len(docs):
        return best
    node = docs[doc.index]
    full = list(doc.path) + list(path)
    n_own = len(doc.path)
    for i, part in enumerate(full):
        lc = getattr(node, "lc", None)
        if lc is None:
            break
        last = i == len(full) - 1
        try:
            if isinstance(node, dict) and part in node:
                child = node[part]
                kl, kc = lc.key(part)
                if isinstance(child, (dict, list)) or key and last:
                    pos = (kl, kc)
                else:
                    pos = lc.value(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                child = node[part]
                pos = lc.item(part)
            else:
                break
        except (KeyError, IndexError, TypeError, AttributeError):
            break
        if i >= n_own - 1 or not path:
            best = (pos[0] + 1, pos[1] + 1)
        node = child
    return best


def plain_data(node):
    """ruamel's position-keeping ("rt") data (CommentedMap/Seq, scalar subclasses) -> plain Python data,
    for small files read with positions (the node config, probe annotations). Keys become
    plain strings."""
    if isinstance(node, dict):
        return {str(k): plain_data(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain_data(v) for v in node]
    if isinstance(node, bool) or type(node).__name__ == "ScalarBoolean":
        return bool(node)
    for t in (int, float, str):
        if isinstance(node, t):
            return t(node)
    return node