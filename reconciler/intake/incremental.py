"""Reading one manifest directory again and again, re-parsing only what changed.

`Intake.read()` returns what `inventory.read_inventory` would (tests/test_watch.py uses
that as its oracle), with caches for a long-running reader such as `nftrec watch`:
- files: parsed documents are cached per file, keyed by its stat (path, inode, size,
  mtime, ctime) and, when the stat changed, by the hash of its bytes (a git-sync revision
  re-uses the parse of every file it did not change). Files modified within RACY_SECONDS
  of a read are re-hashed next time (mtime granularity, as git's "racy" files);
- validation: per-document checks are cached per parsed document; only the checks across
  documents (`validate.check_tree`) run over everything;
- model: model objects are cached per document.

git-sync publishes a revision by swapping a symlink (`current -> rev-<sha>`). Every read
resolves the link once and reads all files from that one directory; if the link moved
during the read, the read is repeated, so a snapshot never mixes two revisions.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from reconciler.intake import load
from reconciler.intake.inventory import build_inventory, model_objects
from reconciler.intake.model import Inventory
from reconciler.intake.problems import ERROR, Problem
from reconciler.intake.validate import check_document, check_tree

RACY_SECONDS = 2.0  # files modified this recently are re-hashed on the next read


class _Recorder:
    """Stands in for load's hasher: keeps the bytes it is fed (display path + raw)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, b: bytes) -> None:
        self.parts.append(b)


@dataclass
class _FileEntry:
    stat: tuple
    sha: str  # of `chunk`
    chunk: bytes  # what load_manifests feeds its digest for this file
    docs: list
    problems: list
    racy: bool


@dataclass
class Snapshot:
    """One complete read of the manifest directory, validated and modelled."""

    inventory: Inventory
    problems: list[Problem]
    revision: str
    digest: str
    files: int
    root: str  # the resolved directory actually read

    @property
    def errors(self) -> int:
        return sum(p.severity == ERROR for p in self.problems)

    @property
    def ok(self) -> bool:
        return self.errors == 0


class Intake:
    """Reads the manifest directory like `load.read_inventory`, with caches (module doc).
    `read()` returns what read_inventory would: the oracle in tests/test_watch.py."""

    def __init__(self, directory: Path | str, *, strict: bool = False):
        self.shown = str(directory)
        self.path = Path(os.path.abspath(directory))
        self.strict = strict
        self._files: dict[str, _FileEntry] = {}
        self._checked: dict[int, tuple] = {}  # id(doc) -> (doc, obj or None, problems, unknown kind)
        self._models: dict[int, tuple] = {}  # id(doc) -> (doc, [model objects])
        self.parsed = 0  # files parsed by the last read (for logs and tests)

    def read(self) -> Snapshot:
        for _ in range(5):
            try:
                resolved = self.path.resolve(strict=True)
            except (OSError, RuntimeError):
                p = Problem(self.shown, 0, 0, "", "", "", "this manifest directory does not exist (or is a dangling "
                            "link); check the path", ERROR)
                return Snapshot(Inventory(), [p], "", hashlib.sha256().hexdigest(), 0, self.shown)
            snap = self._read(resolved)
            try:
                again = self.path.resolve(strict=True)
            except (OSError, RuntimeError):
                again = None
            if again == resolved:
                return snap
            # git-sync swapped the link while we read: read the new revision whole.
        return snap

    def _file(self, display: str, real: Path) -> _FileEntry:
        e = self._files.get(display)
        try:
            st = real.stat()
            key = (str(real), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        if e is not None and key is not None and e.stat == key and not e.racy:
            return e
        if e is not None and key is not None and st.st_size <= load.MAX_FILE_BYTES:
            try:
                raw = real.read_bytes()
            except OSError:
                raw = None
            if raw is not None:
                chunk = display.encode("utf-8", "surrogateescape") + b"\0" + raw + b"\0"
                if hashlib.sha256(chunk).hexdigest() == e.sha:
                    e.stat, e.racy = key, self._racy(st)
                    return e
        problems: list = []
        docs: list = []
        rec = _Recorder()
        load.read_file(display, real, problems, docs, rec)
        chunk = b"".join(rec.parts)
        self.parsed += 1
        e = _FileEntry(key or (), hashlib.sha256(chunk).hexdigest(), chunk, docs, problems,
                       key is None or self._racy(st))
        self._files[display] = e
        return e

    @staticmethod
    def _racy(st: os.stat_result) -> bool:
        return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_SECONDS * 1e9

    def _read(self, resolved: Path) -> Snapshot:
        self.parsed = 0
        problems: list[Problem] = []
        if resolved.is_file():
            paths = [(self.shown, resolved)]
        elif resolved.is_dir():
            paths = load.manifest_files(resolved, self.shown, problems)
        else:
            problems.append(Problem(self.shown, 0, 0, "", "", "", "this is neither a directory nor a file; point "
                                    "nftrec at the manifest directory", ERROR))
            paths = []
        hasher = hashlib.sha256()
        docs: list = []
        seen: set[str] = set()
        for display, real in paths:
            e = self._file(display, real)
            seen.add(display)
            hasher.update(e.chunk)
            problems.extend(e.problems)
            docs.extend(e.docs)
        for gone in set(self._files) - seen:
            del self._files[gone]
        digest = hasher.hexdigest()
        base = resolved if resolved.is_dir() else resolved.parent
        revision = load.find_revision(base) or f"sha256:{digest}"
        checked_problems, objs = self._check(problems, docs)
        inventory = self._inventory(objs, revision)
        return Snapshot(inventory, checked_problems, revision, digest, len(paths), str(resolved))

    def _check(self, load_problems: list[Problem], documents: list) -> tuple[list[Problem], list]:
        """validate.check, with the per-document part cached per parsed document."""
        cache: dict[int, tuple] = {}
        results = []
        for doc in documents:
            entry = self._checked.get(id(doc))
            if entry is None or entry[0] is not doc:
                entry = (doc, check_document(doc))
            cache[id(doc)] = entry
            results.append(entry[1])
        self._checked = cache
        checked = check_tree(load_problems, documents, results, strict=self.strict)
        return checked.problems, checked.objects

    def _inventory(self, objs: list, revision: str) -> Inventory:
        """inventory.build_inventory, with model objects cached per document."""
        cache: dict[int, tuple] = {}

        def cached(o) -> list:
            entry = self._models.get(id(o.doc))
            if entry is None or entry[0] is not o.doc:
                entry = (o.doc, model_objects(o))
            cache[id(o.doc)] = entry
            return entry[1]

        inventory = build_inventory(objs, revision, make=cached)
        self._models = cache
        return inventory
