"""Digests of the input that need no parsing, for the no-op check of `plan` and `apply`:
the manifest tree's (`input_digest`, equal to the digest a read of the tree computes) and
the effective node config's (`config_digest`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from reconciler.intake.git import revision_of
from reconciler.intake.load import chunk, read_bytes, tree_digest, walk
from reconciler.intake.model import NodeConfig
from reconciler.intake.problems import Problem
from reconciler.intake.store import code_digest


@dataclass(frozen=True)
class InputDigest:
    digest: str  # == LoadResult.digest of the same tree
    revision: str  # == LoadResult.revision
    files: int
    problems: tuple[Problem, ...]  # from the walk (links leaving the tree, unreadable dirs)


def input_digest(root: str | Path, recorded: tuple[str | None, str | None] = (None, None)) -> InputDigest:
    """The content digest (and revision) of the manifest tree, without parsing. A file
    that a read refuses unread (unreadable, too big) adds nothing, as in a read.
    `recorded`: the last apply's (digest, revision), for git.revision_of."""
    w = walk(root)
    raws = ((display, read_bytes(real)) for display, real in w.paths)
    chunks = [chunk(display, raw) for display, raw in raws if raw is not None]
    digest = tree_digest(chunks, prefix=w.prefix)
    return InputDigest(digest, revision_of(w.resolved, digest, chunks, w.prefix, recorded=recorded), len(w.paths), w.problems)


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
