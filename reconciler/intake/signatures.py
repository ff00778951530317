"""Signed revisions: a git checkout's commit is applied only when a key of the node
config's `verify.keys` signed it (or, in Tag modes, an annotated tag of it), and (unless
rollback is allowed) it does not roll back from the last applied revision. What is then
parsed is the commit's own tree, read from the object store: never the worktree's files
(of a fleet root: its fleet.yaml, then the layers a node's projection names, gitobjects.layer_files).

`Verifier(spec)` reads the keys once (a TrustError when they cannot be used);
`check(directory, baseline)` gives a Verdict carrying the verified manifest files.
"""

# No git process: objects are read and hash-checked in-process (intake/gitobjects.py), and
# the signature of the payload dulwich extracts from the verified object is checked by
# intake/gitsign.py (ssh-keygen or gpgv, keys in a private directory, a clean environment).
# Rollback: where the history between the baseline and the commit is present, ancestry
# decides; where it is cut off (git-sync's `--depth 1` fetches, `git gc` pruning the last
# applied commit) a direct child passes, else the signed committer time must be newer than
# the baseline's.

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.intake.gitsign import TrustError
from reconciler.intake.gitobjects import Checkout, ManifestFiles, ObjectError, Store, commit_files, find_checkout, tag_refs
from reconciler.intake.model import Verify
from reconciler.intake.problems import show

_PGP = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_PEM = "-----BEGIN PUBLIC KEY-----"
_SSH_LINE = re.compile(r"(?:[a-z0-9-]+=\S+\s+)?((?:ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+)\s+([A-Za-z0-9+/=]+)(?:\s+(.*))?")


@dataclass(frozen=True)
class Baseline:
    """What a new revision must not roll back from: the last applied revision (a commit
    id, or an artifact's name) and its signed time (git: committer time, OCI: `created`;
    Unix seconds), None when no record holds it. `origin` names the record it came from
    (`commits` or `status`), for messages."""
    revision: str
    time: int | None = None
    origin: str = "status"


@dataclass(frozen=True)
class Verdict:
    revision: str
    ok: bool
    reason: str = ""  # a metric label: unsigned, unknown-key, bad-object, rollback, ...
    message: str = ""  # the sentence for logs and status (lastError)
    signer: str = ""  # principal or user id of a good signature, else ""
    key: str = ""  # its key's fingerprint
    rollback_allowed: bool = False  # not a descendant of the last applied, let through
    time: int | None = None  # the signed time (git: committer time, OCI: created), Unix seconds
    files: ManifestFiles | None = field(default=None, repr=False, compare=False)  # git: what to parse, verified

    def describe(self) -> str:
        """One line: which revision, who signed it, the outcome."""
        who = f"signed by {self.signer or '?'} (key {self.key})" if self.key else "no trusted signature"
        short = re.sub(r"([0-9a-f]{12})[0-9a-f]{28,}", r"\1", self.revision)  # commits, artifact digests
        if self.ok:
            said = self.message or "not a descendant of the last applied revision"
            extra = f"; {said}, allowed" if self.rollback_allowed else f"; {said}" if self.message else ""
            return f"revision {short} verified: {who}{extra}"
        return f"revision {short} refused ({self.reason}): {self.message}; {who}"


def read_keys(paths: tuple[str, ...]) -> tuple[list[str], list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """(allowed-signers lines, OpenPGP armored keys as (file, bytes), PEM public keys as
    (file, bytes): cosign's, for OCI artifacts) of the key files, each recognised by its
    content. TrustError for an unreadable, empty or unknown file."""
    signers: list[str] = []
    pgp: list[tuple[str, bytes]] = []
    pem: list[tuple[str, bytes]] = []
    for path in paths:
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise TrustError(f"verify.keys: cannot read {path} ({e.strerror}); check the path and its "
                             "permissions") from None
        text = raw.decode("utf-8", "replace")
        if _PGP in text:
            pgp.append((path, raw))
            continue
        if _PEM in text:
            pem.append((path, raw))
            continue
        if "PRIVATE KEY-----" in text:
            raise TrustError(f"verify.keys: {path} holds a private key; give the public key (cosign.pub, id_*.pub), "
                             "and keep the private key off the node")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if not lines:
            raise TrustError(f"verify.keys: {path} is empty; put SSH public keys (one per line) or an "
                             "OpenPGP armored public key in it")
        for n, line in enumerate(lines, 1):
            m = _SSH_LINE.fullmatch(line)
            if m is None:
                raise TrustError(f"verify.keys: {path} line {n} is neither an SSH public key nor an OpenPGP "
                                 "armored public key block nor a PEM public key")
            name = re.sub(r"[^A-Za-z0-9@._+-]", "_", (m.group(3) or "").split(" ")[0]) or f"{Path(path).name}-{n}"
            signers.append(f'{name} namespaces="git" {m.group(1)} {m.group(2)}')
    return signers, pgp, pem


class Verifier:
    """The trusted keys of one `verify` config (gitsign.Keys). close() removes them."""

    def __init__(self, spec: Verify):
        from reconciler.intake.gitsign import Keys

        self.spec = spec
        signers, pgp, pem = read_keys(spec.keys)
        if pem and not (signers or pgp):
            raise TrustError("verify.keys holds only PEM public keys (cosign's, for OCI artifacts), and this source is "
                             "a git checkout, whose commits are signed with SSH or OpenPGP keys: add those keys")
        self.keys = Keys(signers, pgp)
        self._trees: dict = {}  # parsed trees by id, for every check (gitobjects.Store)

    def close(self) -> None:
        self.keys.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self, directory: Path, last_applied: Baseline | str | None = None, *, allow_rollback: bool = False,
              held=None) -> Verdict:
        """The verdict on the commit checked out at `directory` (resolved once: git-sync's
        `current` link names one revision), with its manifest files below the directory
        (displayed under `directory` as given; `held(display, oid)`: blobs the caller holds,
        not read). TrustError when it is not a git checkout or the repository cannot be read."""
        co = checkout_of(directory)
        try:
            store = Store(co.common, self._trees)
        except ObjectError as e:
            raise TrustError(str(e)) from None
        with store:
            return self._check(store, co, directory, last_applied, allow_rollback, held)

    def _check(self, store: Store, co: Checkout, directory: Path, last_applied: Baseline | str | None,
               allow_rollback: bool, held) -> Verdict:
        try:
            commit = store.commit(co.commit)
        except ObjectError as e:
            return Verdict(co.commit, False, "bad-object", f"the commit cannot be read: {e}")
        verdict = self._signature(store, co, commit)
        if not verdict.ok:
            return verdict
        baseline = Baseline(last_applied) if isinstance(last_applied, str) else last_applied
        rule, passed = "", True
        if baseline is not None and baseline.revision != co.commit and _is_commit(baseline.revision):
            passed, rule = self._descent(store, co.commit, commit, baseline)
            if not passed:
                if not (allow_rollback or self.spec.allow_rollback):
                    return Verdict(co.commit, False, "rollback", f"{rule}; `nftrec apply --allow-rollback` applies it "
                                   "once", verdict.signer, verdict.key, time=commit.commit_time)
        try:
            files = commit_files(store, co.commit, co.sub, os.path.join(str(directory), ""), held)
        except ObjectError as e:
            return Verdict(co.commit, False, "bad-object", f"the commit's tree cannot be read: {e}", verdict.signer,
                           verdict.key, time=commit.commit_time)
        return Verdict(co.commit, True, message=rule, signer=verdict.signer, key=verdict.key,
                       rollback_allowed=not passed, time=commit.commit_time, files=files)

    def _signature(self, store: Store, co: Checkout, commit) -> Verdict:
        """The commit's own signature (modes HEAD, TagAndHEAD), and in Tag modes that of an
        annotated tag whose target is the commit."""
        from reconciler.intake.gitsign import check_signature

        mode = self.spec.mode
        if mode in ("Tag", "TagAndHEAD"):
            tagged = self._tag(store, co)
            if not tagged.ok or mode == "Tag":
                return tagged
        payload = commit.raw_without_sig() if commit.gpgsig else commit.as_raw_string()
        checked = check_signature(self.keys, payload, commit.gpgsig or None)
        if not checked.ok:
            return Verdict(co.commit, False, checked.reason, checked.message, checked.signer, checked.key)
        return Verdict(co.commit, True, signer=checked.signer, key=checked.key)

    def _tag(self, store: Store, co: Checkout) -> Verdict:
        """The first annotated tag of the commit whose signature verifies, else the refusal."""
        from reconciler.intake.gitsign import check_signature

        last = None
        for name, oid in sorted(tag_refs(co.common).items()):
            try:
                if store.kind(oid) != "tag":
                    continue  # a lightweight tag: no tag object to sign
                tag = store.tag(oid)
            except ObjectError:
                continue
            cls, target = tag.object
            if target.decode("ascii") != co.commit or cls.type_name != b"commit":
                continue
            payload = tag.raw_without_sig() if tag.signature else tag.as_raw_string()
            checked = check_signature(self.keys, payload, tag.signature or None)
            if checked.ok:
                return Verdict(co.commit, True, signer=checked.signer, key=checked.key)
            last = Verdict(co.commit, False, checked.reason, f"tag {show(name)} does not carry a signature of "
                           f"verify.keys ({checked.message})", key=checked.key)
        return last or Verdict(co.commit, False, "no-tag", f"verify.mode is {self.spec.mode} but no annotated tag "
                               "in the repository points at this commit")

    @staticmethod
    def _descent(store: Store, oid: str, commit, baseline: Baseline) -> tuple[bool, str]:
        """(passes, the rule that decided, as a sentence) for a commit other than the baseline."""
        last = baseline.revision[:12]
        found = store.descends(oid, baseline.revision)
        if found:
            return True, ""
        if found is False:
            return False, (f"it does not descend from the last applied revision {last} (the history between "
                           "them is present: a replayed older commit or a force-push)")
        cut = f"history not available (a shallow fetch or a pruned commit) between it and the last applied revision {last}"
        if baseline.revision.encode("ascii") in commit.parents:
            return True, f"{cut}; a direct child of it"
        then = baseline.time
        if then is None:
            try:
                then = store.commit(baseline.revision).commit_time
            except ObjectError:
                return False, (f"{cut}, and its time is not known (neither recorded in the state directory nor in "
                               "the repository)")
        if commit.commit_time > then:
            return True, f"{cut}; its signed committer time {_when(commit.commit_time)} is newer than {_when(then)}"
        return False, (f"{cut}, and its signed committer time {_when(commit.commit_time)} is not newer than the last "
                       f"applied revision's ({_when(then)}): an older commit fetched again?")


def _when(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def checkout_of(directory: Path) -> Checkout:
    """The checkout at `directory` (resolved: git-sync's `current` link names one
    revision, read once); TrustError when it is not a git checkout."""
    root = Path(directory).resolve()
    co = find_checkout(root) if root.is_dir() else None
    if co is None:
        raise TrustError(f"verify is set, but {directory} is not a git checkout (no .git with a commit "
                         "checked out) nor an OCI artifact; point nftrec at a git-sync worktree, a clone or an "
                         "oci:// reference, or remove verify")
    return co


def _is_commit(rev: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", rev) is not None
