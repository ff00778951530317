"""Digests of the input that need no parsing, for the no-op check of `plan` and `apply`:
the manifest tree's (`input_digest`, equal to the digest a read of the tree computes) and
the effective node config's (`config_digest`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.intake.git import revision_of
from reconciler.intake.load import chunk, is_fleet_root, read_bytes, tree_digest, walk
from reconciler.intake.model import NodeConfig
from reconciler.intake.problems import ERROR, Problem

if TYPE_CHECKING:
    from reconciler.intake.fleet import Identity, Projection

# A plain root's check imports nothing of the fleet modules (their import shows in a no-op's time).
from reconciler.intake.store import code_digest


@dataclass(frozen=True)
class InputDigest:
    digest: str  # == LoadResult.digest of the same tree
    revision: str  # == LoadResult.revision
    files: int
    problems: tuple[Problem, ...]  # from the walk (links leaving the tree, unreadable dirs)


def input_digest(root: str | Path, recorded: tuple[str | None, str | None] = (None, None),
                 identity: Identity | None = None) -> InputDigest:
    """The content digest (and revision) of the manifest tree, without parsing. A file
    that a read refuses unread (unreadable, too big) adds nothing, as in a read.
    `recorded`: the last apply's (digest, revision), for git.revision_of. A fleet root:
    fleet.yaml and `identity`'s layers, as a read of them digests them."""
    fleet = None
    if is_fleet_root(root):
        from reconciler.intake.fleetread import walk_fleet

        try:
            resolved = Path(root).resolve(strict=True)
        except (OSError, RuntimeError):
            resolved = None
        fleet = None if resolved is None else walk_fleet(resolved, str(root), identity, projector=_layers)
        if fleet is None or fleet.projection is None or fleet.walk.problems:
            return InputDigest("", "", 0, (Problem(str(root), 0, 0, "", "", "", "a fleet root this check cannot "
                                                   "project: read it whole", ERROR),))
    w = walk(root) if fleet is None else fleet.walk
    raws = ((display, read_bytes(real)) for display, real in w.paths)
    chunks = [chunk(display, raw) for display, raw in raws if raw is not None]
    if fleet is not None:
        chunks.insert(0, fleet.head)
    digest = tree_digest(chunks, prefix=w.prefix)
    return InputDigest(digest, revision_of(w.resolved, digest, chunks, w.prefix, recorded=recorded, scope=w.scope),
                       len(w.paths), w.problems)


def _layers(display_root: str, raw: bytes | None, identity: Identity | None) -> tuple[Projection | None, list]:
    """fleetread.project_fleet without the schema (the no-op check imports none): the
    layers of a fleet.yaml of the plain shape the schema asks for, projected; None for
    anything else. A digest equal to the last apply's means fleet.yaml is the bytes that
    were valid then; any other reading gives another digest, and a full read."""
    from ruamel.yaml.error import YAMLError

    from reconciler.intake.fleet import FLEET_FILE, Fleet, Layer, node_layers
    from reconciler.intake.parse import Refused, decode_text, parse_yaml

    if raw is None or identity is None:
        return None, []
    try:
        docs = [d for d in parse_yaml(decode_text(raw)) if d[0] is not None]
        data = docs[0][0] if len(docs) == 1 else None
        layers = tuple(Layer(x["path"], _selector(x.get("selector")), x.get("optional", False) is True, 0)
                       for x in data["layers"])
        variables = data.get("variables") or {}
        if not all(type(k) is str and type(v) is str for k, v in variables.items()) or \
                any(type(x.path) is not str for x in layers):
            return None, []
        projection = node_layers(Fleet(FLEET_FILE, layers, tuple(sorted(variables.items()))), identity)
    except (Refused, YAMLError, RecursionError, LookupError, TypeError, AttributeError, ValueError):
        return None, []
    return (projection, []) if projection.ok else (None, [])


def _selector(spec) -> Selector | None:
    from reconciler.intake.fleet import Requirement, Selector

    if spec is None:
        return None
    labels = spec.get("matchLabels") or {}
    exprs = tuple(Requirement(e["key"], e["operator"], tuple(e.get("values") or ()))
                  for e in spec.get("matchExpressions") or ())
    if not all(type(k) is str and type(v) is str for k, v in labels.items()) or \
            set(spec) - {"matchLabels", "matchExpressions"}:
        raise ValueError("not a plain selector")
    return Selector(tuple(sorted(labels.items())), exprs)


def config_digest(cfg: NodeConfig, *, strict: bool) -> str:
    """The effective node config (discovered node IPs and the default node name included:
    pass the config load_node_config returned with discovery), the options that change
    what is valid (--strict), and the code digest."""
    doc = asdict(cfg)
    doc.pop("source", None)
    doc.pop("oci", None)  # how sources are fetched changes nothing in what they compile to
    doc["strict"] = bool(strict)
    doc["code"] = code_digest()
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
