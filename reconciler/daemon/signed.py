"""watch's gate for signed revisions: each new revision read is checked against the node
config's `verify` (intake.verifier_for: git's Verifier for a checkout, cosign's for an OCI
source, by the kind the command line gave; its keys read once per config) before it is
compiled; a refused one is handled as an invalid revision (reconcile.Daemon._take), counted
in the metrics by reason, and logged in one line naming the revision, the signer and the
reason. An OCI artifact refused before its layer was fetched is reported here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.intake import CosignVerifier, TrustError, Verdict, Verifier, Verify, source_kind, verifier_for


class SignatureGate:
    def __init__(self, metrics=None):
        self.metrics = metrics
        self.spec: Verify | None = None
        self.verifier: Verifier | CosignVerifier | None = None
        self.oci = False  # the source is an oci:// reference (main sets it), else a directory
        self._unfetched: tuple[str, str] | None = None  # (revision, message): refused before its layer

    def configure(self, spec: Verify | None) -> bool:
        """Take the config's `verify` (None: no checks) for the source, an OCI reference
        (`oci`) or a directory (then a git checkout). False, logged, when it cannot be used:
        a key file, a key of the wrong kind for the source (the old one stays). The disk is
        not read: a checkout that is not there yet is checked once it is. The key files are
        read again each time (SIGHUP): a rotated key counts from then on."""
        try:
            new = verifier_for(spec, source_kind(self.oci, spec)) if spec is not None else None
        except TrustError as e:
            logs.log.error(f"configuration error: {e}")
            return False
        if self.verifier is not None:
            self.verifier.close()
        self.spec, self.verifier = spec, new
        return True

    def refusal(self, root: Path, last_applied: Callable[[], str | None]) -> str | None:
        """None when `verify` is off or passes the revision at `root` (`last_applied()`:
        the revision it must descend from); else the reason, already logged and counted."""
        if self.verifier is None:
            return None
        try:
            verdict = self.verifier.check(root, last_applied())
        except TrustError as e:
            return self._refused(f"configuration error: {e}", "configuration", {})
        if verdict.ok:
            if self.metrics is not None:
                self.metrics.verified(verdict.signer, verdict.key)
            if verdict.rollback_allowed:
                logs.log.warning(verdict.describe())
            return None
        return self.report(verdict)

    def report(self, verdict: Verdict) -> str:
        """Log and count a refused verdict; its message."""
        return self._refused(verdict.describe(), verdict.reason,
                             {"revision": verdict.revision, "signer": verdict.signer, "key": verdict.key})

    def refused_unfetched(self, verdict: Verdict) -> None:
        """The fetcher refused an artifact before fetching its layer (on its thread): logged
        and counted now; take_unfetched() hands it to the next sync, which records it."""
        self._unfetched = (verdict.revision, self.report(verdict))

    def take_unfetched(self) -> tuple[str, str] | None:
        unfetched, self._unfetched = self._unfetched, None
        return unfetched

    def _refused(self, message: str, reason: str, fields: dict) -> str:
        if self.metrics is not None:
            self.metrics.verification_failed(reason)
        logs.log.error(f"{message}; it was not applied and the last good ruleset stays in the kernel",
                       extra={"fields": {"event": "unverified", "reason": reason, **fields}})
        return message
