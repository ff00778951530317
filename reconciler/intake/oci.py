"""OCI artifacts (Flux's format) as a manifest source: `resolve` a reference to a digest,
`pull` it (every digest checked, the signatures before the layer, the layer unpacked
safely) into a store in the state directory, `publish` it by an atomic symlink swap
(`nftrec watch` only), `prune` old ones, each under the store's lock. The registry protocol
is in registry.py, the unpacking in unpack.py; `source_artifact` maps an unpacked tree of
a store this process opened back to its artifact (the revision shown).
"""

# Store layout, one directory per repository:
#   <state>/oci/<host>/<repo>/sha256-<hex>/        the unpacked tree (files 0644, dirs 0755)
#   <state>/oci/<host>/<repo>/sha256-<hex>/.nftrec-artifact.json   its metadata (hidden:
#                                                  never read as a manifest)
#   <state>/oci/<host>/<repo>/current -> sha256-<hex>   the published one
#   <state>/oci/<host>/<repo>/.lock                flock(2): pull, publish and prune
#   <state>/oci/<host>/<repo>/.tmp-*               unpacking, or an interrupted one (hidden)
# The metadata is written inside the unpacked tree before the tree is renamed into place:
# no tree is ever visible without it. Stores written before kept it beside the tree
# (`sha256-<hex>.json`), which is still read.

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from reconciler.atomic import atomic_write, fsync_dir
from reconciler.intake.model import OciSettings
from reconciler.intake.oci_reference import (OCI_PREFIX, SOURCE_ERROR_REASONS, Reference, SourceError, is_digest, is_oci,
                                             parse_reference)
from reconciler.intake.unpack import TMP_PREFIX, unpack

__all__ = ["OCI_PREFIX", "SOURCE_ERROR_REASONS", "Artifact", "Reference", "Signature", "SourceError", "artifact_at",
           "close_registries", "current_digest", "is_oci", "named_digest", "open_store", "parse_reference", "prune", "publish",
           "pull", "resolve", "source_artifact", "store_for"]

CURRENT = "current"
METADATA = ".nftrec-artifact.json"  # inside the tree
LOCK = ".lock"
METADATA_KIND = "nftrec.oci-artifact/v1"
ANNOTATION_REVISION = "org.opencontainers.image.revision"
ANNOTATION_SOURCE = "org.opencontainers.image.source"
ANNOTATION_CREATED = "org.opencontainers.image.created"
_TREE_RE = re.compile(r"sha256-([0-9a-f]{64})")
MAX_METADATA_BYTES = 4 << 20
MAX_LAYER_BYTES = 256 << 20  # the compressed layer; unpacked, unpack.MAX_BYTES
MAX_SIGNATURE_BYTES = 1 << 20  # one simple-signing payload
MAX_SIGNATURES = 64
FLUX_CONFIG = "application/vnd.cncf.flux.config.v1+json"
FLUX_LAYER = "application/vnd.cncf.flux.content.v1.tar+gzip"
COSIGN_SIGNATURE = "dev.cosignproject.cosign/signature"


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


def named_digest(name: str | None) -> str | None:
    """The artifact digest a revision name ends with (Artifact.name: `REVISION@sha256:HEX`,
    or the digest alone), else None (a git commit, nothing)."""
    digest = (name or "").rpartition("@")[2]
    return digest if is_digest(digest) else None


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
    return registry_for(ref.host, settings).head_manifest(ref.repository, ref.tag or "")


def pull(ref: Reference, settings: OciSettings, store: Path, *, digest: str | None = None,
         signatures: bool = False, check: Callable[[Artifact], None] | None = None,
         publish: bool = False) -> Artifact:
    """The artifact `digest` (default: ref's pinned digest, else resolved) in `store`,
    under the store's lock: already there, its metadata is reread and nothing is
    downloaded; else its manifest is fetched (sha256 checked) and checked to be Flux's
    format. With `signatures`, cosign's `sha256-<hex>.sig` manifest and layers (digest-
    checked; no such tag: none), looked up at every call: a signature may come after the
    push. `check` is then called with the artifact before its layer is fetched: what it
    raises stops the pull, nothing downloaded or unpacked. Then the layer is fetched (sha256
    and size checked, bounded) and unpacked safely (at most oci.maxSize bytes) with its
    metadata inside. `publish`: made `current` before the lock is released."""
    store = Path(store)
    digest = digest or ref.digest or resolve(ref, settings)
    if not is_digest(digest):
        raise SourceError("bad-reference", f"{digest[:100]!r} is not a digest; give sha256: and 64 lower-case hex digits")
    open_store(store)
    with _locked(store):
        artifact = _pull(ref, settings, store, digest, signatures, check)
        if publish:
            _publish(store, artifact)
    return artifact


def _pull(ref: Reference, settings: OciSettings, store: Path, digest: str, signatures: bool,
          check: Callable[[Artifact], None] | None) -> Artifact:
    tree = store / tree_name(digest)
    meta = read_metadata(tree) if tree.is_dir() else None
    artifact = _artifact(meta, tree) if meta is not None else None
    reg = registry_for(ref.host, settings)
    if artifact is not None:
        if signatures:  # cosign may have signed (again) since: its tag is read anew, never the layer
            sigs = fetch_signatures(reg, ref, digest)
            if sigs != artifact.signatures or not meta.get("signaturesFetched"):
                write_metadata(tree, artifact.reference, digest, meta["annotations"], sigs, signatures_fetched=True)
            artifact = dataclasses.replace(artifact, signatures=sigs)
        if check is not None:
            check(artifact)
        return artifact
    raw, media_type = reg.get_manifest(ref.repository, digest, digest)
    layer, annotations = flux_layer(raw, media_type, f"{ref.at(digest)}")
    sigs = fetch_signatures(reg, ref, digest) if signatures else ()
    artifact = Artifact(ref.at(digest), digest, annotations.get(ANNOTATION_REVISION, ""),
                        annotations.get(ANNOTATION_SOURCE, ""), annotations.get(ANNOTATION_CREATED, ""), tree, sigs)
    if check is not None:
        check(artifact)  # before a byte of the layer
    if tree.exists():
        _discard(store, tree)  # a tree without its metadata never counted (a pull that died): unpacked anew
    tmp = store / f"{TMP_PREFIX}{os.getpid()}-{time.monotonic_ns()}.layer"
    try:
        reg.get_blob(ref.repository, layer["digest"], layer["size"], tmp, MAX_LAYER_BYTES)
        unpack(tmp, store, tree.name, what=f"the layer of {ref.at(digest)}", max_bytes=settings.max_size,
               files={METADATA: metadata(ref.at(digest), digest, annotations, sigs, signatures)})
    finally:
        _remove(tmp)
    return artifact


def publish(store: Path, artifact: Artifact) -> Path:
    """Point <store>/current at the artifact's tree by an atomic symlink swap (a temp link
    renamed over it), under the store's lock; returns <store>/current, the manifest root
    every command reads."""
    with _locked(Path(store)):
        return _publish(Path(store), artifact)


def _publish(store: Path, artifact: Artifact) -> Path:
    link = store / CURRENT
    target = Path(artifact.path).name
    if not _TREE_RE.fullmatch(target) or Path(artifact.path).parent.resolve() != store.resolve():
        raise ValueError(f"{artifact.path} is not a tree of the store {store}")
    if not Path(artifact.path).is_dir():
        raise SourceError("bad-artifact", f"the tree of {artifact.name} is no longer in {store}: not published")
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
    a digest in `protect`, under the store's lock; also interrupted unpackings (.tmp-*
    older than an hour)."""
    store = Path(store)
    if not store.is_dir():
        return
    with _locked(store):
        current = current_digest(store)
        pulled = []
        for entry in store.iterdir():
            m = _TREE_RE.fullmatch(entry.name)
            if m and entry.is_dir() and not entry.is_symlink():
                meta = _metadata_file(entry)
                try:
                    when = meta.stat().st_mtime if meta is not None else 0.0
                except OSError:
                    when = 0.0
                pulled.append((when, f"sha256:{m.group(1)}", entry, meta is not None))
            elif entry.name.startswith(TMP_PREFIX):  # an unpacking, a download or a link swap that died
                try:
                    if time.time() - entry.lstat().st_mtime > 3600:
                        _remove(entry)
                except OSError:
                    pass
        pulled.sort(reverse=True)
        kept = 0
        for _, digest, tree, complete in pulled:
            if digest == current or digest in protect:
                continue
            if kept < keep and complete:
                kept += 1
                continue
            _remove(tree.with_name(tree.name + ".json"))  # a store's older layout: metadata first
            _discard(store, tree)


@contextmanager
def _locked(store: Path) -> Iterator[None]:
    """flock(2) on <store>/.lock, held by one pull, publish or prune at a time, in this
    process or another (a one-shot command's prune and watch's fetcher)."""
    fd = os.open(store / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_stores: set[Path] = set()  # the stores this process opened as an OCI source


def open_store(store: Path) -> Path:
    """Create `store` and count it as an OCI source's for this process: only trees of such
    a store are named after an artifact (source_artifact)."""
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    _stores.add(store.resolve())
    return store


def source_artifact(path: Path) -> Artifact | None:
    """artifact_at(path) when its tree lies in a store this process opened (open_store),
    else None: a directory argument is never named after an artifact found on the disk."""
    artifact = artifact_at(path)
    if artifact is None or Path(artifact.path).parent.resolve() not in _stores:
        return None
    return artifact


def artifact_at(path: Path) -> Artifact | None:
    """The artifact whose unpacked tree holds `path` (links resolved), from its metadata;
    None when `path` is in no artifact tree of an OCI store."""
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError):
        return None
    for tree in (resolved, *resolved.parents):
        if _TREE_RE.fullmatch(tree.name):
            meta = read_metadata(tree)
            if meta is not None:
                return _artifact(meta, tree)
    return None


# --- the registry's side --------------------------------------------------------------------

_registries: dict = {}
_registries_lock = threading.Lock()


def registry_for(host: str, settings: OciSettings):
    """The Registry client of `host` with these settings, kept for the process: a watched
    tag's resolve reuses its connection and the auth it negotiated (one HEAD, no new
    handshake or challenge)."""
    from reconciler.intake.registry import Registry

    with _registries_lock:
        reg = _registries.get((host, settings))
        if reg is None:
            reg = _registries[(host, settings)] = Registry(host, settings)
        return reg


def close_registries() -> None:
    """Close every kept client (tests; a process that is done with the source)."""
    with _registries_lock:
        for reg in _registries.values():
            reg.close()
        _registries.clear()


def flux_layer(raw: bytes, media_type: str, shown: str) -> tuple[dict, dict]:
    """(the layer descriptor, the annotations) of a manifest that must be Flux's format:
    an OCI image manifest, config application/vnd.cncf.flux.config.v1+json, exactly one
    layer application/vnd.cncf.flux.content.v1.tar+gzip. SourceError bad-artifact else."""
    from reconciler.intake.registry import DOCKER_LIST, OCI_INDEX, OCI_MANIFEST

    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise SourceError("bad-artifact", f"{shown}: the manifest is not a JSON object")
    kind = doc.get("mediaType") or media_type
    if kind in (OCI_INDEX, DOCKER_LIST) or "manifests" in doc:
        raise SourceError("bad-artifact", f"{shown} is an image index (a list of manifests, e.g. per platform), "
                                          f"not a Flux artifact; push the manifests with flux push artifact")
    if kind != OCI_MANIFEST or doc.get("schemaVersion") != 2:
        raise SourceError("bad-artifact", f"not a Flux artifact: {shown} is a {str(kind)[:100]!r} manifest, "
                                          f"not an OCI image manifest (schemaVersion 2)")
    config = doc.get("config")
    if not isinstance(config, dict) or config.get("mediaType") != FLUX_CONFIG:
        got = config.get("mediaType") if isinstance(config, dict) else None
        raise SourceError("bad-artifact", f"not a Flux artifact: {shown} has the config media type {str(got)[:100]!r}, "
                                          f"not {FLUX_CONFIG} (push it with flux push artifact)")
    layers = doc.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        count = len(layers) if isinstance(layers, list) else 0
        raise SourceError("bad-artifact", f"not a Flux artifact: {shown} has {count} layers, not exactly one")
    layer = layers[0]
    if layer.get("mediaType") != FLUX_LAYER:
        raise SourceError("bad-artifact", f"not a Flux artifact: {shown}'s layer is {str(layer.get('mediaType'))[:100]!r}, "
                                          f"not {FLUX_LAYER}")
    size = layer.get("size")
    if not isinstance(layer.get("digest"), str) or not is_digest(layer["digest"]) or type(size) is not int or size < 0:
        raise SourceError("bad-artifact", f"{shown}: the layer's descriptor has no sha256 digest or size")
    annotations = doc.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise SourceError("bad-artifact", f"{shown}: the manifest's annotations are not a mapping")
    return layer, {str(k)[:256]: str(v)[:4096] for k, v in annotations.items()}


def fetch_signatures(reg, ref: Reference, digest: str) -> tuple[Signature, ...]:
    """cosign's signatures of `digest`: the layers of the `sha256-<hex>.sig` tag's manifest
    that carry dev.cosignproject.cosign/signature, each payload's digest and size checked.
    No such tag: ()."""
    from reconciler.intake.registry import DOCKER_MANIFEST, OCI_MANIFEST

    tag = tree_name(digest) + ".sig"
    shown = f"{OCI_PREFIX}{ref.host}/{ref.repository}:{tag}"
    try:
        raw, media_type = reg.get_manifest(ref.repository, tag)
    except SourceError as e:
        if e.reason == "not-found":
            return ()
        raise
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or (doc.get("mediaType") or media_type) not in (OCI_MANIFEST, DOCKER_MANIFEST):
        raise SourceError("bad-artifact", f"{shown} is not a cosign signature manifest")
    out = []
    for layer in doc.get("layers") or ():
        ann = layer.get("annotations") if isinstance(layer, dict) else None
        if not isinstance(ann, dict) or not isinstance(ann.get(COSIGN_SIGNATURE), str):
            continue
        size = layer.get("size")
        if not isinstance(layer.get("digest"), str) or not is_digest(layer["digest"]) or type(size) is not int or size < 0:
            raise SourceError("bad-artifact", f"{shown}: a signature layer has no sha256 digest or size")
        payload = reg.get_small_blob(ref.repository, layer["digest"], size, MAX_SIGNATURE_BYTES)
        others = {str(k): str(v) for k, v in ann.items() if k != COSIGN_SIGNATURE}
        out.append(Signature(payload, ann[COSIGN_SIGNATURE], others))
        if len(out) >= MAX_SIGNATURES:
            break
    return tuple(out)


# --- metadata --------------------------------------------------------------------------------


def metadata(ref: Reference, digest: str, annotations: dict, signatures: tuple[Signature, ...],
             signatures_fetched: bool) -> bytes:
    """The metadata document of an artifact's tree (its file: METADATA inside the tree)."""
    import base64

    doc = {
        "kind": METADATA_KIND,
        "reference": str(ref),
        "digest": digest,
        "annotations": {str(k): str(v) for k, v in annotations.items()},
        "signatures": [{"payload": base64.b64encode(s.payload).decode(), "signature": s.signature,
                        "annotations": s.annotations} for s in signatures],
        "signaturesFetched": bool(signatures_fetched),
        "pulled": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def write_metadata(tree: Path, ref: Reference, digest: str, annotations: dict, signatures: tuple[Signature, ...],
                   *, signatures_fetched: bool = False) -> None:
    """Rewrite the metadata inside an unpacked `tree`, atomically (new signatures)."""
    atomic_write(tree / METADATA, metadata(ref, digest, annotations, signatures, signatures_fetched))


def _metadata_file(tree: Path) -> Path | None:
    """The metadata file of `tree`: inside it, else beside it (a store's older layout)."""
    for meta in (tree / METADATA, tree.with_name(tree.name + ".json")):
        if os.path.isfile(meta) and not os.path.islink(meta):
            return meta
    return None


def read_metadata(tree: Path) -> dict | None:
    """The metadata document of the unpacked `tree`, None when it is missing or not ours
    (its digest must be the one the tree is named after)."""
    meta = _metadata_file(tree)
    if meta is None:
        return None
    try:
        with open(meta, "rb") as f:
            raw = f.read(MAX_METADATA_BYTES + 1)
        doc = json.loads(raw)
    except (OSError, ValueError):
        return None
    if (len(raw) > MAX_METADATA_BYTES or not isinstance(doc, dict) or doc.get("kind") != METADATA_KIND
            or not isinstance(doc.get("digest"), str) or not is_digest(doc["digest"])
            or tree.name != tree_name(doc["digest"])
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


def _discard(store: Path, tree: Path) -> None:
    """Remove a tree at once for any reader (renamed to a hidden name, then deleted): never
    seen half-deleted, or without its metadata."""
    gone = store / f"{TMP_PREFIX}gone-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(tree, gone)
    except FileNotFoundError:
        return
    _remove(gone)


def _remove(path: Path) -> None:
    """Remove a file, link or tree; already gone is fine."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
