"""`nftrec render --manifests`: a node's effective manifests, as YAML. For a fleet root,
the documents of the node's layers with its variables substituted, merged (a later
layer's object replacing an earlier one, removals applied), in merge order; for a plain
directory, its documents. Each is preceded by `# <file>:<line>`, where it was written.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TextIO

from reconciler.intake.cache import parse_file
from reconciler.logs import escape
from reconciler.intake.fleet import Identity
from reconciler.intake.fleetmerge import merge
from reconciler.intake.inventory import fleet_walk
from reconciler.intake.load import Document, walk


def effective_documents(root: str | Path, identity: Identity | None) -> list[Document]:
    """The node's documents after substitution and merge (read as read_inventory reads
    them; the caller has validated the tree)."""
    fleet = fleet_walk(root, identity)
    w = walk(root) if fleet is None else fleet.walk
    docs, checks, layers = [], [], []
    for n, res in enumerate(parse_file(*p, None if fleet is None else fleet.env) for p in w.paths):
        docs.extend(res.docs)
        checks.extend(res.checks)
        if fleet is not None:
            layers.extend([fleet.layers[n]] * len(res.docs))
    return docs if fleet is None else merge(docs, checks, layers)[0]


def write_manifests(docs: list[Document], out: TextIO) -> None:
    """The documents as one YAML stream, each after a `# file:line` comment."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    for i, doc in enumerate(docs):
        text = io.StringIO()
        yaml.dump(json.loads(json.dumps(doc.data)), text)  # plain types (YAML 1.1 booleans read as text stay text)
        out.write(("---\n" if i else "") + f"# {escape(doc.file)}:{doc.source.line}\n" + text.getvalue())
