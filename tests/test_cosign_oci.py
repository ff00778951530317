"""cosign-signed OCI artifacts end to end: a real docker-registry on loopback
(tests/ociregistry.py), Flux-format artifacts and cosign-format signatures pushed to it
(tests/cosignsign.py, keys made here), pulled with their signatures by intake.oci and
verified; then `nftrec apply oci://...` with `verify` in a throwaway namespace: signed
applied, unsigned / wrongly signed / older refused with nothing applied, --allow-rollback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cosignsign import new_key, payload, push_signature, sign, sign_artifact, write_public
from ociregistry import push_artifact, registry, tar_gz  # noqa: F401 (the fixture)
from reconciler.intake import OciSettings, Verify, oci
from reconciler.intake.cosign import CosignVerifier
from test_cli_kernel import nftrec, ok
from test_verify_signed import SERVICE, live_ips

REPO = "fleet/manifests"


def push(reg, tag: str, ip: str, created: str) -> str:
    return push_artifact(reg.host, REPO, tag, {"web.yaml": SERVICE.format(ip=ip).encode()},
                         revision=f"main@sha1:{hashlib.sha1(ip.encode()).hexdigest()}", created=created, **reg.http)


def test_signatures_pulled_from_the_registry_are_verified(tmp_path, registry):  # noqa: F811
    key, stranger = new_key(), new_key()
    pem = write_public(key, tmp_path / "cosign.pub")
    settings = OciSettings(insecure=True)
    verifier = CosignVerifier(Verify(keys=(str(pem),)))
    ref = oci.parse_reference(registry.ref(REPO, "v1"))
    store = oci.store_for(tmp_path / "state", ref)

    def verdict(digest: str):
        artifact = oci.pull(ref, settings, store, digest=digest, signatures=True)
        return verifier.check(artifact.path)

    signed = push(registry, "v1", "10.96.0.10", "2026-01-01T00:00:00Z")
    sign_artifact(key, registry.host, REPO, signed, **registry.http)
    v = verdict(signed)
    assert v.ok and v.signer == "cosign.pub" and v.revision.endswith("@" + signed), v

    unsigned = push(registry, "v1", "10.96.0.11", "2026-01-01T00:00:01Z")
    assert verdict(unsigned).reason == "unsigned"
    strange = push(registry, "v1", "10.96.0.12", "2026-01-01T00:00:02Z")
    sign_artifact(stranger, registry.host, REPO, strange, **registry.http)
    assert verdict(strange).reason == "unknown-key"
    # a good signature of the first artifact, copied to another one's .sig tag
    replayed = push(registry, "v1", "10.96.0.13", "2026-01-01T00:00:03Z")
    data = payload(signed)
    push_signature(registry.host, REPO, replayed, [(data, sign(key, data))], **registry.http)
    v = verdict(replayed)
    assert v.reason == "digest-mismatch" and signed in v.message


def node_config(tmp: Path, *keys: Path) -> Path:
    c = tmp / "config.yaml"
    c.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: n1\nnodeIPs: [192.168.50.2]\n"
                 f"verify:\n  keys: [{', '.join(str(k) for k in keys)}]\noci:\n  insecure: true\n")
    return c


@pytest.mark.kernel
def test_apply_oci_with_verify_applies_only_signed_newer_artifacts(tmp_path, registry, netns):  # noqa: F811
    key, stranger = new_key(), new_key()
    cfg = node_config(tmp_path, write_public(key, tmp_path / "cosign.pub"))
    state = tmp_path / "state"
    source = registry.ref(REPO, "prod")

    def status() -> dict:
        return json.loads(nftrec("status", "-o", "json", state=state, ns=netns, config=cfg).stdout)

    good = push(registry, "prod", "10.96.0.10", "2026-01-02T00:00:00Z")
    sign_artifact(key, registry.host, REPO, good, **registry.http)
    p = ok(nftrec("plan", source, state=state, ns=netns, config=cfg))
    assert "verified: signed by cosign.pub (key sha256:" in p.stdout.splitlines()[0], p.stdout
    ok(nftrec("apply", source, state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns)
    applied = status()["lastAppliedRevision"]
    assert applied.endswith("@" + good), applied

    def refused(reason: str, *words: str) -> None:
        p = nftrec("apply", source, state=state, ns=netns, config=cfg)
        assert p.returncode == 1 and f"refused ({reason})" in p.stderr, p.stdout + p.stderr
        assert "10.96.0.11" not in live_ips(netns) and "10.96.0.10" in live_ips(netns)
        st = status()
        assert st["lastAppliedRevision"] == applied and f"refused ({reason})" in st["lastError"], st
        for w in words:
            assert w in st["lastError"], st["lastError"]
        assert f"refused ({reason})" in nftrec("status", state=state, ns=netns, config=cfg).stdout

    push(registry, "prod", "10.96.0.11", "2026-01-03T00:00:00Z")
    refused("unsigned", "no cosign signature")
    sign_artifact(stranger, registry.host, REPO, push(registry, "prod", "10.96.0.11", "2026-01-03T00:00:01Z"),
                  **registry.http)
    refused("unknown-key")

    # a newer signed artifact, then the tag moved back to the older one: a rollback
    newer = push(registry, "prod", "10.96.0.12", "2026-01-04T00:00:00Z")
    sign_artifact(key, registry.host, REPO, newer, **registry.http)
    ok(nftrec("apply", source, state=state, ns=netns, config=cfg))
    assert "10.96.0.12" in live_ips(netns)
    older = registry.ref(REPO, digest=good)
    p = nftrec("apply", older, state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (rollback)" in p.stderr, p.stderr
    assert "2026-01-02T00:00:00Z" in p.stderr and "10.96.0.12" in live_ips(netns)
    p = ok(nftrec("apply", older, "--allow-rollback", state=state, ns=netns, config=cfg))
    assert "a rollback, allowed" in p.stderr, p.stderr
    assert "10.96.0.10" in live_ips(netns) and "10.96.0.12" not in live_ips(netns)
    assert status()["lastAppliedRevision"].endswith("@" + good)


@pytest.mark.kernel
def test_an_unsigned_artifacts_layer_is_never_fetched(tmp_path, registry, netns):  # noqa: F811
    """The signature of the manifest digest is checked before any layer is requested:
    refused artifacts are never downloaded, unpacked or published."""
    key, stranger = new_key(), new_key()
    cfg = node_config(tmp_path, write_public(key, tmp_path / "cosign.pub"))
    state = tmp_path / "state"
    from reconciler.engine import Target

    store = oci.store_for(Target(netns, "nftrec", state).store().dir, oci.parse_reference(registry.ref(REPO, "prod")))
    for tag, ip in (("unsigned", "10.96.0.11"), ("stranger", "10.96.0.12")):
        digest = push(registry, tag, ip, "2026-01-03T00:00:00Z")
        if tag == "stranger":
            sign_artifact(stranger, registry.host, REPO, digest, **registry.http)
        blobs = len(registry.requests("GET", "/blobs/"))
        p = nftrec("apply", registry.ref(REPO, tag), state=state, ns=netns, config=cfg)
        assert p.returncode == 1 and "refused (" in p.stderr, p.stdout + p.stderr
        fetched = registry.requests("GET", "/blobs/")[blobs:]
        assert len(fetched) == (1 if tag == "stranger" else 0), fetched  # the signature's payload, no layer
        assert not (store / digest.replace(":", "-")).exists() and not (store / "current").exists()
        assert ip not in live_ips(netns)
    assert not [p for p in store.iterdir() if p.name.startswith("sha256-")]


@pytest.mark.kernel
def test_the_kind_of_key_must_match_the_source(tmp_path, registry, netns):  # noqa: F811
    ssh = tmp_path / "ops.pub"
    ssh.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlPtd1dt+0Gs3bsD+nHHFVyZxR3GJXxgjaOdjZQFvsM ops@example\n")
    cfg = node_config(tmp_path, ssh)
    push(registry, "prod", "10.96.0.10", "2026-01-02T00:00:00Z")
    p = nftrec("apply", registry.ref(REPO, "prod"), state=tmp_path / "state", ns=netns, config=cfg)
    assert p.returncode == 1 and "holds no PEM public key" in p.stderr, p.stderr
    assert "10.96.0.10" not in live_ips(netns)
    p = nftrec("watch", registry.ref(REPO, "prod"), "--metrics-address", "", state=tmp_path / "state", ns=netns,
               config=cfg)
    assert p.returncode == 1 and "holds no PEM public key" in p.stderr, p.stderr  # watch does not start
    assert "10.96.0.10" not in live_ips(netns)


@pytest.mark.kernel
def test_watch_skips_unsigned_and_older_artifacts_and_applies_a_signed_one(tmp_path, registry, netns):  # noqa: F811
    from watchproc import Watch

    key = new_key()
    cfg = node_config(tmp_path, write_public(key, tmp_path / "cosign.pub"))
    cfg.write_text(cfg.read_text() + "  interval: 1s\n")
    state = tmp_path / "state"

    def signed(ip: str, created: str) -> str:
        """Pushed under its own tag, signed, then tagged prod (`flux tag artifact`): watch
        never sees it before its signature is there."""
        digest = push(registry, ip, ip, created)
        sign_artifact(key, registry.host, REPO, digest, **registry.http)
        assert push(registry, "prod", ip, created) == digest
        return digest

    def refusal(reason: str, since: int) -> dict:
        return w.wait(lambda: next((x for x in w.events("unverified", since) if x.get("reason") == reason), None),
                      30, what=f"a refusal ({reason})")

    first = signed("10.96.0.10", "2026-01-02T00:00:00Z")
    w = Watch(netns, registry.ref(REPO, "prod"), cfg, state)
    try:
        w.wait(lambda: [s for s in w.syncs() if s.get("revision", "").endswith(first)], 30, what="the first sync")
        assert "10.96.0.10" in live_ips(netns)
        since = len(w.lines)
        unsigned = push(registry, "prod", "10.96.0.11", "2026-01-03T00:00:00Z")
        line = refusal("unsigned", since)
        assert line["revision"].endswith(unsigned) and "10.96.0.11" not in live_ips(netns)
        # its layer was never fetched (the first artifact's signatures may be read again meanwhile)
        layer = "sha256:" + hashlib.sha256(tar_gz({"web.yaml": SERVICE.format(ip="10.96.0.11").encode()})).hexdigest()
        assert registry.requests("GET", f"/blobs/{layer}") == []
        st = w.status(lambda s: (s.get("lastAttemptedRevision") or "").endswith(unsigned))
        assert "refused (unsigned)" in st["lastError"] and st["lastAppliedRevision"].endswith(first)
        # signed after the push, as `flux push` then `cosign sign` do: the next poll sees it
        sign_artifact(key, registry.host, REPO, unsigned, **registry.http)
        w.wait(lambda: [s for s in w.syncs() if s.get("revision", "").endswith(unsigned)], 30, what="the late-signed one")
        assert "10.96.0.11" in live_ips(netns)
        assert registry.requests("GET", f"/blobs/{layer}")  # fetched once signed: the name above is its layer's
        newer = signed("10.96.0.12", "2026-01-04T00:00:00Z")
        w.wait(lambda: [s for s in w.syncs() if s.get("revision", "").endswith(newer)], 30, what="the signed one")
        assert "10.96.0.12" in live_ips(netns)
        since = len(w.lines)
        assert signed("10.96.0.10", "2026-01-02T00:00:00Z") == first  # the tag moved back to the first
        line = refusal("rollback", since)
        assert line["revision"].endswith(first) and line["signer"] == "cosign.pub"
        assert "10.96.0.12" in live_ips(netns) and "10.96.0.10" not in live_ips(netns)
    finally:
        assert w.stop() == 0
