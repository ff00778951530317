"""OCI artifacts (Flux's format) as a manifest source: `resolve` a reference to a digest,
`pull` it (every digest checked, the layer unpacked safely) into a store in the state
directory, `publish` it by an atomic symlink swap, `prune` old ones. `fetch` does all of
it for one-shot commands. The registry protocol is in registry.py, the unpacking in
unpack.py; `artifact_at` maps an unpacked tree back to its artifact (the revision shown).
"""

# Store layout, one directory per repository:
#   <state>/oci/<host>/<repo>/sha256-<hex>/        the unpacked tree (files 0644, dirs 0755)
#   <state>/oci/<host>/<repo>/sha256-<hex>.json    its metadata (written after the tree)
#   <state>/oci/<host>/<repo>/current -> sha256-<hex>   the published one
#   <state>/oci/<host>/<repo>/.tmp-*               unpacking, or an interrupted one (hidden)
# A tree counts only once its metadata exists: the metadata is written last, atomically.

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from reconciler.atomic import atomic_write, fsync_dir
from reconciler.intake.model import OciSettings
from reconciler.intake.oci_reference import OCI_PREFIX, Reference, SourceError, is_digest, is_oci, parse_reference

__all__ = ["OCI_PREFIX", "Artifact", "Reference", "Signature", "SourceError", "artifact_at", "fetch", "is_oci",
           "parse_reference", "prune", "publish", "pull", "resolve", "store_for"]

CURRENT = "current"
TMP_PREFIX = ".tmp-"
METADATA_KIND = "nftrec.oci-artifact/v1"
ANNOTATION_REVISION = "org.opencontainers.image.revision"
ANNOTATION_SOURCE = "org.opencontainers.image.source"
ANNOTATION_CREATED = "org.opencontainers.image.created"
_TREE_RE = re.compile(r"sha256-([0-9a-f]{64})")
MAX_METADATA_BYTES = 4 << 20


@dataclass(frozen=True)
class Signature:
    """One layer of cosign's `sha256-<hex>.sig` manifest."""

    payload: bytes  # the simple-signing JSON blob, its digest already checked
    signature: str  # the layer annotation dev.cosignproject.cosign/signature (base64)
    annotations: dict  # the layer's other annotations (certificate, bundle: not used)


@dataclass(frozen=True)
class Artifact:
    """A pulled, checked and unpacked artifact."""

    reference: Reference
    digest: str  # the manifest's digest, "sha256:<hex>"
    revision: str  # annotation org.opencontainers.image.revision, "" if absent
    source: str  # annotation org.opencontainers.image.source, "" if absent
    created: str  # annotation org.opencontainers.image.created (RFC 3339), "" if absent
    path: Path  # the unpacked tree in the store
    signatures: tuple[Signature, ...] = ()

    @property
    def name(self) -> str:
        """The revision nftrec shows everywhere: `REVISION@sha256:HEX`, or the digest alone."""
        return f"{self.revision}@{self.digest}" if self.revision else self.digest


def store_for(state_dir: Path, ref: Reference) -> Path:
    """The store of ref's repository: <state>/oci/<host>/<repo>. The reference grammar
    allows no `..` or empty component; `:` of a port becomes `_`, and the repository's `/`
    become `+` (one directory per repository: "a" and "a/current" never collide)."""
    host = ref.host.replace("[", "").replace("]", "").replace(":", "_")
    return Path(state_dir) / "oci" / host / ref.repository.replace("/", "+")


def tree_name(digest: str) -> str:
    return digest.replace(":", "-", 1)


def resolve(ref: Reference, settings: OciSettings) -> str:
    """The digest now behind `ref`: a pinned digest without a request, else ONE HEAD
    request on the manifest (its Docker-Content-Digest). SourceError on any failure."""
    if ref.digest:
        return ref.digest
    from reconciler.intake.registry import Registry

    with Registry(ref.host, settings) as reg:
        return reg.head_manifest(ref.repository, ref.tag or "")


def pull(ref: Reference, settings: OciSettings, store: Path, *, digest: str | None = None,
         signatures: bool = False) -> Artifact:
    """The artifact `digest` (default: ref's pinned digest, else resolved) in `store`:
    already there, its metadata is reread and nothing is downloaded; else its manifest is
    fetched (sha256 checked), checked to be Flux's format, its layer fetched (sha256 and
    size checked, bounded) and unpacked safely, then the metadata written beside it. With
    `signatures`, cosign's `sha256-<hex>.sig` manifest and layers too (digest-checked; no
    such tag: none)."""
    raise NotImplementedError


def publish(store: Path, artifact: Artifact) -> Path:
    """Point <store>/current at the artifact's tree by an atomic symlink swap (a temp link
    renamed over it); returns <store>/current, the manifest root every command reads."""
    store = Path(store)
    link = store / CURRENT
    target = Path(artifact.path).name
    if not _TREE_RE.fullmatch(target) or Path(artifact.path).parent.resolve() != store.resolve():
        raise ValueError(f"{artifact.path} is not a tree of the store {store}")
    if os.path.islink(link) and os.readlink(link) == target:
        return link
    tmp = store / f"{TMP_PREFIX}{CURRENT}-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(store)
    return link


def current_digest(store: Path) -> str | None:
    """The digest <store>/current points at, None when nothing is published."""
    try:
        m = _TREE_RE.fullmatch(os.readlink(Path(store) / CURRENT))
    except OSError:
        return None
    return f"sha256:{m.group(1)}" if m else None


def prune(store: Path, keep: int = 3, protect: frozenset[str] = frozenset()) -> None:
    """Drop all but the `keep` most recently pulled artifacts, never the current one nor
    a digest in `protect`; also interrupted unpackings (.tmp-* older than an hour)."""
    store = Path(store)
    if not store.is_dir():
        return
    current = current_digest(store)
    pulled = []
    for entry in store.iterdir():
        m = _TREE_RE.fullmatch(entry.name)
        if m and entry.is_dir() and not entry.is_symlink():
            meta = entry.with_name(entry.name + ".json")
            try:
                when = meta.stat().st_mtime
            except OSError:
                when = 0.0  # a tree without metadata: never finished, goes first
            pulled.append((when, f"sha256:{m.group(1)}", entry))
        elif entry.name.startswith(TMP_PREFIX) and not entry.name.startswith(f"{TMP_PREFIX}{CURRENT}"):
            try:
                if time.time() - entry.lstat().st_mtime > 3600:
                    _remove(entry)
            except OSError:
                pass
    pulled.sort(reverse=True)
    kept = 0
    for _, digest, tree in pulled:
        if digest == current or digest in protect:
            continue
        if kept < keep and tree.with_name(tree.name + ".json").exists():
            kept += 1
            continue
        _remove(tree.with_name(tree.name + ".json"))  # metadata first: the tree no longer counts
        _remove(tree)


def artifact_at(path: Path) -> Artifact | None:
    """The artifact whose unpacked tree holds `path` (links resolved), from its metadata;
    None when `path` is in no artifact tree of an OCI store."""
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError):
        return None
    for tree in (resolved, *resolved.parents):
        if _TREE_RE.fullmatch(tree.name):
            meta = read_metadata(tree.with_name(tree.name + ".json"))
            if meta is not None:
                return _artifact(meta, tree)
    return None


def fetch(source: str, settings: OciSettings, state_dir: Path, *, signatures: bool = False) -> Path:
    """One-shot commands: parse `source`, resolve it, pull, publish, prune; returns the
    manifest root (<store>/current)."""
    ref = parse_reference(source)
    store = store_for(state_dir, ref)
    artifact = pull(ref, settings, store, signatures=signatures)
    root = publish(store, artifact)
    prune(store)
    return root


# --- metadata --------------------------------------------------------------------------------


def write_metadata(tree: Path, ref: Reference, digest: str, annotations: dict, signatures: tuple[Signature, ...]) -> None:
    """The metadata beside `tree`, written atomically (the tree counts from then on)."""
    import base64

    doc = {
        "kind": METADATA_KIND,
        "reference": str(ref),
        "digest": digest,
        "annotations": {str(k): str(v) for k, v in annotations.items()},
        "signatures": [{"payload": base64.b64encode(s.payload).decode(), "signature": s.signature,
                        "annotations": s.annotations} for s in signatures],
        "pulled": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write(tree.with_name(tree.name + ".json"), json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")


def read_metadata(meta: Path) -> dict | None:
    """The metadata document, None when it is missing or not ours."""
    try:
        with open(meta, "rb") as f:
            raw = f.read(MAX_METADATA_BYTES + 1)
        doc = json.loads(raw)
    except (OSError, ValueError):
        return None
    if (len(raw) > MAX_METADATA_BYTES or not isinstance(doc, dict) or doc.get("kind") != METADATA_KIND
            or not isinstance(doc.get("digest"), str) or not is_digest(doc["digest"])
            or meta.name != tree_name(doc["digest"]) + ".json"
            or not isinstance(doc.get("annotations"), dict) or not isinstance(doc.get("signatures"), list)):
        return None
    return doc


def _artifact(meta: dict, tree: Path) -> Artifact | None:
    import base64
    import binascii

    try:
        ref = parse_reference(str(meta.get("reference", "")))
        sigs = tuple(Signature(base64.b64decode(s["payload"], validate=True), str(s["signature"]), dict(s["annotations"]))
                     for s in meta["signatures"])
    except (SourceError, KeyError, TypeError, ValueError, binascii.Error):
        return None
    ann = meta["annotations"]
    return Artifact(ref, meta["digest"], str(ann.get(ANNOTATION_REVISION, "")), str(ann.get(ANNOTATION_SOURCE, "")),
                    str(ann.get(ANNOTATION_CREATED, "")), tree, sigs)


def _remove(path: Path) -> None:
    """Remove a file, link or tree; already gone is fine."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
