"""watch's gate for signed revisions: each new revision read is checked against the node
config's `verify` (intake.verifier_for: git's Verifier for a checkout, cosign's for an OCI
source; its keys read once per config) before it is compiled;
a refused one is handled as an invalid revision (reconcile.Daemon._take), counted in the
metrics by reason, and logged in one line naming the revision, the signer and the reason.
A git checkout is verified before it is read (`read`): what is parsed is then the
verified commit's files from the object store (Verdict.files), never the worktree's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.intake import (
    CosignVerifier, Intake, Inventory, Snapshot, TrustError, Verdict, Verifier, Verify, find_checkout, verifier_for,
)


class SignatureGate:
    def __init__(self, metrics=None, last_applied: Callable[[], str | None] = lambda: None):
        self.metrics = metrics
        self.last_applied = last_applied  # the revision a new one must not roll back from
        self.spec: Verify | None = None
        self.verifier: Verifier | CosignVerifier | None = None
        self.checked: tuple = (None, "", None)  # (resolved root, commit, refusal or None) `read` verified last

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
        self.spec, self.verifier, self.checked = spec, new, (None, "", None)
        return True

    @property
    def reads_commits(self) -> bool:
        """`verify` of a git checkout: `verified` gives the files to parse."""
        return isinstance(self.verifier, Verifier)

    def read(self, intake: Intake, changed: set[str] | None, *, again: bool) -> Snapshot | None:
        """The snapshot of the intake's directory. Without `verify` of a git checkout:
        intake.read(changed). With it: that of the verified commit's files (Intake.read_files;
        for a refused commit an empty one, which `refusal` refuses), or None when its commit
        is the one verified last (unless `again`: the worktree's files are never read, so
        nothing else can change). Not a checkout (yet): the worktree's, which `refusal` refuses."""
        if not self.reads_commits:
            return intake.read(changed)
        try:
            resolved = intake.path.resolve(strict=True)
        except (OSError, RuntimeError):
            resolved = None
        co = find_checkout(resolved) if resolved is not None and resolved.is_dir() else None
        if co is None:
            return intake.read(None)
        if not again and self.checked[:2] == (resolved, co.commit):
            return None
        verdict = self._check(intake.path, held=intake.holds)
        self.checked = (resolved, co.commit, verdict if isinstance(verdict, str) else None)
        if isinstance(verdict, str):
            return Snapshot(Inventory(), [], co.commit, "", 0, str(resolved))
        return intake.read_files(verdict.files, resolved)

    def refusal(self, snap: Snapshot) -> str | None:
        """None when `verify` is off or passes the revision the snapshot was read from;
        else the reason, already logged and counted. A snapshot of `read`'s: its verdict,
        not checked again."""
        if self.verifier is None:
            return None
        if self.reads_commits and snap.revision == self.checked[1]:
            return self.checked[2]
        checked = self._check(Path(snap.root))
        return checked if isinstance(checked, str) else None

    def _check(self, root: Path, held=None) -> Verdict | str:
        """The verdict when it passes, else the reason, logged and counted."""
        try:
            verdict = self.verifier.check(root, self.last_applied(), **({"held": held} if held is not None else {}))
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
