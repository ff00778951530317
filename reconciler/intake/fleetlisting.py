"""A fleet root held as a listing rather than a directory on disk: a git commit (verified,
or a `diff --git` revision) or a tar archive on standard input. fleet.yaml's bytes are
projected for the node (intake/fleetread.py), its layers picked from the listing's
directories (a missing one is an error unless optional, as on disk), and only the files
below them, tagged with their layer's index, are read: `node_files` gives them to a reader.

Pipeline position: listing -> **the node's files** -> read each -> fleetmerge.merge ->
check_tree (intake/inventory.py's assemble, with a fleetread.FleetWalk).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from reconciler.intake.fleet import FLEET_FILE, Identity, Projection, project
from reconciler.intake.fleetread import FleetWalk, missing_layer, needs_identity
from reconciler.intake.gitobjects import ManifestFiles, ObjectError, layer_files
from reconciler.intake.load import Walk, chunk
from reconciler.intake.problems import ERROR, Problem


@dataclass(frozen=True)
class NodeFiles:
    """What one node reads of a listed fleet root: (display, object id or "", bytes, a
    size over the limit, or None for a blob the caller holds) in layer order, each file's
    layer index, the projection (None when fleet.yaml cannot be projected), fleet.yaml's
    chunk (the first of the tree digest) and the problems of fleet.yaml and the layers."""

    files: tuple
    layers: tuple[int, ...]
    projection: Projection | None
    head: bytes
    problems: tuple[Problem, ...]


def node_files(root: str, fleet_raw: bytes | int | None, dirs: frozenset, identity: Identity | None,
               read: Callable[[tuple[str, ...]], tuple[tuple, tuple]]) -> NodeFiles:
    """The files `identity` reads of the fleet root whose display paths are `root` + the
    path below it (`dir/`, `<stdin>/`, `HEAD:sub/`): fleet.yaml's bytes (`fleet_raw`; its
    size when over the limit) projected, the layers found in `dirs` (every directory of
    the root, relative), then `read(layer paths)` -> (files, problems) of exactly those
    directories, each file (display, oid, raw) below one of them."""
    shown = root + FLEET_FILE
    if not isinstance(fleet_raw, bytes):
        return NodeFiles((), (), None, b"", (Problem(shown, 0, 0, "", "", "", "this file is over the size limit; "
                                                     "a fleet.yaml is small: check what was committed", ERROR),))
    head = chunk(shown, fleet_raw)
    if identity is None:
        return NodeFiles((), (), None, head, (needs_identity(root.rstrip("/") or root),))
    projection = project(shown, fleet_raw, identity)
    problems = list(projection.problems)
    if not projection.ok:
        return NodeFiles((), (), projection, head, tuple(problems))
    present = []
    for layer in projection.layers:
        if layer.rel in dirs:
            present.append(layer)
        elif not layer.optional:
            problems.append(replace(missing_layer(root, layer), file=shown))
    if any(p.is_error for p in problems):
        return NodeFiles((), (), projection, head, tuple(problems))
    found, listed = read(tuple(layer.rel for layer in present))
    problems.extend(listed)
    files, layers = [], []
    for layer in present:
        below = root + layer.rel + "/"
        for f in found:
            if f[0].startswith(below):
                files.append(f)
                layers.append(layer.index)
    return NodeFiles(tuple(files), tuple(layers), projection, head, tuple(problems))


def in_memory(files: Sequence[tuple], root: str) -> Callable[[tuple[str, ...]], tuple[tuple, tuple]]:
    """A `read` for node_files over files already in memory, (display, oid, raw) each."""
    return lambda rels: (tuple(f for f in files if f[0].startswith(tuple(root + rel + "/" for rel in rels))), ())


def listed_node(files: ManifestFiles, identity: Identity | None) -> NodeFiles:
    """node_files of a listed fleet root (files.fleet): a verified commit's, whose layers'
    blobs are read now from the object store, by the ids of the commit's trees (the
    caller's held blobs come as None); or one whose files are all in memory (a revision
    read whole, an archive)."""
    fleet = files.fleet
    if fleet.common is None:
        return node_files(files.root, fleet.file[2], fleet.dirs, identity, in_memory(files.files, files.root))

    def read(rels: tuple[str, ...]) -> tuple[tuple, tuple]:
        try:
            listed = layer_files(files, rels)
        except ObjectError as e:
            return (), (Problem(files.root, 0, 0, "", "", "", f"cannot read revision {files.revision[:12]}: {e}",
                                ERROR),)
        return listed.files, listed.problems

    return node_files(files.root, fleet.file[2], fleet.dirs, identity, read)


def fleet_walk(node: NodeFiles, root: str, paths: list) -> FleetWalk:
    """The fleetread.FleetWalk that inventory.assemble takes for a listed node's files
    (`paths`: (display, load.read_file's file) of node.files, in order)."""
    return FleetWalk(Walk(None, paths, node.problems, root), node.projection, node.head, node.layers)
