"""watch's gate for signed revisions: each new revision is checked against the node
config's `verify` (git's Verifier or cosign's, by the source kind the command line gave;
its keys read once per config) before it is compiled. A git checkout is verified before it
is read (`read`): what is parsed is the verified commit's files from the object store
(Verdict.files), never the worktree's. A refused revision is handled as an invalid one
(reconcile.Daemon._take), counted by reason and logged in one line naming the revision,
the signer and the reason; so is an OCI artifact refused before its layer was fetched.
The verdict passed last is kept: the sync that applies it records its time and trust.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.engine import judge, trust_of
from reconciler.intake import (
    Baseline, CosignVerifier, Intake, Inventory, Snapshot, TrustError, Verdict, Verifier, Verify, find_checkout,
    source_kind, verifier_for,
)


class SignatureGate:
    def __init__(self, metrics=None, baseline: Callable[[], Baseline | None] = lambda: None):
        self.metrics = metrics
        self.baseline = baseline  # what a new revision must not roll back from (commits.rollback_baseline)
        self.spec: Verify | None = None
        self.verifier: Verifier | CosignVerifier | None = None
        self.oci = False  # the source is an oci:// reference (main sets it), else a directory
        self.checked: tuple = (None, "", None)  # (resolved root, commit, refusal or None) `read` verified last
        self.passed: tuple[Verdict, str | None] | None = None  # the last verdict passed, and its trust
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
        self.spec, self.verifier, self.checked = spec, new, (None, "", None)
        return True

    @property
    def reads_commits(self) -> bool:
        """`verify` of a git checkout: `read` gives the verified commit's files."""
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

    def signed(self, revision: str) -> tuple[int | None, str | None]:
        """(signed time, trust) of `revision` when it is the one passed last; else (None, None)."""
        if self.verifier is None or self.passed is None or self.passed[0].revision != revision:
            return None, None
        return self.passed[0].time, self.passed[1]

    def _check(self, root: Path, held=None) -> Verdict | str:
        """The verdict when it passes (kept in `passed`), else the reason, logged and counted."""
        try:
            last = self.baseline()
            verdict = judge(self.verifier, root, last, held=held)
        except TrustError as e:
            return self._refused(f"configuration error: {e}", "configuration", {})
        if not verdict.ok:
            return self.report(verdict)
        if self.metrics is not None:
            self.metrics.verified(verdict.signer, verdict.key)
        self.passed = verdict, trust_of(verdict, last)
        return verdict

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
