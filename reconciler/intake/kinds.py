"""The kinds of manifest source, decided by the command line (an `oci://` argument) and the
node config (`verify` on a directory: a git checkout), never by what lies in the tree, and
the ManifestSource a command reads. Each kind has its verifier (verifier_for): cosign's for
an OCI artifact, git's for a checkout, none for a plain directory; only an OCI source's
tree, in nftrec's own store, is named after an artifact (oci.source_artifact).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reconciler.intake.cosign import CosignVerifier
from reconciler.intake.model import Verify
from reconciler.intake.signatures import TrustError, Verdict, Verifier, read_keys

GIT, OCI, DIRECTORY = "git checkout", "OCI artifact", "plain directory"


@dataclass(frozen=True)
class ManifestSource:
    """What a command reads: `argument` as given, the tree at `root`, `oci` when the
    argument is an `oci://` reference. `refused`: an OCI artifact whose signatures `verify`
    refused before its layer was fetched (nothing is at `root`)."""

    argument: str
    root: Path
    oci: bool = False
    refused: Verdict | None = None

    def kind(self, spec: Verify | None) -> str:
        return source_kind(self.oci, spec)

    def verifier(self, spec: Verify) -> Verifier | CosignVerifier:
        return verifier_for(spec, self.kind(spec))


def source_kind(oci_reference: bool, spec: Verify | None) -> str:
    """The kind of a source, from the command line and the node config alone: an `oci://`
    argument is an OCI artifact; a directory is a git checkout under `verify` (its commit
    is what is verified), else a plain directory."""
    return OCI if oci_reference else GIT if spec is not None else DIRECTORY


def verifier_for(spec: Verify, kind: str) -> Verifier | CosignVerifier:
    """The verifier of `verify` for a source of `kind` (source_kind): cosign's for an OCI
    artifact, git's for a checkout. A key of the other kind in verify.keys is a TrustError
    (a configuration error): PEM keys only for OCI, SSH and OpenPGP keys only for git. The
    disk is not looked at: a checkout that is not there yet is found when it is checked."""
    signers, pgp, pem = read_keys(spec.keys)
    if kind == OCI:
        verifier = CosignVerifier(spec)  # no PEM key: said first
        if signers or pgp:
            raise TrustError(f"verify.keys holds SSH or OpenPGP keys ({_files(spec, pem, keep=False)}), and this source "
                             "is an OCI artifact, checked with cosign's PEM public keys only: remove them")
        return verifier
    if kind != GIT:
        raise ValueError(f"a {kind} has no verifier")
    if pem:
        raise TrustError(f"verify.keys holds PEM public keys ({_files(spec, pem, keep=True)}: cosign's, for OCI "
                         "artifacts), and this source is a git checkout, whose commits are signed with SSH or "
                         "OpenPGP keys: remove them, or give an oci:// reference")
    return Verifier(spec)


def _files(spec: Verify, pem: list[tuple[str, bytes]], *, keep: bool) -> str:
    """The key files that are PEM (keep) or not (not keep), for a message."""
    names = {path for path, _ in pem}
    return ", ".join(p for p in spec.keys if (p in names) == keep)
