"""Pulling Flux-format artifacts from a real docker-registry on loopback: by tag and by
digest, the store (publish, prune, metadata, revisions), the cost of an unchanged tag,
and every digest lie refused with nothing written outside the store."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from ociregistry import (FLUX_LAYER, OCI_INDEX, assert_refused, flux_manifest, listing, push_artifact, push_blob,  # noqa: F401
                         push_manifest, registry, sha256, tar_gz, tls_registry)

from reconciler.intake import input_digest
from reconciler.intake import oci
from reconciler.intake.model import OciSettings
from reconciler.intake.oci import (SourceError, artifact_at, close_registries, parse_reference, prune, publish, pull,
                                   resolve, store_for)

INSECURE = OciSettings(insecure=True)
FILES = {"svc.yaml": b"apiVersion: v1\nkind: Service\n", "apps/web/eps.yaml": b"kind: EndpointSlice\n"}
REVISION = "main@sha1:" + "ab" * 20


@pytest.fixture(autouse=True)
def _fresh_clients():
    yield
    close_registries()


def read_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != oci.METADATA}


def test_pull_by_tag_and_by_digest(registry, tmp_path):
    digest = push_artifact(registry.host, "team/manifests", "v1", FILES, revision=REVISION, **registry.http)
    ref = parse_reference(registry.ref("team/manifests", "v1"))
    store = store_for(tmp_path / "state", ref)
    assert resolve(ref, INSECURE) == digest
    art = pull(ref, INSECURE, store)
    assert art.digest == digest and art.revision == REVISION and art.name == f"{REVISION}@{digest}"
    assert art.source == "https://git.example/manifests.git" and art.created == "2026-01-01T00:00:00Z"
    assert art.path == store / f"sha256-{digest[7:]}"
    assert read_tree(art.path) == FILES
    assert {oct(p.stat().st_mode & 0o7777) for p in art.path.rglob("*")} == {"0o644", "0o755"}
    assert oct(art.path.stat().st_mode & 0o7777) == "0o755"
    # by digest: the same tree, and no download (already stored)
    gets = len(registry.requests("GET"))
    pinned = pull(parse_reference(registry.ref("team/manifests", digest=digest)), INSECURE, store)
    assert pinned.path == art.path and pinned.digest == digest and pinned.revision == REVISION
    assert len(registry.requests("GET")) == gets
    # and into a fresh store, by digest alone
    other = pull(parse_reference(registry.ref("team/manifests", digest=digest)), INSECURE, tmp_path / "other")
    assert read_tree(other.path) == FILES


def test_publish_revision_and_prune(registry, tmp_path):
    state = tmp_path / "state"
    source = registry.ref("m", "main")
    digests = []
    for i in range(5):
        digests.append(push_artifact(registry.host, "m", "main", {"a.yaml": f"n: {i}\n".encode()},
                                     revision=f"main@sha1:{i:040x}", **registry.http))
        store = store_for(state, parse_reference(source))  # as watch's fetcher: pull, publish, prune
        root = publish(store, pull(parse_reference(source), INSECURE, store))
        prune(store)
        assert root == store_for(state, parse_reference(source)) / "current"
        assert (root / "a.yaml").read_text() == f"n: {i}\n"
        assert artifact_at(root).digest == digests[-1]
        # revision_of (every command's revision) names the artifact, though tmp_path may be in git
        assert input_digest(root).revision == f"main@sha1:{i:040x}@{digests[-1]}"
    store = root.parent
    trees = sorted(p.name for p in store.iterdir() if p.name.startswith("sha256-") and p.is_dir())
    assert len(trees) == 4  # the current one and the 3 kept by prune
    assert f"sha256-{digests[0][7:]}" not in trees
    prune(store, keep=0, protect=frozenset({digests[1]}))
    left = sorted(p.name for p in store.iterdir())
    assert left == sorted(["current", oci.LOCK, f"sha256-{digests[4][7:]}", f"sha256-{digests[1][7:]}"])
    assert artifact_at(tmp_path) is None and artifact_at(store / f"sha256-{digests[1][7:]}" / "a.yaml").digest == digests[1]
    # what a killed pull or publish left: removed once an hour old, never while it may be in use
    (store / ".tmp-1234").mkdir()
    (store / ".tmp-99-1.layer").write_bytes(b"partial")
    os.symlink("sha256-x", store / ".tmp-current-99-2")
    prune(store)
    assert len([p for p in store.iterdir() if p.name.startswith(".tmp-")]) == 3
    for p in store.iterdir():
        if p.name.startswith(".tmp-"):
            os.utime(p, (time.time() - 7200,) * 2, follow_symlinks=False)
    prune(store)
    assert sorted(p.name for p in store.iterdir()) == left


def test_unchanged_tag_costs_one_head_and_no_download(registry, tmp_path):
    digest = push_artifact(registry.host, "m", "v1", FILES, **registry.http)
    ref = parse_reference(registry.ref("m", "v1"))
    store = store_for(tmp_path, ref)
    pull(ref, INSECURE, store)
    before = registry.requests()
    assert resolve(ref, INSECURE) == digest
    assert pull(ref, INSECURE, store, digest=digest).digest == digest
    new = registry.requests()[len(before):]
    assert new == ["HEAD /v2/m/manifests/v1 HTTP/1.1"]
    assert resolve(parse_reference(registry.ref("m", digest=digest)), INSECURE) == digest  # pinned: no request
    assert registry.requests()[len(before):] == new


def test_plain_http_refused_without_insecure(registry, tmp_path):
    push_artifact(registry.host, "m", "v1", FILES, **registry.http)
    with pytest.raises(SourceError) as e:
        resolve(parse_reference(registry.ref("m", "v1")), OciSettings())
    assert e.value.reason == "insecure-refused" and "oci.insecure: true" in e.value.message


def test_registry_down_is_unreachable(registry, tmp_path):
    ref = parse_reference(registry.ref("m", "v1"))
    registry.stop()
    before = listing(tmp_path)
    with pytest.raises(SourceError) as e:
        pull(ref, INSECURE, store_for(tmp_path / "state", ref))
    assert e.value.reason == "unreachable" and registry.host in e.value.message
    assert listing(tmp_path) == before


def test_tls_and_basic_auth(tls_registry, tmp_path):
    digest = push_artifact(tls_registry.host, "secure/m", "v1", FILES, **tls_registry.http)
    creds = tls_registry.credentials_file(tmp_path / "config.json")
    settings = OciSettings(ca_file=tls_registry.ca_file, credentials_file=str(creds))
    ref = parse_reference(tls_registry.ref("secure/m", "v1"))
    art = pull(ref, settings, store_for(tmp_path / "state", ref))
    assert art.digest == digest and read_tree(art.path) == FILES
    # the auth negotiated is kept: the next resolve is one HEAD, answered
    n = len(tls_registry.requests("HEAD"))
    assert resolve(ref, settings) == digest
    assert len(tls_registry.requests("HEAD")) == n + 1
    # https://host keys work too (docker login writes those for some registries)
    close_registries()
    creds2 = tls_registry.credentials_file(tmp_path / "config2.json", key=f"https://{tls_registry.host}")
    assert resolve(ref, OciSettings(ca_file=tls_registry.ca_file, credentials_file=str(creds2))) == digest


def test_tls_errors_are_clear(tls_registry, tmp_path):
    ref = parse_reference(tls_registry.ref("m", "v1"))
    creds = tls_registry.credentials_file(tmp_path / "config.json", password="wrong-password")
    with pytest.raises(SourceError) as e:
        resolve(ref, OciSettings(ca_file=tls_registry.ca_file, credentials_file=str(creds)))
    assert e.value.reason == "auth" and tls_registry.host in e.value.message and str(creds) in e.value.message
    assert "wrong-password" not in e.value.message and tls_registry.password not in e.value.message
    with pytest.raises(SourceError) as e:
        resolve(ref, OciSettings(ca_file=tls_registry.ca_file))
    assert e.value.reason == "auth" and "oci.credentialsFile" in e.value.message
    with pytest.raises(SourceError) as e:  # the test CA is not a system CA
        resolve(ref, OciSettings(credentials_file=str(creds)))
    assert e.value.reason == "tls" and "oci.caFile" in e.value.message
    with pytest.raises(SourceError) as e:
        resolve(ref, OciSettings(insecure=True))
    assert e.value.reason == "tls" and "remove oci.insecure" in e.value.message


def test_layer_whose_bytes_do_not_match_its_digest(registry, tmp_path):
    push_artifact(registry.host, "m", "v1", FILES, **registry.http)
    layer = sha256(tar_gz(FILES))
    registry.corrupt_blob(layer, offset=20)
    e = assert_refused("digest-mismatch", parse_reference(registry.ref("m", "v1")), INSECURE, tmp_path / "state",
                       tmp_path, skip=registry.tmp)
    assert layer in e.message and "refused" in e.message
    assert registry.requests("GET", f"/blobs/{layer}")  # it was downloaded, then refused


def test_manifest_whose_digest_lies(registry, tmp_path):
    digest = push_artifact(registry.host, "m", "v1", FILES, revision="main@sha1:" + "1" * 40, **registry.http)
    raw = registry.blob_file(digest).read_bytes()
    registry.replace_blob(digest, raw.replace(b"main@sha1:1111", b"main@sha1:2222"))
    for ref in (registry.ref("m", "v1"), registry.ref("m", digest=digest)):
        e = assert_refused("digest-mismatch", parse_reference(ref), INSECURE, tmp_path / "state", tmp_path, skip=registry.tmp)
        assert digest in e.message


def test_layer_descriptor_that_lies(registry, tmp_path):
    data = tar_gz(FILES)
    push_artifact(registry.host, "m", "small", layer=data, layer_size=len(data) - 1, **registry.http)
    push_artifact(registry.host, "m", "big", layer=data, layer_size=len(data) + 1, **registry.http)
    other = push_blob(registry.host, "m", tar_gz({"other.yaml": b"x\n"}), **registry.http)
    push_artifact(registry.host, "m", "other", layer=data, layer_digest=other, **registry.http)
    for tag in ("small", "big", "other"):
        assert_refused("digest-mismatch", parse_reference(registry.ref("m", tag)), INSECURE, tmp_path / "state", tmp_path,
                       skip=registry.tmp)
    push_artifact(registry.host, "m", "huge", layer=data, layer_size=1 << 40, **registry.http)
    assert_refused("too-large", parse_reference(registry.ref("m", "huge")), INSECURE, tmp_path / "state", tmp_path,
                   skip=registry.tmp)


def test_only_flux_artifacts(registry, tmp_path):
    data = tar_gz(FILES)
    layer = push_blob(registry.host, "m", data, **registry.http)
    push_blob(registry.host, "m", b"{}", **registry.http)
    cases = {
        "tarlayer": ({"layer_media_type": "application/vnd.oci.image.layer.v1.tar+gzip"}, "layer is"),
        "config": ({"config_media_type": "application/vnd.oci.image.config.v1+json"}, "config media type"),
        "twolayers": ({"extra_layers": ({"mediaType": FLUX_LAYER, "digest": layer, "size": len(data)},)}, "2 layers"),
    }
    for tag, (opts, says) in cases.items():
        push_manifest(registry.host, "m", tag, flux_manifest(layer, len(data), **opts), **registry.http)
        e = assert_refused("bad-artifact", parse_reference(registry.ref("m", tag)), INSECURE, tmp_path / "state", tmp_path,
                           skip=registry.tmp, says=says)
        assert e.message.startswith("not a Flux artifact")
    one = push_artifact(registry.host, "m", "v1", FILES, **registry.http)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": one,
                            "size": registry.blob_file(one).stat().st_size}]}
    push_manifest(registry.host, "m", "index", index, media_type=OCI_INDEX, **registry.http)
    assert_refused("bad-artifact", parse_reference(registry.ref("m", "index")), INSECURE, tmp_path / "state", tmp_path,
                   skip=registry.tmp, says="image index")
    with pytest.raises(SourceError) as e:
        resolve(parse_reference(registry.ref("m", "nosuchtag")), INSECURE)
    assert e.value.reason == "not-found"


def test_metadata_is_the_record(registry, tmp_path):
    digest = push_artifact(registry.host, "m", "v1", FILES, revision=REVISION, **registry.http)
    ref = parse_reference(registry.ref("m", "v1"))
    art = pull(ref, INSECURE, store_for(tmp_path, ref))
    meta = json.loads((art.path / oci.METADATA).read_text())
    assert meta["digest"] == digest and meta["annotations"]["org.opencontainers.image.revision"] == REVISION
    assert meta["reference"] == f"{ref}@{digest}"
    # a tree without (valid) metadata is no artifact, and is unpacked anew by the next pull
    (art.path / oci.METADATA).write_text("{}")
    (art.path / "svc.yaml").write_bytes(b"not what was pulled")
    assert artifact_at(art.path) is None
    again = pull(ref, INSECURE, store_for(tmp_path, ref), digest=digest)
    assert read_tree(again.path) == FILES and artifact_at(art.path).digest == digest
    with pytest.raises(SourceError) as e:
        pull(ref, INSECURE, store_for(tmp_path, ref), digest="sha256:../../etc")
    assert e.value.reason == "bad-reference"


def push_sig_manifest(registry, repo: str, digest: str, payloads: list[bytes]) -> str:
    """cosign's layout, no cryptography: tag sha256-<hex>.sig, one simple-signing layer per
    payload annotated with a (here meaningless) signature."""
    layers = []
    for i, payload in enumerate(payloads):
        layers.append({"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "size": len(payload),
                       "digest": push_blob(registry.host, repo, payload, **registry.http),
                       "annotations": {"dev.cosignproject.cosign/signature": f"c2lnbmF0dXJl{i}",
                                       "dev.sigstore.cosign/bundle": "{}"}})
    config = b'{"architecture":"","os":""}'
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                           "digest": push_blob(registry.host, repo, config, **registry.http)},
                "layers": layers}
    return push_manifest(registry.host, repo, f"sha256-{digest[7:]}.sig", manifest, **registry.http)


def test_signatures_are_fetched_when_asked(registry, tmp_path):
    digest = push_artifact(registry.host, "m", "v1", FILES, **registry.http)
    ref = parse_reference(registry.ref("m", "v1"))
    store = store_for(tmp_path, ref)
    assert pull(ref, INSECURE, store, signatures=True).signatures == ()  # no .sig tag: none, no error
    payload = json.dumps({"critical": {"image": {"docker-manifest-digest": digest}, "type": "cosign container image signature"},
                          "optional": None}).encode()
    push_sig_manifest(registry, "m", digest, [payload, b"second"])
    layer_gets = len(registry.requests("GET", "/blobs/"))
    art = pull(ref, INSECURE, store, signatures=True)  # none stored: looked up again, the layer not downloaded
    assert [s.payload for s in art.signatures] == [payload, b"second"]
    assert art.signatures[0].signature == "c2lnbmF0dXJl0" and art.signatures[0].annotations == {"dev.sigstore.cosign/bundle": "{}"}
    assert len(registry.requests("GET", "/blobs/")) == layer_gets + 2  # the two payloads only
    assert artifact_at(art.path).signatures == art.signatures  # kept in the metadata
    # asked again: the .sig tag is read anew (a re-sign is seen), the artifact's own blobs not
    push_sig_manifest(registry, "m", digest, [payload])
    before = len(registry.requests())
    again = pull(ref, INSECURE, store, digest=digest, signatures=True)
    assert [s.payload for s in again.signatures] == [payload]
    assert artifact_at(art.path).signatures == again.signatures
    new = registry.requests()[before:]
    assert [r for r in new if "/manifests/" in r] and not [r for r in new if f"/manifests/{digest}" in r]
    assert len([r for r in new if "/blobs/" in r]) == 1  # the one payload
    before = len(registry.requests())
    assert pull(ref, INSECURE, store, digest=digest).signatures == again.signatures  # not asked: the stored ones
    assert len(registry.requests()) == before  # and no request


def test_signature_payload_whose_bytes_lie(registry, tmp_path):
    digest = push_artifact(registry.host, "m", "v1", FILES, **registry.http)
    push_sig_manifest(registry, "m", digest, [b'{"critical": {}}'])
    registry.corrupt_blob(sha256(b'{"critical": {}}'))
    ref = parse_reference(registry.ref("m", "v1"))
    with pytest.raises(SourceError) as e:
        pull(ref, INSECURE, store_for(tmp_path, ref), signatures=True)
    assert e.value.reason == "digest-mismatch"


# another process on the same store: a one-shot command's prune, and a reader of the trees
_PRUNER = """
import sys
from pathlib import Path
from reconciler.intake.oci import prune
store = Path(sys.argv[1])
while True:
    try:
        prune(store, keep=0)
    except OSError:
        pass
"""
_READER = """
import os, re, sys
from pathlib import Path
store = Path(sys.argv[1])
while True:
    try:
        names = os.listdir(store)
    except OSError:
        continue
    for name in names:
        tree = store / name
        if re.fullmatch("sha256-[0-9a-f]{64}", name) and tree.is_dir():
            if not (tree / ".nftrec-artifact.json").exists() and not tree.with_name(name + ".json").exists():
                if tree.is_dir():  # still there, and still without its metadata
                    print("visible without its metadata:", name, flush=True)
                    sys.exit(3)
"""


def test_a_concurrent_prune_never_removes_what_the_fetcher_publishes(registry, tmp_path):
    """watch's fetcher pulls and publishes while another process prunes the store with
    keep=0 (as a one-shot command does) and a third reads it: every published tree is
    there with its content, and no tree is ever seen without its metadata."""
    import subprocess
    import sys

    from reconciler.daemon.fetcher import Fetcher
    from reconciler.engine import Target
    from reconciler.intake import NodeConfig

    fetcher = Fetcher(registry.ref("m", "main"), Target(None, "nftrec", tmp_path / "state"))
    cfg = NodeConfig(node_name="n", oci=INSECURE)
    fetcher.config = lambda: cfg
    store = fetcher.store
    others = [subprocess.Popen([sys.executable, "-c", code, str(store)], stdout=subprocess.PIPE, text=True)
              for code in (_PRUNER, _READER)]
    try:
        for i in range(12):
            digest = push_artifact(registry.host, "m", "main", {"a.yaml": f"n: {i}\n".encode()}, **registry.http)
            fetcher.poll()
            assert fetcher.failures == 0, fetcher.state
            assert (store / "current" / "a.yaml").read_text() == f"n: {i}\n"
            assert artifact_at(store / "current").digest == digest
            assert others[1].poll() is None, others[1].stdout.read()
    finally:
        for p in others:
            p.kill()
            p.wait()
