"""Digests of the input that need no parsing: the manifest tree's content digest, the
code that reads it, and the effective node config.

- `input_digest(root)` walks the tree like `load.load_manifests` and hashes the same
  bytes in the same order (sorted display path + file bytes), so it equals
  `LoadResult.digest` for the same tree, at the cost of a read and a hash per file;
- `code_digest()` covers nftrec's version, its Python sources and the JSON Schemas: an
  upgrade (or an edited checkout) never reuses what an older nftrec computed;
- `file_key(raw, parser)` is the intake cache's key for one file: its bytes, the parser,
  and the code digest, never its path or stat;
- `config_digest(cfg, strict)` is the effective node config (after address discovery)
  and the options that change validation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from reconciler.intake import load
from reconciler.intake.model import NodeConfig
from reconciler.intake.problems import ERROR, Problem

_PACKAGE = Path(__file__).resolve().parents[1]  # reconciler/


@dataclass(frozen=True)
class InputDigest:
    digest: str  # == LoadResult.digest of the same tree
    revision: str  # == LoadResult.revision
    files: int
    problems: tuple[Problem, ...]  # from the walk (links leaving the tree, unreadable dirs)


def walk(root: str | Path) -> tuple[Path | None, list[tuple[str, Path]], list[Problem]]:
    """(resolved root or None, [(display path, real path)], walk problems), exactly as
    load_manifests walks."""
    display_root = str(root)
    problems: list[Problem] = []
    try:
        resolved = Path(root).resolve(strict=True)
    except (OSError, RuntimeError):
        problems.append(Problem(display_root, 0, 0, "", "", "", "this manifest directory does not exist (or is a "
                                "dangling link); check the path", ERROR))
        return None, [], problems
    if resolved.is_file():
        paths = [(display_root, resolved)]
    elif resolved.is_dir():
        paths = load.manifest_files(resolved, display_root, problems)
    else:
        problems.append(Problem(display_root, 0, 0, "", "", "", "this is neither a directory nor a file; point "
                                "nftrec at the manifest directory", ERROR))
        paths = []
    return resolved, paths, problems


def read_bytes(real: Path) -> bytes | None:
    """The file's bytes, or None where load.read_file would refuse it before hashing
    (unreadable, over MAX_FILE_BYTES)."""
    try:
        if real.stat().st_size > load.MAX_FILE_BYTES:
            return None
        raw = real.read_bytes()
    except OSError:
        return None
    return raw if len(raw) <= load.MAX_FILE_BYTES else None


def chunk(display: str, raw: bytes) -> bytes:
    """What load.read_file feeds the tree digest for one file."""
    return display.encode("utf-8", "surrogateescape") + b"\0" + raw + b"\0"


def revision_of(resolved: Path | None, digest: str) -> str:
    if resolved is None:
        return ""
    base = resolved if resolved.is_dir() else resolved.parent
    return load.find_revision(base) or f"sha256:{digest}"


def input_digest(root: str | Path) -> InputDigest:
    """The content digest (and revision) of the manifest tree, without parsing."""
    resolved, paths, problems = walk(root)
    hasher = hashlib.sha256()
    for display, real in paths:
        raw = read_bytes(real)
        if raw is not None:
            hasher.update(chunk(display, raw))
    digest = hasher.hexdigest()
    return InputDigest(digest, revision_of(resolved, digest), len(paths), tuple(problems))


@lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over nftrec's version, every module of the package and the JSON Schemas."""
    from reconciler import __version__
    from reconciler.intake.schema_files import schema_dir

    h = hashlib.sha256(f"nftrec {__version__}\0".encode())
    files = sorted(_PACKAGE.rglob("*.py"))
    try:
        files += sorted(schema_dir().glob("*.json"))
    except FileNotFoundError:
        pass
    for f in files:
        try:
            data = f.read_bytes()
        except OSError:
            data = b"<unreadable>"
        h.update(f"{f.name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def file_key(raw: bytes, parser: str) -> str:
    """The intake cache key of one file: its bytes, the parser ("json" or "yaml": the
    file name's suffix picks it) and the code digest. Never the path or the stat, so a
    file edited in place with its size and mtime kept still gets a new key, and the same
    bytes under a new git-sync worktree path reuse the old entry."""
    h = hashlib.sha256(f"nftrec-intake\0{code_digest()}\0{parser}\0".encode())
    h.update(raw)
    return h.hexdigest()


def config_digest(cfg: NodeConfig, *, strict: bool) -> str:
    """The effective node config (discovered node IPs and the default node name included:
    pass the config load_node_config returned with discovery), the options that change
    what is valid (--strict), and the code digest."""
    doc = asdict(cfg)
    doc.pop("source", None)
    doc["strict"] = bool(strict)
    doc["code"] = code_digest()
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
