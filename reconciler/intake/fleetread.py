"""A fleet root read for one node: fleet.yaml's bytes projected (fleet.project), then the
files of the node's layers, in layer order, and nothing else. `walk_fleet` lists them on
disk (load.manifest_files per layer; a link may point anywhere inside the fleet root);
a commit's or an archive's listing is intake/fleetlisting.py's.

Pipeline position: walk -> **the node's files** -> read each (intake/cache.py with the
node's Env) -> fleetmerge.merge -> check_tree (intake/inventory.py's assemble).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reconciler.intake.fleet import FLEET_FILE, Identity, Projection, ResolvedLayer, project
from reconciler.intake.load import Walk, chunk, display_prefix, manifest_files, read_fleet_bytes
from reconciler.intake.problems import ERROR, Problem


@dataclass(frozen=True)
class FleetWalk:
    """What a read of a fleet root for one node lists: the walk of the node's files (in
    layer order; `walk.problems` holds fleet.yaml's and the layers'), the projection,
    fleet.yaml's chunk (the first of the tree digest) and each file's layer index."""

    walk: Walk
    projection: Projection | None
    head: bytes
    layers: tuple[int, ...]

    @property
    def env(self):
        return None if self.projection is None else self.projection.env


def identity_of(config) -> Identity:
    """The node config's identity (model.NodeConfig's nodeName and nodeLabels)."""
    return Identity(config.node_name, tuple(config.node_labels))


def needs_identity(shown: str) -> Problem:
    return Problem(shown, 0, 0, "", "", "", f"this directory is a fleet repository ({FLEET_FILE}): nftrec needs to know "
                   "which node this is: set nodeName and nodeLabels in the node config, or pass --node/--labels "
                   "(render, validate), or validate every node with --fleet INVENTORY", ERROR)


def fleet_display(display_root: str) -> str:
    return os.path.join(display_root, FLEET_FILE)


def unreadable_fleet(display_root: str) -> Problem:
    """fleet.yaml could not be read (read_fleet_bytes gave None): an error of the revision."""
    return Problem(fleet_display(display_root), 0, 0, "", "", "", "cannot read this file: it is not a regular file "
                   "(a symlink, a directory), is unreadable, or is over the size limit; commit the file itself, "
                   "readable", ERROR)


def project_fleet(display_root: str, raw: bytes | None, identity: Identity | None) -> tuple[Projection | None, list[Problem]]:
    """fleet.yaml's bytes projected for `identity`; (None, the problem) when it cannot be."""
    shown = fleet_display(display_root)
    if raw is None:
        return None, [unreadable_fleet(display_root)]
    if identity is None:
        return None, [needs_identity(display_root)]
    p = project(shown, raw, identity)
    return p, list(p.problems)


def missing_layer(display_root: str, layer: ResolvedLayer, why: str = "does not exist") -> Problem:
    return Problem(fleet_display(display_root), layer.line, 0, "Fleet", "", "layers",
                   f"layer {layer.rel} {why} in this revision; create it or mark the layer `optional: true`", ERROR)


def walk_fleet(resolved: Path, display_root: str, identity: Identity | None, raw: bytes | None = None,
               projector: Callable = project_fleet) -> FleetWalk:
    """The node's files of the fleet root `resolved` (links resolved), fleet.yaml read
    unless its bytes are given (`raw`); `projector`: project_fleet or a stand-in with its
    signature (the no-op check's, which loads no schema)."""
    if raw is None:
        raw = read_fleet_bytes(resolved / FLEET_FILE)
    projection, problems = projector(display_root, raw, identity)
    head = chunk(fleet_display(display_root), raw) if raw is not None else b""
    paths, layers, scope = [], [], [fleet_display(display_root)]
    if projection is not None and projection.ok:
        for layer in projection.layers:
            found = layer_files(resolved, display_root, layer, problems)
            if found is None:
                continue
            scope.append(os.path.join(display_root, layer.rel, ""))
            paths.extend(found)
            layers.extend([layer.index] * len(found))
    w = Walk(resolved, paths, tuple(problems), display_prefix(display_root, resolved), tuple(scope))
    return FleetWalk(w, projection, head, tuple(layers))


def layer_files(resolved: Path, display_root: str, layer: ResolvedLayer, problems: list[Problem]
                ) -> list[tuple[str, Path]] | None:
    """One layer's files (load.manifest_files, links kept inside the fleet root); None
    when the directory is not there (a problem unless the layer is optional)."""
    try:
        where = (resolved / layer.rel).resolve(strict=True)
    except (OSError, RuntimeError):
        where = None
    if where is None or not where.is_dir():
        if not layer.optional:
            problems.append(missing_layer(display_root, layer, "does not exist" if where is None else "is not a directory"))
        return None
    if not where.is_relative_to(resolved):
        problems.append(missing_layer(display_root, layer, "is a link leading out of the fleet root"))
        return None
    return manifest_files(where, os.path.join(display_root, layer.rel), problems, inside=resolved)
