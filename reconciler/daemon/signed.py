"""watch's gate for signed revisions: each new revision read is checked against the node
config's `verify` (intake.verifier_for: git's Verifier for a checkout, cosign's for an OCI
source; its keys read once per config) before it is compiled;
a refused one is handled as an invalid revision (reconcile.Daemon._take), counted in the
metrics by reason, and logged in one line naming the revision, the signer and the reason.
The verdict passed last is kept: the sync that applies its revision records its signed
time and trust (signed()).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.engine import judge, trust_of
from reconciler.intake import Baseline, CosignVerifier, TrustError, Verdict, Verifier, Verify, verifier_for


class SignatureGate:
    def __init__(self, metrics=None):
        self.metrics = metrics
        self.spec: Verify | None = None
        self.verifier: Verifier | CosignVerifier | None = None
        self.passed: tuple[Verdict, str | None] | None = None  # the last verdict passed, and its trust

    def configure(self, spec: Verify | None, directory: Path) -> bool:
        """Take the config's `verify` (None: no checks). False, logged, when it cannot be
        used: a key file, a directory that is neither a git checkout nor an OCI source, no key
        of the kind the source is signed with (the old one stays). The
        key files are read again each time (SIGHUP): a rotated key counts from then on."""
        try:  # git's verifier for a checkout, cosign's for an OCI source
            new = verifier_for(spec, directory) if spec is not None else None
        except TrustError as e:
            logs.log.error(f"configuration error: {e}")
            return False
        if self.verifier is not None:
            self.verifier.close()
        self.spec, self.verifier = spec, new
        return True

    def refusal(self, root: Path, baseline: Callable[[], Baseline | None]) -> str | None:
        """None when `verify` is off or passes the revision at `root` (`baseline()`: what
        it must not roll back from, commits.rollback_baseline); else the reason, already
        logged and counted."""
        if self.verifier is None:
            return None
        try:
            last = baseline()
            verdict = judge(self.verifier, root, last)
        except TrustError as e:
            message, reason, fields = f"configuration error: {e}", "configuration", {}
        else:
            if verdict.ok:
                if self.metrics is not None:
                    self.metrics.verified(verdict.signer, verdict.key)
                self.passed = verdict, trust_of(verdict, last)
                return None
            message, reason = verdict.describe(), verdict.reason
            fields = {"revision": verdict.revision, "signer": verdict.signer, "key": verdict.key}
        if self.metrics is not None:
            self.metrics.verification_failed(reason)
        logs.log.error(f"{message}; it was not applied and the last good ruleset stays in the kernel",
                       extra={"fields": {"event": "unverified", "reason": reason, **fields}})
        return message

    def signed(self, revision: str) -> tuple[int | None, str | None]:
        """(signed time, trust) of `revision` when it is the one passed last; else (None, None)."""
        if self.verifier is None or self.passed is None or self.passed[0].revision != revision:
            return None, None
        return self.passed[0].time, self.passed[1]
