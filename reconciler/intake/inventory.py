"""The intake read path: a manifest tree -> walk -> each file read (load, validate per
document, model; from the intake cache when given one) -> the tree's digest, the checks
across documents and the inventory.

`nftrec watch` reads with intake/incremental.py, which plugs its own per-file reuse into
the same steps (load.walk, load.read_file, load.tree_digest, git.revision_of,
validate.check_tree, build.build_inventory). Standard input and git revisions are read
into a LoadResult (intake/sources.py, intake/git.py) and checked as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler import progress
from reconciler.heap import no_cyclic_gc
from reconciler.intake import model
from reconciler.intake.build import build_inventory
from reconciler.intake.cache import FileResult, open_cache, parse_file, read_all
from reconciler.intake.git import load_listed, revision_files, revision_of
from reconciler.intake.gitobjects import ManifestFiles
from reconciler.intake.load import Document, LoadResult, Walk, is_fleet_root, read_file, tree_digest, walk
from reconciler.intake.problems import Problem
from reconciler.intake.sources import Blob, display_root, is_stdin
from reconciler.intake.validate import DocumentCheck, check, check_tree

if TYPE_CHECKING:
    from reconciler.intake.fleet import Identity
    from reconciler.intake.fleetread import FleetWalk

# The fleet modules are imported where a fleet root is read: a plain root's read pays nothing for them.


@dataclass
class InventoryResult:
    inventory: model.Inventory
    problems: list[Problem] = field(default_factory=list)  # errors, warnings and notices
    documents: int = 0  # objects read (List items counted one by one)
    files: int = 0  # manifest files read
    digest: str = ""  # sha256 of the files read

    @property
    def ok(self) -> bool:
        return not any(p.is_error for p in self.problems)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.is_error]


def inventory_from_load(loaded: LoadResult, *, strict: bool = False, fields: str = "strict") -> InventoryResult:
    checked = check(loaded, strict=strict, fields=fields)
    inv = build_inventory(checked.objects, loaded.revision)
    return InventoryResult(inv, checked.problems, checked.documents, loaded.files, loaded.digest)


def load_manifests(root: str | Path) -> LoadResult:
    """Every manifest under root, parsed (not validated). Never raises for bad input."""
    w = walk(root)
    problems = list(w.problems)
    docs: list[Document] = []
    chunks = [read_file(display, real, problems, docs) for display, real in w.paths]
    digest = tree_digest(chunks, prefix=w.prefix)
    return LoadResult(docs, problems, revision_of(w.resolved, digest, chunks, w.prefix), digest, len(w.paths),
                      str(w.resolved) if w.resolved is not None else str(root))


def read_inventory(root: str | Path, *, strict: bool = False, fields: str = "strict", cache_dir: Path | str | None = None,
                   identity: Identity | None = None) -> InventoryResult:
    """load -> validate -> model for one manifest directory. Never raises for bad input:
    check `.ok` and `.problems`; `.inventory` holds only the objects that were valid.
    `-` reads standard input (intake/sources.py). `cache_dir`: the intake cache
    (intake/cache.py); the result is the same with or without it. `strict`, `fields`:
    --strict and the field validation (validate.settle). `identity`: the node's, for a
    fleet root (fleet.yaml at the top: only its layers are read, intake/fleetread.py)."""
    with progress.step(f"reading manifests from {display_root(root)}"), no_cyclic_gc():
        if is_stdin(root):  # read once, nothing to key a cache on
            return read_stdin(identity=identity, strict=strict, fields=fields)
        fleet = fleet_walk(root, identity) if is_fleet_root(root) else None
        w = walk(root) if fleet is None else fleet.walk
        env = None if fleet is None else fleet.env
        if cache_dir is None:
            return assemble(w, [parse_file(*p, env) for p in w.paths], strict=strict, fields=fields, fleet=fleet)
        cache = open_cache(cache_dir)
        result = assemble(w, read_all(w.paths, cache, env), strict=strict, fields=fields, fleet=fleet)
        cache.finish(len(w.paths))
        return result


def fleet_walk(root: str | Path, identity: Identity | None) -> FleetWalk | None:
    """walk_fleet of a fleet root named `root`; None when it is not one (any more)."""
    from reconciler.intake.fleetread import walk_fleet

    try:
        resolved = Path(root).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return walk_fleet(resolved, str(root), identity) if is_fleet_root(resolved) else None


def read_documents(root: str | Path, identity: Identity | None = None) -> list[Document]:
    """The documents read_inventory checks, after a fleet node's substitution and merge
    (`render --manifests`; the caller has validated the tree)."""
    from reconciler.intake.fleetmerge import merge

    fleet = fleet_walk(root, identity)
    w = walk(root) if fleet is None else fleet.walk
    docs, checks, layers = [], [], []
    for n, res in enumerate(parse_file(*p, None if fleet is None else fleet.env) for p in w.paths):
        docs.extend(res.docs)
        checks.extend(res.checks)
        if fleet is not None:
            layers.extend([fleet.layers[n]] * len(res.docs))
    return docs if fleet is None else merge(docs, checks, layers)[0]


def read_revision(directory: Path, rev: str, commit: str | None = None, *, strict: bool = False,
                  fields: str = "strict", identity: Identity | None = None) -> InventoryResult:
    """The manifests under `directory` as revision `rev` has them, validated: like
    read_inventory on a checkout of `rev` (a fleet root: `identity`'s projection of it).
    The inventory's revision is the commit."""
    listed = revision_files(directory, rev, commit)
    if listed.fleet is not None:
        return read_verified(listed, strict=strict, fields=fields, identity=identity)
    return inventory_from_load(load_listed(listed), strict=strict, fields=fields)


def read_stdin(stream=None, *, identity: Identity | None = None, strict: bool = False, fields: str = "strict"
               ) -> InventoryResult:
    """read_inventory of `-` (intake/stdin.py): a YAML stream, or an archive read as a
    plain tree or, of a fleet root, as `identity`'s projection (read_verified's listed
    path). An archive's revision is `sha256:<digest>` of the files read."""
    from reconciler.intake.stdin import stdin_source  # (tarfile and the unpack checks: only for `-`)

    got = stdin_source(stream)
    if isinstance(got, LoadResult):
        return inventory_from_load(got, strict=strict, fields=fields)
    result = read_verified(got, identity=identity, strict=strict, fields=fields)
    return replace(result, inventory=replace(result.inventory, revision=f"sha256:{result.digest}"))


def read_verified(files: ManifestFiles, *, strict: bool = False, fields: str = "strict", cache_dir: Path | str | None = None,
                  identity: Identity | None = None) -> InventoryResult:
    """read_inventory of a verified commit's manifest files (signatures.Verdict.files):
    exactly the bytes read from the object store, never the worktree's; the inventory's
    revision is the commit. A fleet root (files.fleet): fleet.yaml and the layers of
    `identity`'s projection, read from the commit (intake/fleetlisting.py)."""
    from reconciler.intake.fleetlisting import fleet_walk, listed_node

    what = f"revision {files.revision[:12]}" if files.revision else files.root  # (an archive on stdin: no revision)
    with progress.step(f"reading manifests of {what}"), no_cyclic_gc():
        node = listed_node(files, identity) if files.fleet is not None else None
        listed = files.files if node is None else node.files
        paths = [(display, Blob(display.rsplit("/", 1)[-1], raw)) for display, _oid, raw in listed]
        fleet = None if node is None else fleet_walk(node, files.root, paths)
        w = Walk(None, paths, files.problems, files.root) if fleet is None else fleet.walk
        env = None if fleet is None else fleet.env
        if cache_dir is None:
            return assemble(w, [parse_file(*p, env) for p in paths], strict=strict, fields=fields,
                            revision=files.revision, fleet=fleet)
        cache = open_cache(cache_dir)
        result = assemble(w, read_all(paths, cache, env), strict=strict, fields=fields, revision=files.revision,
                          fleet=fleet)
        cache.finish(len(paths))
        return result


def assemble(w: Walk, results: list[FileResult], *, strict: bool, fields: str = "strict", revision: str | None = None,
             fleet: FleetWalk | None = None) -> InventoryResult:
    """The per-file results in path order -> the tree's digest, checks and inventory
    (`revision`: the commit they were read from, else the walk's). `fleet`: a fleet
    node's read (intake/fleetread.py): fleet.yaml's chunk leads the digest and the
    documents are merged by layer (fleetmerge.merge) before the checks across them."""
    problems = list(w.problems)
    docs: list[Document] = []
    checks: list[DocumentCheck] = []
    layers: list[int] = []
    models: dict[int, list] = {}
    origins: dict[int, tuple] = {}  # model.Inventory.origins
    for n, res in enumerate(results):
        problems.extend(res.problems)
        docs.extend(res.docs)
        checks.extend(res.checks)
        if fleet is not None:
            layers.extend([fleet.layers[n]] * len(res.docs))
        for i, (doc, m) in enumerate(zip(res.docs, res.models)):
            if m is not None:
                models[id(doc)] = m
                if res.key is not None:
                    for j, obj in enumerate(m):
                        origins[id(obj)] = (obj, res.key, i, j)  # the file's key shared, not copied
    chunks = [res.chunk for res in results]
    if fleet is not None:
        from reconciler.intake.fleetmerge import merge

        chunks.insert(0, fleet.head)
        docs, checks, merged = merge(docs, checks, layers)
        problems.extend(merged)
    digest = tree_digest(chunks, prefix=w.prefix)
    checked = check_tree(problems, docs, checks, strict=strict, fields=fields)
    inventory = build_inventory(checked.objects, revision or revision_of(w.resolved, digest, chunks, w.prefix,
                                                                         scope=w.scope),
                                make=lambda o: models[id(o.doc)])
    if origins:
        inventory = replace(inventory, origins=origins)
    return InventoryResult(inventory, checked.problems, checked.documents, len(w.paths), digest)
