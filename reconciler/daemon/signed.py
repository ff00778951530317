"""watch's gate for signed revisions: each new revision read is checked against the node
config's `verify` (intake.verifier_for: git's Verifier for a checkout, cosign's for an OCI
source; its keys read once per config) before it is compiled;
a refused one is handled as an invalid revision (reconcile.Daemon._take), counted in the
metrics by reason, and logged in one line naming the revision, the signer and the reason.
A git checkout is verified before it is read (`verified`): what is parsed is then the
verified commit's files from the object store (Verdict.files), never the worktree's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.intake import CosignVerifier, TrustError, Verdict, Verifier, Verify, verifier_for


class SignatureGate:
    def __init__(self, metrics=None):
        self.metrics = metrics
        self.spec: Verify | None = None
        self.verifier: Verifier | CosignVerifier | None = None

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

    @property
    def reads_commits(self) -> bool:
        """`verify` of a git checkout: `verified` gives the files to parse."""
        return isinstance(self.verifier, Verifier)

    def verified(self, root: Path, last_applied: Callable[[], str | None], held=None) -> Verdict | str:
        """The verdict on the git checkout at `root` when it passes (its `files` are what to
        parse; `held`: Verifier.check's), else the reason, already logged and counted."""
        return self._check(root, last_applied, held)

    def refusal(self, root: Path, last_applied: Callable[[], str | None]) -> str | None:
        """None when `verify` is off or passes the revision at `root` (`last_applied()`:
        the revision it must descend from); else the reason, already logged and counted."""
        if self.verifier is None:
            return None
        checked = self._check(root, last_applied)
        return checked if isinstance(checked, str) else None

    def _check(self, root: Path, last_applied: Callable[[], str | None], held=None) -> Verdict | str:
        try:
            verdict = self.verifier.check(root, last_applied(), **({"held": held} if held is not None else {}))
        except TrustError as e:
            message, reason, fields = f"configuration error: {e}", "configuration", {}
        else:
            if verdict.ok:
                if self.metrics is not None:
                    self.metrics.verified(verdict.signer, verdict.key)
                if verdict.rollback_allowed:
                    logs.log.warning(verdict.describe())
                elif verdict.message:  # which rollback rule let it through (history cut off)
                    logs.log.info(verdict.describe())
                return verdict
            message, reason = verdict.describe(), verdict.reason
            fields = {"revision": verdict.revision, "signer": verdict.signer, "key": verdict.key}
        if self.metrics is not None:
            self.metrics.verification_failed(reason)
        logs.log.error(f"{message}; it was not applied and the last good ruleset stays in the kernel",
                       extra={"fields": {"event": "unverified", "reason": reason, **fields}})
        return message
