"""Many nodes' views of one fleet root, from one read of it: fleet.yaml is parsed once,
each layer directory listed once, each file parsed once (without substitution), and a
document's own check computed once for all nodes that see it alike; per node only the
projection, the merge, the checks across documents and the model run. Nodes whose
projections are identical (the same layers, the same values of the variables their
documents use) share one result, which is read_inventory's for each of them.

Pipeline position: the offline fleet review (`validate --fleet`, `diff --fleet`), in
place of inventory.read_inventory(identity=) once per node (intake/fleetread.py's rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reconciler.heap import no_cyclic_gc
from reconciler.intake.build import build_inventory, model_objects
from reconciler.intake.cache import FileResult, parse_file
from reconciler.intake.fleet import (FLEET_FILE, Env, Fleet, Identity, Projection,
                                    ResolvedLayer, node_layers, parse_fleet)
from reconciler.intake.fleetmerge import annotated, check_fleet_document, merge, variables_used
from reconciler.intake.fleetread import fleet_display, layer_files, missing_layer, unreadable_fleet
from reconciler.intake.git import revision_of
from reconciler.intake.inventory import InventoryResult
from reconciler.intake.load import Document, chunk, display_prefix, is_fleet_root, read_fleet_bytes, tree_digest, walk
from reconciler.intake.problems import Problem
from reconciler.intake.validate import DocumentCheck, check_tree

# a layer's files and the problems of listing them, or None when it is not there
Lister = Callable[[ResolvedLayer, list], "list[tuple[str, object]] | None"]


@dataclass
class NodeView:
    """One distinct projection: its read (as read_inventory gives it for each of `nodes`)
    and the nodes that have it, in inventory order."""

    result: InventoryResult
    nodes: list[str] = field(default_factory=list)
    node_names: frozenset = frozenset()  # names its endpoints mention (nodeName, hints.forNodes)


def _values(env: Env, names) -> tuple:
    """What a document using `names` reads from `env`: the values, and the node's name
    for one undefined (the error names the node)."""
    return tuple((n, env.lookup(n) or (None, env.node)) for n in names)


@dataclass
class _File:
    res: FileResult  # parsed, each document checked as it is (validate.check_document)
    used: list  # per document: None when the shared check holds, else the variables it uses
    names: frozenset  # the variables of all its documents


class FleetTree:
    """One read of a fleet root, or of a plain root (every node then reads all of it).
    `head`: fleet.yaml's bytes (None: not a fleet root, or unreadable when `fleet_root`);
    `lister`: a layer's files; `files`: a plain root's."""

    def __init__(self, display_root: str, resolved: Path | None, prefix: str, *, fleet_root: bool, head: bytes | None,
                 lister: Lister, files: list, problems: tuple = (), strict: bool = False, fields: str = "strict",
                 revision: str | None = None):
        self.display_root, self.resolved, self.prefix, self.fleet_root = display_root, resolved, prefix, fleet_root
        self.head, self.lister, self.files, self.problems = head, lister, files, problems
        self.strict, self.fields, self.revision = strict, fields, revision
        self.fleet: Fleet | None = None
        self.fleet_problems: list[Problem] = []
        if fleet_root:
            if head is None:
                self.fleet_problems = [unreadable_fleet(display_root)]
            else:
                self.fleet, self.fleet_problems = parse_fleet(fleet_display(display_root), head)
        self._parsed: dict[str, _File] = {}
        self._layers: dict[ResolvedLayer, tuple] = {}
        self._checks: dict[tuple, tuple[Document, DocumentCheck]] = {}
        self.views: dict[tuple, NodeView] = {}

    # --- the shared parse --------------------------------------------------------------

    def _file(self, display: str, real) -> _File:
        f = self._parsed.get(display)
        if f is None:
            res = parse_file(display, real)
            used, names = [], set()
            for doc in res.docs:
                got = variables_used(doc)
                shared = got is None and not (self.fleet_root and annotated(doc))
                used.append(None if shared else tuple(sorted(got or ())))
                names |= got or set()
            f = self._parsed[display] = _File(res, used, frozenset(names))
        return f

    def _layer(self, layer: ResolvedLayer) -> tuple:
        """(files, listing problems, the variables its files use), listed and parsed once."""
        got = self._layers.get(layer)
        if got is None:
            problems: list[Problem] = []
            files = self.lister(layer, problems)
            names = frozenset().union(*(self._file(d, r).names for d, r in files or ()))
            got = self._layers[layer] = (files, problems, names)
        return got

    def projection(self, identity: Identity) -> Projection:
        """fleet.project's result for `identity`, from fleet.yaml parsed once."""
        if self.fleet is None:
            return Projection(None, problems=tuple(self.fleet_problems))
        p = node_layers(self.fleet, identity)
        return Projection(p.fleet, p.layers, p.env, tuple(self.fleet_problems) + p.problems)

    # --- per node ----------------------------------------------------------------------

    def view(self, identity: Identity) -> NodeView:
        """The node's read, shared with every node of the same projection."""
        proj = self.projection(identity) if self.fleet_root else None
        key: tuple = ()
        if proj is not None:
            # an optional layer that is not there reads nothing: it does not tell nodes apart
            layers = tuple(la for la in proj.layers if self._layer(la)[0] is not None or self._layer(la)[1]) \
                if proj.ok else ()
            names = frozenset().union(*(self._layer(la)[2] for la in layers))
            env = proj.env
            key = (layers, proj.problems, _values(env, sorted(names)) if env else ())
        v = self.views.get(key)
        if v is None:
            with no_cyclic_gc():
                v = self.views[key] = self._read(proj)
        v.nodes.append(identity.name)
        return v

    def _read(self, proj: Projection | None) -> NodeView:
        problems = list(self.problems)
        files: list[tuple[str, object, int]] = []  # display, file, layer index
        scope: tuple = ()
        chunks: list[bytes] = []
        if proj is None:
            files = [(d, r, 0) for d, r in self.files]
        else:
            problems += proj.problems
            scope = (fleet_display(self.display_root),)
            chunks.append(chunk(fleet_display(self.display_root), self.head) if self.head is not None else b"")
            if proj.ok:
                for la in proj.layers:
                    found, listed, _ = self._layer(la)
                    problems += listed
                    if found is not None:
                        scope += (self.prefix + la.rel + "/",)
                        files += [(d, r, la.index) for d, r in found]
        docs: list[Document] = []
        checks: list[DocumentCheck] = []
        layers: list[int] = []
        models: dict[int, list] = {}
        env = proj.env if proj is not None else None
        for display, real, index in files:
            f = self._file(display, real)
            problems += f.res.problems
            chunks.append(f.res.chunk)
            for doc, chk, m, used in zip(f.res.docs, f.res.checks, f.res.models, f.used):
                if used is not None and env is not None:
                    ck = (id(doc), _values(env, used))
                    got = self._checks.get(ck)
                    if got is None:
                        got = self._checks[ck] = check_fleet_document(doc, env)
                    doc, chk = got
                    m = model_objects(chk.obj) if chk.obj is not None and chk.obj.valid else None
                docs.append(doc)
                checks.append(chk)
                layers.append(index)
                if m is not None:
                    models[id(doc)] = m
        if proj is not None:
            docs, checks, merged = merge(docs, checks, layers)
            problems += merged
        digest = tree_digest(chunks, prefix=self.prefix)
        checked = check_tree(problems, docs, checks, strict=self.strict, fields=self.fields)
        revision = self.revision or revision_of(self.resolved, digest, chunks, self.prefix, scope=scope)
        inv = build_inventory(checked.objects, revision, make=lambda o: models[id(o.doc)])
        res = InventoryResult(inv, checked.problems, checked.documents, len(files), digest)
        named = {n for s in inv.endpoint_slices for e in s.endpoints for n in ((e.node_name,) + (e.hint_nodes or ()))}
        return NodeView(res, node_names=frozenset(n for n in named if n))


def read_tree(root: str | Path, *, strict: bool = False, fields: str = "strict") -> FleetTree:
    """A fleet root (or plain root) on disk: fleet.yaml, then each layer as it is asked for."""
    shown = str(root)
    if not is_fleet_root(root):
        w = walk(root)
        return FleetTree(shown, w.resolved, w.prefix, fleet_root=False, head=None, lister=lambda la, p: None,
                         files=w.paths, problems=w.problems, strict=strict, fields=fields)
    resolved = Path(root).resolve(strict=True)
    return FleetTree(shown, resolved, display_prefix(shown, resolved), fleet_root=True,
                     head=read_fleet_bytes(resolved / FLEET_FILE), lister=lambda la, p: layer_files(resolved, shown, la, p),
                     files=[], strict=strict, fields=fields)


def read_git(directory: Path, rev: str, commit: str, *, strict: bool = False, fields: str = "strict") -> FleetTree:
    """The fleet root (or plain root) under `directory` as revision `rev` has it, from
    git's object store, no checkout: git.revision_files read whole, each layer picked
    from it as fleetlisting.node_files picks it."""
    from dataclasses import replace

    from reconciler.intake.fleetlisting import in_memory
    from reconciler.intake.git import revision_files
    from reconciler.intake.sources import Blob

    listed = revision_files(directory, rev, commit)
    root = listed.root

    def blobs(files) -> list:
        return [(d, Blob(d.rsplit("/", 1)[-1], raw)) for d, _oid, raw in files]

    if listed.fleet is None:
        return FleetTree(root, None, root, fleet_root=False, head=None, lister=lambda la, p: None,
                         files=blobs(listed.files), problems=tuple(listed.problems), strict=strict, fields=fields,
                         revision=commit)
    fleet = listed.fleet
    read = in_memory(listed.files, root)

    def lister(layer: ResolvedLayer, problems: list) -> list | None:
        if layer.rel not in fleet.dirs:
            if not layer.optional:
                problems.append(replace(missing_layer(root, layer), file=root + FLEET_FILE))
            return None
        found, listed_problems = read((layer.rel,))
        problems.extend(listed_problems)
        return blobs(found)

    raw = fleet.file[2]
    return FleetTree(root, None, root, fleet_root=True, head=raw if isinstance(raw, bytes) else None, lister=lister,
                     files=[], problems=tuple(listed.problems), strict=strict, fields=fields, revision=commit)
