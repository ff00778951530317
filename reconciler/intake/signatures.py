"""Signed revisions: a git checkout's commit is applied only when a key of the node
config's `verify.keys` signed it, its files are exactly the commit's, and (unless rollback
is allowed) it descends from the last applied commit.

`Verifier(spec)` reads the keys once (a TrustError when they cannot be used) into a private
directory: an SSH allowed-signers file, and a GNUPGHOME holding only the given OpenPGP keys
with their trust pinned, so that only they count. `check(directory, ...)` gives a Verdict,
from one git process (`git log`: signature, tree, tags, and whether the commit descends
from the last applied one); a second `git log` only to let a rollback through.
"""

# git decides, nftrec reads its verdict: `git log -1 --format=%G?...` with the allowed
# signers and the private GNUPGHOME, `%G?` "G" (good, from a trusted key) being the only
# pass; "U" (good, untrusted), "X"/"Y" (expired), "R" (revoked), "B" (bad), "E" (cannot
# check) and "N" (none) refuse. The same `git log` gives the commit's tree (%T) and in
# Tag modes its tags (%D, each then checked by `git verify-tag`). The
# checkout's index, read here, must describe that tree and the files under the directory
# must be the index's (intake.git.worktree_change); `git status` decides instead when the
# index has what nftrec does not read (split, sparse, unmerged, ...), and names the file
# when the index is not the commit's. Descent: the log walks `LAST..COMMIT` with
# --ancestry-path, which shows the commit only when LAST is one of its ancestors.

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from reconciler.intake.git import GIT_TIMEOUT, find_checkout, index_tree, read_index, worktree_change
from reconciler.intake.gitsign import TrustError
from reconciler.intake.load import SUFFIXES
from reconciler.intake.model import Verify
from reconciler.intake.problems import show

_PGP = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_PEM = "-----BEGIN PUBLIC KEY-----"
_SSH_LINE = re.compile(r"(?:[a-z0-9-]+=\S+\s+)?((?:ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+)\s+([A-Za-z0-9+/=]+)(?:\s+(.*))?")
_STATUS = {  # git's %G? -> (reason, sentence)
    "N": ("unsigned", "the commit is not signed"),
    "B": ("bad-signature", "the signature does not verify (the commit was changed after signing)"),
    "U": ("untrusted-key", "the signature is good but its key is not one of verify.keys"),
    "X": ("expired-signature", "the signature has expired"),
    "Y": ("expired-key", "the signing key has expired"),
    "R": ("revoked-key", "the signing key is revoked"),
    "E": ("unknown-key", "the signing key is not one of verify.keys"),
}


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
    reason: str = ""  # a metric label: unsigned, unknown-key, modified-file, rollback, ...
    message: str = ""  # the sentence for logs and status (lastError)
    signer: str = ""  # principal or user id of a good signature, else ""
    key: str = ""  # its key's fingerprint
    rollback_allowed: bool = False  # not a descendant of the last applied, let through
    time: int | None = None  # the signed time (git: committer time, OCI: created), Unix seconds

    def describe(self) -> str:
        """One line: which revision, who signed it, the outcome."""
        who = f"signed by {self.signer or '?'} (key {self.key})" if self.key else "no trusted signature"
        short = re.sub(r"([0-9a-f]{12})[0-9a-f]{28,}", r"\1", self.revision)  # commits, artifact digests
        if self.ok:
            said = self.message or "not a descendant of the last applied revision"
            extra = f"; {said}, allowed" if self.rollback_allowed else ""
            return f"revision {short} verified: {who}{extra}"
        return f"revision {short} refused ({self.reason}): {self.message}; {who}"


class _Started:
    """A process started now, its result taken later: a check's git processes run side by side."""

    def __init__(self, argv: list[str], env: dict, stdin: bytes | None = None):
        self.argv, self.stdin = argv, stdin
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except FileNotFoundError:
            raise TrustError(f"{argv[0]} is not installed (or not on PATH); `verify` needs it") from None

    def result(self) -> subprocess.CompletedProcess:
        try:
            out, err = self.proc.communicate(self.stdin, timeout=GIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise TrustError(f"`{' '.join(self.argv[:3])}` took longer than {GIT_TIMEOUT:.0f} s") from None
        return subprocess.CompletedProcess(self.argv, self.proc.returncode, out, err)


def _run(argv: list[str], env: dict, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return _Started(argv, env, stdin).result()


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
    """The trusted keys of one `verify` config, ready for git. close() removes them."""

    def __init__(self, spec: Verify):
        self.spec = spec
        signers, pgp, pem = read_keys(spec.keys)
        if pem and not (signers or pgp):
            raise TrustError("verify.keys holds only PEM public keys (cosign's, for OCI artifacts), and this source is "
                             "a git checkout, whose commits are signed with SSH or OpenPGP keys: add those keys")
        if signers and git_version() < (2, 34):
            raise TrustError("verify.keys holds SSH keys, and git verifies SSH signatures from version 2.34 "
                             f"on; this git is {'.'.join(map(str, git_version()))}: install a newer git or use "
                             "OpenPGP keys")
        self.home = Path(tempfile.mkdtemp(prefix="nftrec-trust-"))
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.home), True)  # at exit too
        try:
            (self.home / "allowed_signers").write_text("".join(s + "\n" for s in signers))
            self.gnupg = self.home / "gnupg"
            self.gnupg.mkdir(mode=0o700)
            if pgp:
                self._import(pgp)
        except BaseException:
            self.close()
            raise

    def _import(self, keys: list[tuple[str, bytes]]) -> None:
        env = dict(os.environ, GNUPGHOME=str(self.gnupg), LC_ALL="C")
        gpg = ["gpg", "--batch", "--no-tty", "--quiet"]
        for path, raw in keys:
            done = _run([*gpg, "--import"], env, raw)
            if done.returncode != 0:
                said = done.stderr.decode("utf-8", "replace").strip().splitlines()
                raise TrustError(f"verify.keys: gpg cannot import {path}: {said[-1] if said else 'exit %d' % done.returncode}")
        listed = _run([*gpg, "--with-colons", "--list-keys"], env).stdout.decode()
        fprs, want = [], False
        for line in listed.splitlines():  # the primary key's fingerprint follows its "pub" line
            fields = line.split(":")
            if fields[0] == "pub":
                want = True
            elif fields[0] == "fpr" and want:
                fprs.append(fields[9])
                want = False
        # pinned trust: these keys, and only they, are valid signers (ownertrust 6: ultimate)
        _run([*gpg, "--import-ownertrust"], env, "".join(f"{f}:6:\n" for f in fprs).encode())
        _run([*gpg, "--check-trustdb"], env)

    def close(self) -> None:
        self._remove()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _git(self, top: Path, common: Path, *args: str) -> subprocess.CompletedProcess:
        return self._start(top, common, *args).result()

    def _start(self, top: Path, common: Path, *args: str) -> _Started:
        env = dict(os.environ, LC_ALL="C", GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GNUPGHOME=str(self.gnupg))
        return _Started(["git", "-c", f"safe.directory={top}", "-c", f"safe.directory={common}",
                     "-c", f"gpg.ssh.allowedSignersFile={self.home / 'allowed_signers'}", "-c", "gpg.minTrustLevel=fully",
                     "-C", str(top), *args], env)

    def check(self, directory: Path, last_applied: str | None = None, *, allow_rollback: bool = False) -> Verdict:
        """The verdict on the commit checked out at `directory` (resolved: git-sync's
        `current` link names one revision). TrustError when it is not a git checkout."""
        top, gitdir, commit, sub = checkout_of(directory)
        common = gitdir
        if (gitdir / "commondir").is_file():  # a linked worktree: git-sync's
            common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
        moved = bool(last_applied) and last_applied != commit and _is_commit(last_applied)
        # a new revision: the same log walks from the last applied commit (--ancestry-path,
        # topo order: the commit comes first), so that nothing shown means "not a descendant"
        log = self._log(top, common, commit, last_applied if moved else None)
        # while git checks the signature: the tree the index describes, the files against it
        index = read_index(gitdir / "index")
        tree = index_tree(index) if index is not None else None
        status = self._status(top, common, sub) if tree is None else None  # an index read by git only
        try:
            changed = worktree_change(top, index, "" if sub == "." else sub + "/") if tree is not None else None
        finally:
            try:
                done = log.result()
            finally:
                by_git = status.result() if status is not None else None
        descends = done.returncode == 0 and done.stdout.strip() != b""
        if moved and not descends:  # an older commit, another history, or one git does not know
            if not (allow_rollback or self.spec.allow_rollback):
                return Verdict(commit, False, "rollback",
                               f"it does not descend from the last applied revision {last_applied[:12]} (a "
                               "replayed older commit or a force-push); `nftrec apply --allow-rollback` applies "
                               "it once")
            done = self._log(top, common, commit, None).result()
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise TrustError(f"git cannot read commit {commit[:12]} in {top}: {said[0] if said else done.returncode}")
        fields = (done.stdout.decode("utf-8", "surrogateescape").split("\n", 1)[0].split("\0") + [""] * 7)[:7]
        if fields[6] != commit:
            raise TrustError(f"git log showed {fields[6][:12] or 'nothing'} for commit {commit[:12]} in {top}")
        signed = self._signature(top, common, commit, fields)
        if not signed.ok:
            return signed
        if by_git is not None:
            changed = _changed_files(by_git, top, sub)
        elif tree != fields[4]:  # staged changes, or an index made by hand: git names the file
            changed = _changed_files(self._status(top, common, sub).result(), top, sub) or (
                "modified-file", f"the index of {top} does not describe the signed commit's tree")
        elif changed is not None:
            reason, path = changed
            changed = reason, (f"{show(path)} differs from the signed commit" if reason == "modified-file" else
                               f"{show(path)} is a manifest file that git does not track")
        if changed:
            return Verdict(commit, False, *changed, signer=signed.signer, key=signed.key)
        if moved and not descends:
            return Verdict(commit, True, signer=signed.signer, key=signed.key, rollback_allowed=True)
        return signed

    def _log(self, top: Path, common: Path, commit: str, since: str | None) -> _Started:
        """`git log` of `commit`: its signature (%G?, not in Tag mode), tree, tags
        (%D, Tag modes) and id. With `since`, only when `commit` descends from it."""
        mode = self.spec.mode
        signature = "%G?%x00%GK%x00%GS%x00%GF" if mode != "Tag" else "%x00%x00%x00"
        tags = ["--decorate-refs=refs/tags/"] if mode != "HEAD" else []  # %D: its tags
        walk = ["--ancestry-path", "--topo-order", f"{since}..{commit}"] if since else [commit]
        return self._start(top, common, "log", "-1", "--no-show-signature", *tags,
                           f"--format={signature}%x00%T%x00{'%D' if tags else ''}%x00%H", *walk, "--")

    def _status(self, top: Path, common: Path, sub: str) -> _Started:
        return self._start(top, common, "status", "--porcelain=v1", "-z", "--untracked-files=all",
                           "--ignored=matching", "--no-renames", "--", sub)

    def _signature(self, top: Path, common: Path, commit: str, fields: list[str]) -> Verdict:
        """The verdict of `git log`'s %G? fields, and in Tag modes of the tags in %D."""
        mode = self.spec.mode
        if mode in ("Tag", "TagAndHEAD"):
            names = sorted(d[5:] for d in fields[5].split(", ") if d.startswith("tag: "))
            tagged = self._tag(top, common, commit, names)
            if not tagged.ok or mode == "Tag":
                return tagged
        status, key, signer, fpr = fields[:4]
        signer, key = _clean(signer), fpr or key
        if status == "G":
            return Verdict(commit, True, signer=signer, key=key)
        reason, sentence = _STATUS.get(status, ("bad-signature", f"git says {status!r} about the signature"))
        return Verdict(commit, False, reason, sentence, signer if status != "E" else "", key)

    def _tag(self, top: Path, common: Path, commit: str, tags: list[str]) -> Verdict:
        """The first of the tags on `commit` whose signature verifies, else the refusal."""
        last = None
        for tag in tags:
            v = self._git(top, common, "verify-tag", "--raw", f"refs/tags/{tag}")
            said = v.stderr.decode("utf-8", "replace")
            if "cannot verify a non-tag object" in said:
                continue  # a lightweight tag: no tag object to sign
            m = re.search(r"VALIDSIG ([0-9A-F]+)|key (SHA256:\S+)", said)
            key = next((g for g in m.groups() if g), "") if m else ""
            who = re.search(r"GOODSIG \S+ (.*)|Good \"git\" signature for (\S+)", said)
            if v.returncode == 0 and who is not None and "TRUST_UNDEFINED" not in said and "TRUST_NEVER" not in said:
                return Verdict(commit, True, signer=_clean(next((g for g in who.groups() if g), "")) if who else "",
                               key=key or "?")
            reason = ("unsigned" if "no signature found" in said else
                      "unknown-key" if "NO_PUBKEY" in said or "No principal" in said else "bad-signature")
            last = Verdict(commit, False, reason, f"tag {show(tag)} does not carry a signature of verify.keys", key=key)
        return last or Verdict(commit, False, "no-tag", "verify.mode is Tag but no annotated tag points at this commit")



def _changed_files(done: subprocess.CompletedProcess, top: Path, sub: str) -> tuple[str, str] | None:
    """(reason, sentence) when `git status` of `sub` shows a file that is not the
    commit's: a tracked file changed, or a manifest file git does not track (ignored
    ones too)."""
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise TrustError(f"git status failed in {top}: {said[0] if said else done.returncode}")
    for item in done.stdout.split(b"\0"):
        if len(item) < 4:
            continue
        code, path = item[:2].decode(), item[3:].decode("utf-8", "surrogateescape")
        rel = path[len(sub) + 1:] if sub != "." and path.startswith(sub + "/") else path
        if any(part.startswith(".") for part in rel.split("/")):
            continue  # never read (.git, git-sync's .tmp-*)
        if code in ("??", "!!"):
            if path.endswith(SUFFIXES):
                return "untracked-file", f"{show(path)} is a manifest file that git does not track"
        else:
            return "modified-file", f"{show(path)} differs from the signed commit"
    return None


@functools.lru_cache(maxsize=None)
def git_version() -> tuple[int, ...]:
    """git's version, as (major, minor); (0, 0) when it cannot tell. Asked once per
    process: not one more git process per revision."""
    try:
        out = subprocess.run(["git", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def checkout_of(directory: Path) -> tuple[Path, Path, str, str]:
    """intake.git's view of the checkout at `directory` (resolved: git-sync's `current`
    link names one revision, read once); TrustError when it is not a git checkout."""
    root = Path(directory).resolve()
    co = find_checkout(root) if root.is_dir() else None
    if co is None:
        raise TrustError(f"verify is set, but {directory} is not a git checkout (no .git with a commit "
                         "checked out) nor an OCI artifact; point nftrec at a git-sync worktree, a clone or an "
                         "oci:// reference, or remove verify")
    return co


def _is_commit(rev: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", rev) is not None


def _clean(text: str) -> str:
    """A signer's name as one printable line (it comes from a key's user id)."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)[:200]
