"""Test helper: cosign's key-pair signatures, made the way `cosign sign --key` makes them
(without cosign): a simple-signing payload naming the artifact's digest, signed with
ECDSA P-256 and SHA-256 (or another key given), base64 in the layer annotation
dev.cosignproject.cosign/signature, pushed as the `sha256-<hex>.sig` tag's manifest with
tests/ociregistry.py's primitives.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from ociregistry import OCI_MANIFEST, push_blob, push_manifest, sha256

PAYLOAD_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"


def new_key(kind: str = "p256"):
    """A private key: p256 (cosign generate-key-pair's), p384, rsa, ed25519."""
    if kind == "p256":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "p384":
        return ec.generate_private_key(ec.SECP384R1())
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(kind)


def write_public(key, path: Path) -> Path:
    """The public half as cosign.pub is written: PEM SubjectPublicKeyInfo."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def payload(digest: str, reference: str = "127.0.0.1/app", *, kind: str = "cosign container image signature") -> bytes:
    """cosign's simple-signing payload for `digest` (its JSON, compact, as cosign writes it)."""
    doc = {"critical": {"identity": {"docker-reference": reference}, "image": {"docker-manifest-digest": digest},
                        "type": kind}, "optional": None}
    return json.dumps(doc, separators=(",", ":")).encode()


def sign(key, data: bytes, *, hash_name: str = "sha256") -> str:
    """The base64 signature of `data` with `key`, as cosign signs (ECDSA DER, RSA PKCS#1 v1.5)."""
    algorithm = {"sha256": hashes.SHA256, "sha384": hashes.SHA384}[hash_name]()
    if isinstance(key, ec.EllipticCurvePrivateKey):
        raw = key.sign(data, ec.ECDSA(algorithm))
    elif isinstance(key, rsa.RSAPrivateKey):
        raw = key.sign(data, padding.PKCS1v15(), algorithm)
    else:
        raw = key.sign(data)
    return base64.b64encode(raw).decode()


def signature_tag(digest: str) -> str:
    """cosign's tag for the signatures of `digest`: sha256-<hex>.sig."""
    return digest.replace(":", "-", 1) + ".sig"


def push_signature(host: str, repo: str, digest: str, layers: list[tuple[bytes, str]], **http) -> str:
    """Push the `.sig` tag of `digest` holding (payload, base64 signature) layers, as cosign
    does (an OCI image manifest whose config names the layers' diff ids); its digest."""
    config = json.dumps({"architecture": "", "os": "", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [sha256(p) for p, _ in layers]}}).encode()
    config_digest = push_blob(host, repo, config, **http)
    for p, _ in layers:
        push_blob(host, repo, p, **http)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config), "digest": config_digest},
        "layers": [{"mediaType": PAYLOAD_TYPE, "size": len(p), "digest": sha256(p), "annotations": {SIGNATURE_ANNOTATION: s}}
                   for p, s in layers],
    }
    return push_manifest(host, repo, signature_tag(digest), manifest, **http)


def sign_artifact(key, host: str, repo: str, digest: str, **http) -> str:
    """`cosign sign --key` of the artifact `digest` in host/repo: one layer signed with `key`."""
    data = payload(digest, f"{host}/{repo}")
    return push_signature(host, repo, digest, [(data, sign(key, data))], **http)
