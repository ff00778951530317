"""cosign key-pair signatures of OCI artifacts, checked offline: the signature layers of
an artifact's `sha256-<hex>.sig` tag (fetched with it, oci.Artifact.signatures) against
the PEM public keys of `verify.keys`, with `cryptography`. A layer passes when a key
verifies its signature over its simple-signing payload and the payload names this
artifact's digest; then (unless rollback is allowed) the artifact must not be older than
the last applied one. intake/kinds.py picks this or the git Verifier by the source's kind.
"""

# Supported: cosign's "simple signing" layers (media type
# application/vnd.dev.cosign.simplesigning.v1+json) with the base64 signature in the layer
# annotation dev.cosignproject.cosign/signature, as `cosign sign --key` writes them (cosign
# before 3 by default; cosign 3 with --new-bundle-format=false). Keys: ECDSA P-256, P-384,
# P-521 (SHA-256, cosign's hash, or the curve's own), RSA >= 2048 bits (PKCS#1 v1.5, SHA-256),
# Ed25519. Not supported: keyless (Fulcio certificates, Rekor), the sigstore bundle stored
# as an OCI referrer (cosign 3's default), notation.

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from reconciler.intake import oci
from reconciler.intake.model import Verify
from reconciler.intake.problems import show
from reconciler.intake.signatures import Baseline, TrustError, Verdict, read_keys

SIGNATURE_TYPE = "cosign container image signature"
_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:([Zz])|([+-])(\d\d):(\d\d))")
# the worst outcome of one layer first: what a refusal names when no layer passes
_WORST = ("digest-mismatch", "bad-payload", "unknown-key", "bad-signature")


@dataclass(frozen=True)
class PublicKey:
    name: str  # the key file's name, "#N" added when the file holds several keys
    fingerprint: str  # "sha256:<hex>" of the DER SubjectPublicKeyInfo
    key: object  # a cryptography public key


def load_keys(pem: list[tuple[str, bytes]]) -> tuple[PublicKey, ...]:
    """The public keys of the PEM files (path, bytes) that read_keys found. TrustError
    for a block cryptography cannot read, or a key type or size cosign does not sign with."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    keys = []
    for path, raw in pem:
        blocks = re.findall(rb"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", raw, re.S)
        for n, block in enumerate(blocks, 1):
            where = f"verify.keys: {path}" + (f" (key {n})" if len(blocks) > 1 else "")
            try:
                key = serialization.load_pem_public_key(block)
            except (ValueError, TypeError) as e:
                raise TrustError(f"{where} is not a readable PEM public key ({e}); use the cosign.pub that "
                                 "`cosign generate-key-pair` wrote") from None
            if isinstance(key, ec.EllipticCurvePublicKey):
                if key.curve.name not in ("secp256r1", "secp384r1", "secp521r1"):
                    raise TrustError(f"{where} is an ECDSA key on curve {key.curve.name}; cosign signs with "
                                     "P-256, P-384 or P-521")
            elif isinstance(key, rsa.RSAPublicKey):
                if key.key_size < 2048:
                    raise TrustError(f"{where} is a {key.key_size}-bit RSA key; use at least 2048 bits")
            elif not isinstance(key, ed25519.Ed25519PublicKey):
                raise TrustError(f"{where} is a {type(key).__name__.replace('PublicKey', '')} key; cosign "
                                 "signatures are checked with ECDSA, RSA or Ed25519 keys")
            der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            name = Path(path).name + (f"#{n}" if len(blocks) > 1 else "")
            keys.append(PublicKey(name, "sha256:" + hashlib.sha256(der).hexdigest(), key))
    return tuple(keys)


def _verifies(key: object, signature: bytes, payload: bytes) -> bool:
    """Whether `signature` over `payload` verifies with `key`, as cosign signs (see top)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            own = {"secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}.get(key.curve.name)
            for algorithm in (hashes.SHA256, *((own,) if own else ())):
                try:
                    key.verify(signature, payload, ec.ECDSA(algorithm()))
                    return True
                except InvalidSignature:
                    continue
            return False
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, payload, padding.PKCS1v15(), hashes.SHA256())
        else:
            key.verify(signature, payload)  # Ed25519
        return True
    except (InvalidSignature, ValueError):
        return False


def _layer(sig: oci.Signature, digest: str, keys: tuple[PublicKey, ...]) -> tuple[str, str, PublicKey | None]:
    """(reason, sentence, key) for one signature layer: reason "" when it passes."""
    try:
        raw = base64.b64decode("".join(sig.signature.split()), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not raw:
        return "bad-signature", "its dev.cosignproject.cosign/signature annotation is not a base64 signature", None
    key = next((k for k in keys if _verifies(k.key, raw, sig.payload)), None)
    if key is None:
        return ("unknown-key", "its signature verifies with none of the PEM keys of verify.keys (made with another "
                "key, or the payload was changed after signing)", None)
    try:
        doc = json.loads(sig.payload)
        critical = doc["critical"]
        kind, named = critical["type"], critical["image"]["docker-manifest-digest"]
    except (ValueError, TypeError, KeyError):
        return "bad-payload", f"{key.name} signed a payload that is not cosign's simple-signing JSON", key
    if kind != SIGNATURE_TYPE:
        return "bad-payload", f"{key.name} signed a payload of type {show(kind)}, not {SIGNATURE_TYPE!r}", key
    if named != digest:
        return ("digest-mismatch", f"{key.name} signed another artifact ({show(named)}), not this one", key)
    return "", "", key


def verify_signatures(artifact: oci.Artifact, keys: tuple[PublicKey, ...]) -> Verdict:
    """The verdict on `artifact`'s signatures alone: ok when one layer passes (its key is
    the signer), else refused with the worst layer's reason."""
    if not artifact.signatures:
        return Verdict(artifact.name, False, "unsigned", f"the artifact has no cosign signature (no tag "
                       f"{oci.tree_name(artifact.digest)}.sig with a signature layer)")
    results = [_layer(sig, artifact.digest, keys) for sig in artifact.signatures]
    for reason, _, key in results:
        if not reason and key is not None:
            return Verdict(artifact.name, True, signer=key.name, key=key.fingerprint)
    reason, sentence, key = min(results, key=lambda r: _WORST.index(r[0]))
    layers = f" (of {len(results)} signature layers, none passes)" if len(results) > 1 else ""
    return Verdict(artifact.name, False, reason, f"cosign signature: {sentence}{layers}",
                   signer=key.name if key else "", key=key.fingerprint if key else "")


def created_at(text: str) -> datetime | None:
    """An RFC 3339 time (the `created` annotation), None when absent or malformed."""
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        return None
    y, mo, d, h, mi, s, frac, z, sign, oh, om = m.groups()
    try:
        offset = timedelta(0) if z else timedelta(hours=int(oh), minutes=int(om)) * (1 if sign == "+" else -1)
        return datetime(int(y), int(mo), int(d), int(h), int(mi), min(int(s), 59),
                        int((frac or "0")[:6].ljust(6, "0")), tzinfo=timezone(offset))
    except ValueError:
        return None


def rollback_refusal(artifact: oci.Artifact, last_applied: Baseline | str | None) -> str:
    """Why `artifact` would roll back the last applied artifact (a sentence), or "" when it
    does not. The last applied one's `created` is read from the same store, else taken
    from the baseline's recorded time. Not a rollback: nothing applied before, a revision
    that names no artifact (a git commit; a bare `sha256:` digest not in the store is a
    plain directory's content digest), the same digest, a last applied artifact without
    `created`, a time no earlier. A rollback, as its order cannot be shown:
    `REVISION@sha256:` gone from the store with no recorded time, no valid `created` on this one."""
    baseline = last_applied if isinstance(last_applied, Baseline) else Baseline(last_applied) if last_applied else None
    named = oci.named_digest(baseline.revision if baseline else None)
    if named is None or named == artifact.digest:
        return ""
    last = oci.artifact_at(Path(artifact.path).parent / oci.tree_name(named))
    if last is None and baseline.time is not None:  # pruned: the time recorded when it was applied
        recorded = datetime.fromtimestamp(baseline.time, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        new = created_at(artifact.created)
        if new is None:
            return (f"it has no valid created annotation ({show(artifact.created)}), so it cannot be shown to be newer "
                    f"than the last applied artifact (created {recorded})")
        return f"it was created {artifact.created.strip()}, before the last applied artifact ({recorded})" \
            if new.timestamp() < baseline.time else ""
    if last is None:
        if baseline.revision == named:
            return ""  # a directory's content digest, or an artifact we cannot tell from one
        return (f"the last applied artifact {named[:19]} is no longer in the store {Path(artifact.path).parent}, "
                "so this one cannot be shown to be newer")
    new, old = created_at(artifact.created), created_at(last.created)
    if old is None:
        return ""  # nothing to be older than: the last applied artifact carries no time
    if new is None:
        return (f"it has no valid created annotation ({show(artifact.created)}), so it cannot be shown to be newer "
                f"than the last applied artifact (created {last.created.strip()})")
    if new < old:
        return f"it was created {artifact.created.strip()}, before the last applied artifact ({last.created.strip()})"
    return ""


class Refused(Exception):
    """An artifact's signatures were refused before its layer was fetched (`verdict`;
    `path`: where its tree would have been)."""

    def __init__(self, verdict: Verdict, path: Path):
        super().__init__(verdict.describe())
        self.verdict, self.path = verdict, path


class CosignVerifier:
    """The PEM keys of one `verify` config, for OCI artifacts. Nothing to clean up."""

    def __init__(self, spec: Verify):
        self.spec = spec
        _, _, pem = read_keys(spec.keys)
        if not pem:
            raise TrustError("verify.keys holds no PEM public key, and an OCI artifact is checked with cosign's key "
                             "pair: add the cosign.pub of `cosign generate-key-pair` to verify.keys")
        self.keys = load_keys(pem)

    def require_signed(self, artifact: oci.Artifact) -> None:
        """oci.pull's `check`: Refused unless a signature of the artifact passes (its
        layer is fetched only then)."""
        verdict = verify_signatures(artifact, self.keys)
        if not verdict.ok:
            raise Refused(verdict, Path(artifact.path))

    def check(self, directory: Path, last_applied: Baseline | str | None = None, *,
              allow_rollback: bool = False) -> Verdict:
        """The verdict on the artifact unpacked at `directory` (the store's `current`
        link, resolved once). TrustError when it is not an artifact of a store this process
        opened as the OCI source."""
        artifact = oci.source_artifact(directory)
        if artifact is None:
            raise TrustError(f"verify: {directory} is not an OCI artifact in nftrec's store (its metadata is "
                             "missing); fetch it again")
        signed = verify_signatures(artifact, self.keys)
        if not signed.ok:
            return signed
        created = created_at(artifact.created)
        signed = replace(signed, time=int(created.timestamp()) if created else None)  # what a baseline records
        why = rollback_refusal(artifact, last_applied)
        if not why:
            return signed
        if not (allow_rollback or self.spec.allow_rollback):
            return Verdict(signed.revision, False, "rollback", f"{why}; `nftrec apply --allow-rollback` applies it once",
                           signed.signer, signed.key)
        return replace(signed, message=f"{why}: a rollback", rollback_allowed=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> CosignVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
