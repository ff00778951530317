"""Reading one manifest directory again and again (`nftrec watch`), re-parsing only what
changed: `Intake.read()` returns what `inventory.read_inventory` would (the oracle of
tests/test_watch.py), with the walk, each file's documents, checks and model objects and
the digest's hash state kept from the last read (the comment below lists them). A read
resolves git-sync's `current` link once and repeats if it moved meanwhile, so a snapshot
never mixes two revisions.
"""

# The caches of a read:
# - files: keyed by stat (path, inode, size, mtime, ctime); when the stat changed, by the
#   bytes of the same display path (a git-sync revision is a new worktree: each file is
#   compared, only changed ones are parsed). Files modified within RACY_SECONDS are
#   compared again next time (mtime granularity, as git's "racy" files). When the new
#   worktree is a git checkout, its index or `git ls-tree` gives each file's object id
#   (git.checkout_blobs); a file whose id is that of the bytes read before is only
#   stat'ed, and when the checkout holds the same files the old walk stands, re-rooted;
# - documents: an edited YAML file re-parses only its changed documents (yamldocs.py);
# - checks: per-document results are reused for documents whose data and position are
#   unchanged; the checks across documents are skipped when the only changes are the
#   endpoints of clean EndpointSlices (they read no endpoint): `_endpoints_only`;
# - the tree digest resumes after the longest unchanged prefix (load.tree_digest's memo).
# - `read_files`: with `verify`, the verified commit's files from the object store, each
#   entry keyed by its blob id: a new commit reads and parses only the blobs that changed.
# `read(changed)`: with the watcher's changed paths and the same resolved directory as
# last time, the tree is not walked again and only those files (and racy ones) are looked at.
# A fleet root (fleet.yaml at the top, `identity` its node): fleet.yaml is stat'ed at each
# read (its bytes compared when the stat moved) and projected again only when it or the
# identity changed; only the node's layers are walked and read; each document is
# substituted (fleetmerge) and the layers merged before check_tree; a new Env (variables,
# identity) checks every file again.

from __future__ import annotations

import hashlib
import os
import pickle
import time
from dataclasses import dataclass, replace
from pathlib import Path

from reconciler.compat import SLOTS
from reconciler.intake import yamldocs
from reconciler.intake.build import build_inventory, model_objects
from reconciler.intake.fleet import FLEET_FILE, Identity
from reconciler.intake.fleetmerge import check_fleet_document, merge
from reconciler.intake.fleetlisting import listed_node
from reconciler.intake.fleetread import project_fleet, walk_fleet
from reconciler.intake.git import checkout_blobs, revision_of
from reconciler.intake.gitobjects import blob_id
from reconciler.intake.load import (SUFFIXES, chunk, display_prefix, is_fleet_root, read_fleet_bytes, read_file, tree_digest, walk,
                                    walk_resolved)
from reconciler.intake.model import Inventory
from reconciler.intake.parse import MAX_FILE_BYTES, parse_yaml
from reconciler.intake.problems import ERROR, Problem
from reconciler.intake.sources import Blob
from reconciler.intake.validate import DocumentCheck, check_document, check_tree

RACY_SECONDS = 2.0  # files modified this recently are re-hashed on the next read


def _relative(real: Path, root: Path) -> str | None:
    """real.relative_to(root).as_posix() by string prefix (None: not under root), without
    pathlib parsing every path of every git-sync revision again."""
    prefix = str(root).rstrip("/") + "/"
    text = str(real)
    return text[len(prefix):] if text.startswith(prefix) and len(text) > len(prefix) else None


def _same_files(paths: list[tuple[str, Path]], old: Path, new: Path, blobs: dict, under: tuple[str, ...] = ()
                ) -> list[tuple[str, Path]] | None:
    """The walk of `old` as the walk of `new` gives it, when the new checkout's commit
    (`blobs`, git.checkout_blobs) has exactly the same manifest files and no links or
    submodules (those need the walk's rules); None: walk. `under`: a fleet node's layer
    directories (`base/`): only the commit's files there count."""
    rel = [_relative(real, old) for _, real in paths]
    if None in rel:
        return None
    listed = set()
    for path, (mode, _) in blobs.items():
        if any(part.startswith(".") for part in path.split("/")) or under and not path.startswith(under):
            continue
        if mode not in ("100644", "100755"):
            return None
        if path.endswith(SUFFIXES):
            listed.add(path)
    if listed != set(rel) or len(rel) != len(listed):
        return None
    return [(display, new / r) for (display, _), r in zip(paths, rel)]


def _keep_unchanged(docs: list, old: _FileEntry) -> None:
    """In a new version of a file, the documents whose data (the same object, from
    yamldocs) and position are unchanged become the previous version's Document objects,
    pointed at the new text: their checks, objects and models then stand as they are (by
    identity), and only the edited documents are looked at again."""
    if old.checks is None:
        return
    at = {(d.index, d.path): d for d in old.docs}
    for i, doc in enumerate(docs):
        before = at.get((doc.index, doc.path))
        if before is not None and before.data is doc.data and before.source == doc.source:
            before.src = doc.src  # locate() reads the new text, as for a fresh Document
            docs[i] = before


def _cross_key(doc) -> bytes:
    """What the checks across documents read of an EndpointSlice: all but its endpoints
    (validate._cross: identity, service label, addressType, ports; the duplicate check:
    identity)."""
    data = {k: v for k, v in doc.data.items() if k != "endpoints"}
    return hashlib.blake2b(pickle.dumps((doc.file, doc.index, doc.path, doc.source, data), 5),
                           digest_size=20).digest()


@dataclass
class _Tree:
    """The last check_tree run and the inventory built from it, for _endpoints_only."""

    entries: list  # the _FileEntry of each file, in order
    load_problems: list
    problems: list
    objects: list
    position: dict  # id(doc) -> index in `objects`
    problem_files: set
    inventory: Inventory | None = None
    slice_at: dict | None = None  # id(doc) of an EndpointSlice -> index in inventory.endpoint_slices
    fields: str = "strict"  # the field validation it was checked with


def _content_key(doc) -> bytes:
    """What check_document's result depends on: the document's data (pickle keeps the
    types: a YAML 1.1 boolean is a str subclass that validates differently), its file
    and its position there (problems carry positions)."""
    return hashlib.blake2b(pickle.dumps((doc.file, doc.index, doc.path, doc.source, doc.data), 5),
                           digest_size=20).digest()


def _same_place_and_data(doc, old) -> bool:
    """Equal _content_key, without pickling: an unchanged document of an edited file keeps
    its data object (yamldocs) and, when no line moved, its position."""
    return doc.data is old.data and doc.index == old.index and doc.path == old.path and doc.source == old.source


def _clean(res) -> bool:
    return res.obj is not None and not res.problems and res.unknown_kind is None


@dataclass(eq=False, **SLOTS)
class _FileEntry:
    display: str
    stat: tuple
    chunk: bytes  # what load_manifests feeds its digest for this file
    docs: list
    problems: list
    racy: bool
    segments: dict  # yamldocs.parse's segments of this version: an edit re-parses the changed documents only
    checks: list | None = None  # check_document's result per document, once checked
    prev: _FileEntry | None = None  # the version this one replaced, until checked (its results are reused)
    blob: str | None = None  # git's object id of its bytes, once a swap to a git checkout asked


@dataclass
class _FleetState:
    """fleet.yaml as the last read found it, and its projection for the identity."""

    identity: Identity | None
    key: tuple  # stat key, as _FileEntry.stat
    racy: bool
    raw: bytes | None
    head: bytes  # its chunk of the tree digest (the first)
    projection: object  # fleet.Projection, or None when it could not be projected
    problems: tuple
    under: tuple[str, ...]  # the node's layer directories, relative (`base/`)
    scope: tuple[str, ...]  # load.Walk.scope: fleet.yaml and the layer directories, displayed


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
    """Reads the manifest directory like `inventory.read_inventory`, with caches (module doc).
    `read()` returns what read_inventory would: the oracle in tests/test_watch.py."""

    def __init__(self, directory: Path | str, *, strict: bool = False, identity: Identity | None = None):
        self.shown = str(directory)
        self.identity = identity  # a fleet root's node (watch sets the node config's)
        self._fleet: _FleetState | None = None  # fleet.yaml as last read and projected
        self.path = Path(os.path.abspath(directory))
        self.strict = strict
        self.fields = "strict"  # validate.settle's field validation (watch sets the node config's)
        self._files: dict[str, _FileEntry] = {}
        self._models: dict[int, tuple] = {}  # id(doc) -> (doc, [model objects])
        self._hashed: list = []  # load.tree_digest's memo
        self._blob_ids: dict = {}  # git.dirty's memo
        self._tree: _Tree | None = None
        self._walked: tuple | None = None  # (resolved dir, [(display, real)], walk problems, fleet layers) of the last walk
        self._layer: dict[str, int] = {}  # a fleet node's: display path -> its layer's index
        self._env = None  # a fleet node's Env the file entries were checked with (None: a plain root)
        self.looked = 0  # files stat'ed or read by the last read (for tests)
        self.cross = False  # the last read re-ran the checks across documents (for logs and tests)
        self.parsed = 0  # files parsed by the last read (for logs and tests)
        self.checked = 0  # documents checked (check_document) by the last read
        self.compared = 0  # files read to compare with the cached bytes by the last read
        self.git = False  # the last read asked git what the new checkout holds (a swap to a git checkout)

    def read(self, changed: set[str] | None = None) -> Snapshot:
        """The snapshot; `changed`: the absolute paths that changed since the last read
        (module doc), None to walk the tree."""
        for attempt in range(5):
            try:
                resolved = self.path.resolve(strict=True)
            except (OSError, RuntimeError):
                missing = walk(self.shown)  # its problem says so
                return Snapshot(Inventory(), list(missing.problems), "", tree_digest([]), 0, self.shown)
            snap = self._read(resolved, changed if attempt == 0 else None)
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
        if e is not None and key is not None and st.st_size <= MAX_FILE_BYTES:
            try:
                raw = real.read_bytes()
            except OSError:
                raw = None
            self.compared += 1
            if raw is not None and len(raw) + len(display) + 2 == len(e.chunk):
                # the same bytes (a git-sync worktree's unchanged file): a compare, no hash
                if e.chunk == chunk(display, raw):
                    e.stat, e.racy = key, self._racy(st)
                    return e
        return self._parse(display, real, e, key or (), key is None or self._racy(st))

    def _parse(self, display: str, source, e: _FileEntry | None, key: tuple, racy: bool,
               blob: str | None = None) -> _FileEntry:
        """A new version of the file `display` parsed from `source` (a path, or bytes in a
        sources.Blob), its unchanged documents reused from `e`, the version before."""
        problems: list = []
        docs: list = []
        known = e.segments if e is not None else None
        segments: dict = {}

        def yaml(text: str) -> list:
            parsed, new = yamldocs.parse(text, known, parse_yaml)
            segments.update(new)
            return parsed

        read = read_file(display, source, problems, docs, yaml)
        self.parsed += 1
        if known:
            _keep_unchanged(docs, e)
        e = _FileEntry(display, key, read, docs, problems, racy, segments,
                       prev=e if e is not None and e.checks is not None else None, blob=blob)
        self._files[display] = e
        return e

    def holds(self, display: str, oid: str) -> bool:
        """Whether the last read parsed, at `display`, the blob `oid` (read_files needs not
        its bytes)."""
        e = self._files.get(display)
        return e is not None and e.blob == oid

    def read_files(self, files, resolved: Path) -> Snapshot:
        """The snapshot of a verified commit's manifest files (gitobjects.ManifestFiles,
        read from the object store at `resolved`): exactly their bytes are parsed, never
        the worktree's; a file whose blob id is the one read before is not looked at."""
        self.parsed = self.checked = self.compared = self.looked = 0
        self.cross = self.git = False
        self._walked = None  # a later read of the worktree walks it
        problems: list[Problem] = list(files.problems)
        entries: list[_FileEntry] = []
        chunks: list[bytes] = []
        listed = files.files
        if files.fleet is not None:  # a fleet root: the node's layers of the commit (fleetlisting.listed_node)
            node = listed_node(files, self.identity)
            if node.projection is not None:
                self._settle(node.projection)
            listed, chunks = node.files, [node.head]
            problems.extend(node.problems)
            self._layer = dict(zip([f[0] for f in listed], node.layers))
        else:
            self._settle(None)
        for display, oid, raw in listed:
            e = self._files.get(display)
            if raw is not None and (e is None or e.blob != oid):
                self.looked += 1
                if e is not None and isinstance(raw, bytes) and e.chunk == chunk(display, raw):
                    e.blob = oid  # the same bytes at the same place
                else:
                    e = self._parse(display, Blob(display.rsplit("/", 1)[-1], raw), e, (), False, oid)
            entries.append(e)
            chunks.append(e.chunk)
            problems.extend(e.problems)
        seen = {display for display, _, _ in listed}
        for gone in set(self._files) - seen:
            del self._files[gone]
        digest = tree_digest(chunks, self._hashed, files.root)
        checked_problems, inventory = self._check(problems, entries, files.revision)
        return Snapshot(inventory, checked_problems, files.revision, digest, len(entries), str(resolved))

    @staticmethod
    def _same_blob(e: _FileEntry, display: str, real: Path, root: Path, blobs: dict) -> bool:
        """The new checkout's commit holds, at `real`, the bytes `e` was read from."""
        try:
            mode, oid = blobs[_relative(real, root)]
        except KeyError:
            return False
        if mode not in ("100644", "100755") or oid is None:  # None: the index cannot vouch for it
            return False
        if e.blob is None or len(e.blob) != len(oid):
            skip = len(display.encode("utf-8", "surrogateescape")) + 1
            e.blob = blob_id(memoryview(e.chunk)[skip:-1], len(oid)) if e.chunk else ""
        return e.blob == oid

    def _restat(self, e: _FileEntry, display: str, real: Path) -> _FileEntry:
        """An entry whose bytes the new checkout's commit holds, at its path there: its
        stat key moves there; a file of another size is read after all (a checkout that
        is not its commit's files, e.g. edited by hand)."""
        try:
            st = real.stat()
        except OSError:
            return self._file(display, real)
        if st.st_size + len(display.encode("utf-8", "surrogateescape")) + 2 != len(e.chunk):
            return self._file(display, real)
        e.stat = (str(real), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        e.racy = False  # its bytes are its commit's
        return e

    @staticmethod
    def _racy(st: os.stat_result) -> bool:
        return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_SECONDS * 1e9

    def _read(self, resolved: Path, changed: set[str] | None = None) -> Snapshot:
        self.parsed = self.checked = self.compared = self.looked = 0
        self.cross = self.git = False
        problems: list[Problem] = []
        walked = self._walked
        fleet = self._project(resolved) if is_fleet_root(resolved) else None
        if fleet is None:
            self._settle(None)
        raw = None if fleet is None else fleet.raw
        projected = None if fleet is None else (raw, fleet.identity)  # the walk stands while these do
        blobs = None  # a swap to a git checkout: what its commit holds (module doc)
        if changed is None and walked is not None and walked[0] != resolved and resolved.is_dir():
            blobs = checkout_blobs(resolved)
            self.git = blobs is not None
        if changed is not None and walked is not None and walked[0] == resolved and walked[3] == projected:
            paths = walked[1]
            problems.extend(walked[2])
        elif blobs is not None and walked[3] == projected and (
                paths := _same_files(walked[1], walked[0], resolved, blobs, () if fleet is None else fleet.under)):
            problems.extend(walked[2])  # the same files in the new checkout: no walk
            self._walked = (resolved, paths, walked[2], projected)
        elif fleet is not None:  # the node's layers only (fleetread.walk_fleet)
            fw = walk_fleet(resolved, self.shown, self.identity, raw, lambda *_: (fleet.projection, list(fleet.problems)))
            paths = fw.walk.paths
            problems.extend(fw.walk.problems)
            self._layer = dict(zip([display for display, _ in paths], fw.layers))
            self._walked = (resolved, paths, tuple(problems), projected)
        else:
            paths = walk_resolved(resolved, self.shown, problems)
            self._walked = (resolved, paths, tuple(problems), None)
        entries: list[_FileEntry] = []
        chunks: list[bytes] = [] if fleet is None else [fleet.head]
        seen: set[str] = set()
        for display, real in paths:
            e = self._files.get(display)
            if blobs is not None and e is not None and self._same_blob(e, display, real, resolved, blobs):
                self.looked += 1  # the commit holds the bytes read before: a stat (size check)
                e = self._restat(e, display, real)
            elif e is None or changed is None or (e.racy and blobs is None) or str(real) in changed:
                self.looked += 1
                e = self._file(display, real)
            seen.add(display)
            entries.append(e)
            chunks.append(e.chunk)
            problems.extend(e.problems)
        for gone in set(self._files) - seen:
            del self._files[gone]
        prefix = display_prefix(self.shown, resolved)
        digest = tree_digest(chunks, self._hashed, prefix)
        revision = revision_of(resolved, digest, chunks, prefix, self._blob_ids, scope=() if fleet is None else fleet.scope)
        checked_problems, inventory = self._check(problems, entries, revision)
        return Snapshot(inventory, checked_problems, revision, digest, len(paths), str(resolved))

    def _settle(self, projection) -> None:
        """The Env the file entries are checked with: a fleet node's (`projection`, None
        for a plain root). Another one checks every file again (each document's
        substitution depends on it). Not called for a projection that failed: the
        entries stay for the next good fleet.yaml."""
        if projection is None:
            if self._env is not None:  # no longer a fleet root: read as a directory
                self._files.clear()
                self._tree = self._env = self._fleet = None
            return
        env = projection.env
        if env is not None and (self._env is None or self._env.digest != env.digest):
            self._files.clear()
            self._tree, self._env = None, env

    def _project(self, resolved: Path) -> _FleetState:
        """fleet.yaml of the fleet root `resolved`, projected for the identity: the last
        projection while its stat (else its bytes) is unchanged. A new Env (variables,
        the identity) checks every file again; an invalid fleet.yaml keeps the entries."""
        path = resolved / FLEET_FILE
        old = self._fleet
        try:
            st = path.stat()
            key: tuple = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            racy = self._racy(st)
        except OSError:
            key, racy = (), True
        same = old is not None and old.identity == self.identity
        if same and key and old.key == key and not old.racy:
            return old
        raw = read_fleet_bytes(path)
        if same and raw is not None and raw == old.raw:
            old.key, old.racy = key, racy
            return old
        projection, problems = project_fleet(self.shown, raw, self.identity)
        if projection is not None:
            self._settle(projection)
        under = () if projection is None or not projection.ok else tuple(layer.rel + "/" for layer in projection.layers)
        scope = (os.path.join(self.shown, FLEET_FILE),) + tuple(os.path.join(self.shown, u) for u in under)
        self._fleet = _FleetState(self.identity, key, racy, raw, chunk(scope[0], raw) if raw is not None else b"",
                                  projection, tuple(problems), under, scope)
        return self._fleet

    def _check(self, load_problems: list[Problem], entries: list[_FileEntry], revision: str) -> tuple[list[Problem], Inventory]:
        """validate.check and the inventory, with check_document's results cached per file
        entry (an edited file reuses its previous version's results of documents whose
        content and position are unchanged), check_tree and the inventory skipped where
        only endpoints changed (module doc)."""
        for e in entries:
            if e.checks is None:
                e.checks = self._check_file(e)
                e.prev = None
        fast = self._endpoints_only(load_problems, entries, revision)
        self.cross = fast is None
        if fast is not None:
            return fast
        documents: list = []
        results: list = []
        layers: list = []
        for e in entries:
            documents.extend(e.docs)
            results.extend(e.checks)
            if self._env is not None:
                layers.extend([self._layer[e.display]] * len(e.docs))
        merged: list = []
        if self._env is not None:  # a fleet node: its layers merged (fleetmerge.merge)
            documents, results, merged = merge(documents, results, layers)
        checked = check_tree(load_problems + merged, documents, results, strict=self.strict, fields=self.fields)
        position: dict[int, int] = {}
        for i, o in enumerate(checked.objects):
            position[id(o.doc)] = i
        tree = _Tree(entries, list(load_problems), checked.problems, checked.objects, position,
                     {p.file for p in checked.problems}, fields=self.fields)
        self._tree = tree
        self._build_inventory(tree, revision)
        return checked.problems, tree.inventory

    def _check_file(self, e: _FileEntry) -> list:
        """check_document of each document of a new file version; a document equal (data
        and position) to a clean one of the previous version reuses its result and models."""
        prev = e.prev
        at: dict = {}
        if prev is not None:
            at = {(d.index, d.path): (d, c) for d, c in zip(prev.docs, prev.checks) if _clean(c)}
        kept = {id(d): c for d, c in zip(prev.docs, prev.checks)} if prev is not None else {}
        out = []
        for n, doc in enumerate(e.docs):
            res = kept.get(id(doc))
            if res is not None and res.obj is not None and res.obj.doc is doc:
                out.append(res)  # the same Document (_keep_unchanged): its result stands
                continue
            # _content_key holds the position: only the document at the same place can match
            hit = at.get((doc.index, doc.path))
            if hit is not None and not _same_place_and_data(doc, hit[0]) and (
                    doc.source != hit[0].source or _content_key(doc) != _content_key(hit[0])):
                hit = None
            if hit is None:
                self.checked += 1
                out.append(self._check_document(e, n, doc))
                continue
            before, res = hit
            out.append(DocumentCheck(replace(res.obj, doc=doc), (), None))
            models = self._models.get(id(before))
            if models is not None and models[0] is before:
                self._models[id(doc)] = (doc, models[1])
        return out

    def _check_document(self, e: _FileEntry, n: int, doc) -> DocumentCheck:
        """check_document; a fleet node's document is substituted first, the substituted
        Document taking its place in the entry (fleetmerge.check_fleet_document)."""
        if self._env is None:
            return check_document(doc)
        e.docs[n], res = check_fleet_document(doc, self._env)
        return res

    def _endpoints_only(self, load_problems: list[Problem], entries: list[_FileEntry], revision: str):
        """check_tree's result and the inventory without running check_tree or building
        the inventory again, when every document that changed since the last run is a clean
        EndpointSlice whose endpoints alone changed, in a file none of its problems are in
        (module doc): the slices' objects and models are swapped in place. None: run
        check_tree."""
        tree = self._tree
        if (tree is None or tree.inventory is None or len(entries) != len(tree.entries)
                or load_problems != tree.load_problems or tree.fields != self.fields):
            return None
        swaps = []
        for e, old_e in zip(entries, tree.entries):
            if e is old_e:
                continue
            if e.display != old_e.display or len(e.docs) != len(old_e.docs):
                return None
            for doc, old, res in zip(e.docs, old_e.docs, e.checks):
                if doc is old:
                    continue  # unchanged (_keep_unchanged): its object and model stand
                if (not _clean(res) or res.obj.kind != "EndpointSlice" or doc.file in tree.problem_files
                        or id(old) not in tree.position or id(old) not in tree.slice_at):
                    return None
                if not _same_place_and_data(doc, old) and _cross_key(doc) != _cross_key(old):
                    return None
                swaps.append((old, replace(res.obj)))
        if not swaps:
            if revision != tree.inventory.revision:
                tree.inventory = replace(tree.inventory, revision=revision)
            return tree.problems, tree.inventory
        objects = list(tree.objects)
        slices = list(tree.inventory.endpoint_slices)
        for old, o in swaps:
            i = tree.position.pop(id(old))
            objects[i] = o
            tree.position[id(o.doc)] = i
            j = tree.slice_at.pop(id(old))
            self._models.pop(id(old), None)
            made = self._model(o)
            slices[j] = made[0]
            tree.slice_at[id(o.doc)] = j
        tree.entries, tree.objects = entries, objects
        tree.inventory = replace(tree.inventory, endpoint_slices=tuple(slices), revision=revision)
        return tree.problems, tree.inventory

    def _model(self, o) -> list:
        entry = self._models.get(id(o.doc))
        if entry is None or entry[0] is not o.doc:
            entry = self._models[id(o.doc)] = (o.doc, model_objects(o))
        return entry[1]

    def _build_inventory(self, tree: _Tree, revision: str) -> None:
        """inventory.build_inventory, with model objects cached per document; records where
        each EndpointSlice document's slice is (for _endpoints_only)."""
        cache: dict[int, tuple] = {}
        old, self._models = self._models, cache

        def cached(o) -> list:
            entry = old.get(id(o.doc))
            if entry is not None and entry[0] is o.doc:
                cache[id(o.doc)] = entry
                return entry[1]
            return self._model(o)

        inventory = build_inventory(tree.objects, revision, make=cached)
        index = {id(m): j for j, m in enumerate(inventory.endpoint_slices)}
        slice_at = {}
        for o in tree.objects:
            if o.kind == "EndpointSlice":
                slice_at[id(o.doc)] = index[id(cache[id(o.doc)][1][0])]
        tree.inventory, tree.slice_at = inventory, slice_at
