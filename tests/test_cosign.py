"""cosign key-pair signatures of OCI artifacts, over bytes: keys made here with
`cryptography`, payloads and signatures made as `cosign sign --key` makes them
(tests/cosignsign.py), artifacts built from the contract's dataclasses and, for rollback,
stored with their metadata the way oci.pull leaves them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec

from cosignsign import new_key, payload, sign, write_public
from reconciler.intake import TrustError, Verify, oci
from reconciler.intake.cosign import CosignVerifier, created_at, load_keys, rollback_refusal, verify_signatures
from reconciler.intake.kinds import DIRECTORY, GIT, OCI, source_kind, verifier_for
from reconciler.intake.signatures import read_keys

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REF = oci.parse_reference("oci://127.0.0.1:5000/team/app:v1")


def artifact(sigs=(), digest: str = DIGEST, created: str = "2026-01-02T03:04:05Z", path: Path = Path("/nonexistent")):
    return oci.Artifact(REF, digest, "main@sha1:" + "1" * 40, "https://example/repo", created, path, tuple(sigs))


def signature(key, data: bytes, **kw) -> oci.Signature:
    return oci.Signature(data, sign(key, data, **kw), {})


def keys_of(tmp: Path, *private) -> tuple:
    files = [write_public(k, tmp / f"key{i}.pub") for i, k in enumerate(private)]
    return load_keys(read_keys(tuple(map(str, files)))[2])


@pytest.mark.parametrize("kind,hash_name", [("p256", "sha256"), ("p384", "sha256"), ("p384", "sha384"),
                                            ("rsa", "sha256"), ("ed25519", "sha256")])
def test_a_good_signature_verifies_and_names_the_key(tmp_path, kind, hash_name):
    key = new_key(kind)
    keys = keys_of(tmp_path, key)
    v = verify_signatures(artifact([signature(key, payload(DIGEST), hash_name=hash_name)]), keys)
    assert v.ok, v
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert (v.signer, v.key) == ("key0.pub", "sha256:" + hashlib.sha256(der).hexdigest())
    assert v.revision == "main@sha1:" + "1" * 40 + "@" + DIGEST  # the artifact's name, as status shows it


def test_every_wrong_signature_is_refused_with_its_reason(tmp_path):
    key, stranger = new_key(), new_key()
    keys = keys_of(tmp_path, key)
    good = payload(DIGEST)

    def verdict(*sigs):
        return verify_signatures(artifact(sigs), keys)

    assert verdict().reason == "unsigned"
    v = verdict(signature(stranger, good))
    assert (v.ok, v.reason, v.signer) == (False, "unknown-key", "")
    tampered = oci.Signature(good.replace(b"docker-reference\":\"127.0.0.1/app", b"docker-reference\":\"127.0.0.1/evil"),
                             sign(key, good), {})
    assert tampered.payload != good and verdict(tampered).reason == "unknown-key"
    v = verdict(signature(key, payload(OTHER)))  # a good signature of another artifact, replayed
    assert (v.reason, v.signer) == ("digest-mismatch", "key0.pub") and OTHER in v.message
    assert verdict(signature(key, payload(DIGEST, kind="atomic container signature"))).reason == "bad-payload"
    assert verdict(signature(key, b"not json")).reason == "bad-payload"
    assert verdict(signature(key, b'{"critical": {"image": {}}}')).reason == "bad-payload"
    assert verdict(oci.Signature(good, "%%% not base64 %%%", {})).reason == "bad-signature"
    assert verdict(oci.Signature(good, "", {})).reason == "bad-signature"
    bitflip = bytearray(base64.b64decode(sign(key, good)))
    bitflip[-1] ^= 1
    assert verdict(oci.Signature(good, base64.b64encode(bytes(bitflip)).decode(), {})).reason == "unknown-key"
    # any one good layer is enough; the refusal names the worst layer otherwise
    assert verdict(signature(stranger, good), signature(key, good)).ok
    v = verdict(signature(stranger, good), signature(key, payload(OTHER)))
    assert v.reason == "digest-mismatch" and "of 2 signature layers" in v.message
    assert "refused (digest-mismatch)" in v.describe() and "@sha256:abababababab" in v.describe()


def test_pem_files_are_recognised_and_bad_ones_are_loud(tmp_path):
    a, b = new_key(), new_key("ed25519")
    pa, pb = write_public(a, tmp_path / "a.pub"), write_public(b, tmp_path / "b.pub")
    both = tmp_path / "both.pub"
    both.write_bytes(pa.read_bytes() + b"\n" + pb.read_bytes())
    ssh = tmp_path / "ops.pub"
    ssh.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlPtd1dt+0Gs3bsD+nHHFVyZxR3GJXxgjaOdjZQFvsM ops@example\n")
    signers, pgp, pem = read_keys((str(pa), str(ssh)))
    assert len(signers) == 1 and pgp == [] and pem == [(str(pa), pa.read_bytes())]
    loaded = load_keys(read_keys((str(both),))[2])
    assert [k.name for k in loaded] == ["both.pub#1", "both.pub#2"]

    def refused(path: Path, words: str) -> None:
        with pytest.raises(TrustError, match=words):
            load_keys(read_keys((str(path),))[2])

    broken = tmp_path / "broken.pub"
    broken.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    refused(broken, "broken.pub is not a readable PEM public key")
    private = tmp_path / "cosign.key"
    private.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    refused(private, "holds a private key")
    k1 = write_public(ec.generate_private_key(ec.SECP256K1()), tmp_path / "k1.pub")
    refused(k1, "curve secp256k1")
    d = write_public(dsa.generate_private_key(key_size=2048), tmp_path / "dsa.pub")
    refused(d, "cosign signatures are checked with ECDSA, RSA or Ed25519")


def test_the_verifier_of_each_source_kind_needs_its_kind_of_key(tmp_path):
    pem = write_public(new_key(), tmp_path / "cosign.pub")
    ssh = tmp_path / "ops.pub"
    ssh.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlPtd1dt+0Gs3bsD+nHHFVyZxR3GJXxgjaOdjZQFvsM ops@example\n")
    with pytest.raises(TrustError, match="no PEM public key"):
        CosignVerifier(Verify(keys=(str(ssh),)))
    # the kind comes from the command line and the node config, not the disk: nothing
    # needs to exist yet (watch before the first fetch or the first clone)
    assert source_kind(True, None) == OCI and source_kind(False, Verify(keys=())) == GIT
    assert source_kind(False, None) == DIRECTORY
    with verifier_for(Verify(keys=(str(pem),)), OCI) as v:
        assert isinstance(v, CosignVerifier)
    # a key of the other kind is a configuration error, mixed in or alone
    with pytest.raises(TrustError, match=r"PEM public keys \(.*cosign.pub.*git checkout"):
        verifier_for(Verify(keys=(str(pem),)), GIT)
    with pytest.raises(TrustError, match=r"PEM public keys \(.*cosign.pub"):
        verifier_for(Verify(keys=(str(ssh), str(pem))), GIT)
    with pytest.raises(TrustError, match=r"SSH or OpenPGP keys \(.*ops.pub\).*OCI artifact"):
        verifier_for(Verify(keys=(str(pem), str(ssh))), OCI)
    with pytest.raises(TrustError, match="no PEM public key"):
        verifier_for(Verify(keys=(str(ssh),)), OCI)
    # a tree that was not pulled into a store this process opened is not an artifact
    current = oci.store_for(tmp_path / "state", REF) / "current"
    with pytest.raises(TrustError, match="is not an OCI artifact in nftrec's store"):
        CosignVerifier(Verify(keys=(str(pem),))).check(current)


def test_created_times_are_read_as_rfc3339():
    assert created_at("2026-01-02T03:04:05Z") < created_at("2026-01-02T03:04:05.5Z")
    assert created_at("2026-01-02T04:04:05+01:00") == created_at("2026-01-02T03:04:05Z")
    assert created_at("2026-01-02T03:04:05.123456789-00:30") > created_at("2026-01-02T03:34:05Z")
    for bad in ("", "yesterday", "2026-13-02T03:04:05Z", "2026-01-02 03:04", "2026-01-02T03:04:05"):
        assert created_at(bad) is None, bad


def stored(store: Path, digest: str, created: str, sigs=()) -> oci.Artifact:
    """An artifact in `store` with its metadata, as oci.pull leaves it."""
    tree = oci.open_store(store) / digest.replace(":", "-")
    tree.mkdir()
    (tree / "web.yaml").write_text("kind: Service\n")
    oci.write_metadata(tree, REF, digest, {oci.ANNOTATION_CREATED: created} if created else {}, tuple(sigs))
    found = oci.artifact_at(tree)
    assert found is not None and found.digest == digest
    return found


def test_an_older_artifact_is_a_rollback(tmp_path):
    key = new_key()
    pem = write_public(key, tmp_path / "cosign.pub")
    store = oci.store_for(tmp_path / "state", REF)
    old = stored(store, OTHER, "2026-01-02T03:04:05Z")
    last = old.name

    def check(created: str, *, allow: bool = False, spec_allow: bool = False, digest: str = DIGEST):
        new = stored(store, digest, created, [signature(key, payload(digest))])
        try:
            v = CosignVerifier(Verify(keys=(str(pem),), allow_rollback=spec_allow))
            return v.check(new.path, last, allow_rollback=allow)
        finally:
            for f in new.path.iterdir():
                f.unlink()
            new.path.rmdir()

    assert check("2026-01-02T03:04:06Z").ok and not check("2026-01-02T03:04:06Z").rollback_allowed
    assert check("2026-01-02T03:04:05Z").ok  # the same time is not older
    v = check("2026-01-01T00:00:00Z")
    assert (v.ok, v.reason) == (False, "rollback") and "--allow-rollback" in v.message
    assert "2026-01-01T00:00:00Z" in v.message and "2026-01-02T03:04:05Z" in v.message
    for allowed in (check("2026-01-01T00:00:00Z", allow=True), check("2026-01-01T00:00:00Z", spec_allow=True)):
        assert allowed.ok and allowed.rollback_allowed and "rollback, allowed" in allowed.describe()
    assert check("").reason == "rollback"  # no created: it cannot be shown to be newer
    assert check("not a time").reason == "rollback"
    # a signature is checked before the age: an unsigned older artifact is unsigned
    new = stored(store, DIGEST, "2026-01-01T00:00:00Z")
    assert CosignVerifier(Verify(keys=(str(pem),))).check(new.path, last).reason == "unsigned"


def test_rollback_decisions_when_the_order_cannot_be_read(tmp_path):
    store = oci.store_for(tmp_path / "state", REF)
    new = stored(store, DIGEST, "2026-01-01T00:00:00Z")
    assert rollback_refusal(new, None) == ""  # nothing applied before
    assert rollback_refusal(new, "1" * 40) == ""  # the last applied came from git: no order between them
    assert rollback_refusal(new, new.name) == ""  # the same artifact again
    assert rollback_refusal(new, DIGEST) == ""
    assert "no longer in the store" in rollback_refusal(new, "main@sha1:" + "2" * 40 + "@" + OTHER)
    assert rollback_refusal(new, OTHER) == ""  # a bare digest not in the store: a plain directory's
    stored(store, OTHER, "2026-01-02T00:00:00Z")  # a bare digest in the store: an artifact without revision
    assert "before the last applied artifact" in rollback_refusal(new, OTHER)
    third = "sha256:" + "ef" * 32
    stored(store, third, "")  # the last applied one carries no time: nothing to be older than
    assert rollback_refusal(new, "main@sha1:" + "2" * 40 + "@" + third) == ""


def test_signatures_survive_the_store_metadata(tmp_path):
    """What pull stores is what the verifier reads: payload bytes and the annotation."""
    key = new_key()
    keys = keys_of(tmp_path, key)
    store = oci.store_for(tmp_path / "state", REF)
    a = stored(store, DIGEST, "2026-01-02T03:04:05Z", [signature(key, payload(DIGEST))])
    assert verify_signatures(a, keys).ok
    meta = json.loads((a.path / oci.METADATA).read_text())
    assert len(meta["signatures"]) == 1
    # a store of the older layout (the metadata beside the tree) is still read
    (a.path / oci.METADATA).rename(a.path.with_name(a.path.name + ".json"))
    assert verify_signatures(oci.artifact_at(a.path), keys).ok
