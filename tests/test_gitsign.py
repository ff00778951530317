"""A signature over a git payload, checked by ssh-keygen or gpgv with nftrec's own keys.

Real keys (ssh-keygen, gpg --batch), real signed commits and tags made by git, split into
payload and signature the way git does (`git cat-file`: the commit without its gpgsig
header, the tag message before its signature), and the attacks a repository's writer has:
a changed payload, an unknown, expired or revoked key, another namespace, a signed message
passed off as a signature, programs of their own on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.intake.gitsign import Checked, Keys, TrustError, check_signature
from reconciler.intake.signatures import read_keys
from test_verify_signed import git, git_version, gpg_key, needs_gpg, needs_ssh, ssh_key

PAST = ("--faked-system-time", "20190101T000000!")  # a key made in the past, to expire in the past


def gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
                           *args], input=stdin, check=True, capture_output=True, timeout=120).stdout


def keys_of(*files: Path) -> Keys:
    signers, pgp, _ = read_keys(tuple(str(f) for f in files))
    return Keys(signers, pgp)


class Repo:
    """A repository whose commits and tags are signed with `key` (an SSH private key file,
    or an OpenPGP fingerprint in GNUPGHOME `home`), and split again into payload and signature.
    A git older than 2.34 cannot sign with SSH: ssh-keygen signs the payload the way git
    does, and the signed object is written with `git hash-object`."""

    def __init__(self, root: Path, key: str, home: Path | None = None):
        self.root, self.key, self.env = root, key, {"GNUPGHOME": str(home)} if home else {}
        self.by_hand = home is None and git_version() < (2, 34)
        root.mkdir()
        git(root, "init", "-q")
        if not self.by_hand:
            git(root, "config", "gpg.format", "openpgp" if home else "ssh")
            git(root, "config", "user.signingkey", key)

    def commit(self, text: str, *, sign: bool = True) -> str:
        (self.root / "web.yaml").write_text(text)
        git(self.root, "add", "-A")
        by_git = sign and not self.by_hand
        git(self.root, "commit", "-q", "-m", text, *(["-S"] if by_git else []), env=self.env)
        if sign and self.by_hand:
            head, sep, message = self._object("commit", "HEAD").partition(b"\n\n")
            sig = self._ssh_sign(head + sep + message).rstrip(b"\n").replace(b"\n", b"\n ")
            git(self.root, "update-ref", "HEAD", self._write("commit", head + b"\ngpgsig " + sig + sep + message))
        return git(self.root, "rev-parse", "HEAD")

    def tag(self, name: str, *, sign: bool = True) -> str:
        by_git = sign and not self.by_hand
        git(self.root, "tag", "-s" if by_git else "-a", "-m", f"release {name}", name, env=self.env)
        if sign and self.by_hand:
            raw = self._object("tag", name)
            git(self.root, "update-ref", f"refs/tags/{name}", self._write("tag", raw + self._ssh_sign(raw)))
        return name

    def _object(self, kind: str, rev: str) -> bytes:
        return subprocess.run(["git", "-C", str(self.root), "cat-file", kind, rev], check=True,
                              capture_output=True).stdout

    def _write(self, kind: str, raw: bytes) -> str:
        return subprocess.run(["git", "-C", str(self.root), "hash-object", "-t", kind, "-w", "--stdin"], input=raw,
                              check=True, capture_output=True, text=False).stdout.decode().strip()

    def _ssh_sign(self, payload: bytes) -> bytes:
        return subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", self.key, "-n", "git"], input=payload,
                              check=True, capture_output=True).stdout

    def split_commit(self, rev: str) -> tuple[bytes, bytes | None]:
        """(payload, signature): the commit object without its gpgsig header, and that header's value."""
        raw = self._object("commit", rev)
        head, sep, message = raw.partition(b"\n\n")
        kept, sig, in_sig = [], [], False
        for line in head.split(b"\n"):
            in_sig = line.startswith(b"gpgsig ") or (in_sig and line.startswith(b" "))
            if in_sig:
                sig.append(line[7:] if line.startswith(b"gpgsig ") else line[1:])
            else:
                kept.append(line)
        return b"\n".join(kept) + sep + message, (b"\n".join(sig) + b"\n") if sig else None

    def split_tag(self, name: str) -> tuple[bytes, bytes | None]:
        """(payload, signature): the tag object up to its signature block, and the block."""
        raw = self._object("tag", name)
        m = re.search(rb"-----BEGIN (PGP|SSH) SIGNATURE-----", raw)
        return (raw[:m.start()], raw[m.start():]) if m else (raw, None)


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True, text=True).stdout.split()[1]


def changed(payload: bytes) -> bytes:
    """The payload naming another tree (a commit) or object (a tag): what a writer who
    cannot sign would change."""
    first = re.match(rb"(tree|object) ([0-9a-f]{40})\n", payload)
    assert first is not None, payload
    return payload.replace(first.group(2), first.group(2)[::-1], 1)


@needs_ssh
@pytest.mark.parametrize("kind", ["ed25519", "ecdsa"])
def test_ssh_signed_commit_and_tag(tmp_path, kind):
    ops = ssh_key(tmp_path / "keys", "ops", kind)
    other = ssh_key(tmp_path / "keys", "other", kind)
    repo = Repo(tmp_path / "repo", str(ops))
    sha = repo.commit("ip: 10.96.0.10\n")
    tag = repo.tag("v1")
    key = fingerprint(Path(f"{ops}.pub"))
    with keys_of(Path(f"{ops}.pub")) as keys:
        for payload, sig in (repo.split_commit(sha), repo.split_tag(tag)):
            assert sig is not None and sig.startswith(b"-----BEGIN SSH SIGNATURE-----")
            assert check_signature(keys, payload, sig) == Checked(True, "", "", "ops@example", key)
            bad = check_signature(keys, changed(payload), sig)
            assert (bad.ok, bad.reason, bad.signer, bad.key) == (False, "bad-signature", "ops@example", key)
    with keys_of(Path(f"{other}.pub")) as keys:
        unknown = check_signature(keys, *repo.split_commit(sha))
        assert (unknown.ok, unknown.reason, unknown.signer, unknown.key) == (False, "unknown-key", "", key)


@needs_gpg
@pytest.mark.parametrize("algo", ["ed25519", "rsa3072"])
def test_openpgp_signed_commit_and_tag(tmp_path, algo):
    asc, fpr = gpg_key(tmp_path / "gpg-ops", "ops", algo)
    other, _ = gpg_key(tmp_path / "gpg-other", "other", algo)
    repo = Repo(tmp_path / "repo", fpr, tmp_path / "gpg-ops")
    sha = repo.commit("ip: 10.96.0.10\n")
    tag = repo.tag("v1")
    with keys_of(asc) as keys:
        for payload, sig in (repo.split_commit(sha), repo.split_tag(tag)):
            assert sig is not None and sig.startswith(b"-----BEGIN PGP SIGNATURE-----")
            assert check_signature(keys, payload, sig) == Checked(True, "", "", "ops <ops@example>", fpr)
            bad = check_signature(keys, changed(payload), sig)
            assert (bad.ok, bad.reason, bad.signer, bad.key) == (False, "bad-signature", "ops <ops@example>", fpr)
    with keys_of(other) as keys:
        unknown = check_signature(keys, *repo.split_commit(sha))
        assert (unknown.ok, unknown.reason) == (False, "unknown-key"), unknown
        assert unknown.key == fpr[-16:]  # the signature names its key; the keyring does not hold it


@needs_gpg
@pytest.mark.parametrize("case", ["expired-key", "expired-signature", "revoked-key"])
def test_openpgp_key_or_signature_no_longer_valid(tmp_path, case):
    home = tmp_path / "gpg"
    _, fpr = gpg_key(home, "ops", "ed25519", "never", *PAST)
    repo = Repo(tmp_path / "repo", fpr, home)
    if case == "expired-signature":  # made in the past, valid for one day
        (home / "gpg.conf").write_text("faked-system-time 20190201T000000!\ndefault-sig-expire 1d\n")
    sha = repo.commit("ip: 10.96.0.10\n")
    tag = repo.tag("v1")
    if case == "expired-key":  # after signing: a self-signature of the past that ends the key's life
        gpg(home, "--faked-system-time", "20190601T000000!", "--quick-set-expire", fpr, "1d")
    if case == "revoked-key":  # the revocation certificate gpg made with the key
        cert = (home / "openpgp-revocs.d" / f"{fpr}.rev").read_bytes().replace(b":-----BEGIN", b"-----BEGIN")
        gpg(home, "--import", stdin=cert)
    asc = tmp_path / "ops.asc"
    asc.write_bytes(gpg(home, "--armor", "--export", fpr))
    with keys_of(asc) as keys:
        for payload, sig in (repo.split_commit(sha), repo.split_tag(tag)):
            got = check_signature(keys, payload, sig)
            assert (got.ok, got.reason, got.signer, got.key) == (False, case, "ops <ops@example>", fpr), got


@needs_ssh
@needs_gpg
def test_unsigned_commit_and_tag(tmp_path):
    ops = ssh_key(tmp_path / "keys", "ops")
    asc, fpr = gpg_key(tmp_path / "gpg", "ops")
    repo = Repo(tmp_path / "repo", fpr, tmp_path / "gpg")
    sha = repo.commit("ip: 10.96.0.10\n", sign=False)
    tag = repo.tag("v1", sign=False)
    with keys_of(Path(f"{ops}.pub"), asc) as keys:
        for payload, sig in (repo.split_commit(sha), repo.split_tag(tag)):
            assert sig is None
            assert check_signature(keys, payload, sig) == Checked(False, "unsigned", "it is not signed")
        assert check_signature(keys, b"x", b"\n").reason == "unsigned"


@needs_ssh
@needs_gpg
def test_a_signature_no_key_of_its_kind_can_have_made(tmp_path):
    """An SSH signature with only OpenPGP keys trusted, the other way round, and an X.509
    one: unknown-key, and no program runs for a kind that has no keys."""
    ops = ssh_key(tmp_path / "keys", "ops")
    asc, fpr = gpg_key(tmp_path / "gpg", "ops")
    payload = b"tree 0\n\nmessage\n"
    (tmp_path / "payload").write_bytes(payload)
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(ops), "-n", "git", str(tmp_path / "payload")],
                   check=True, capture_output=True)
    ssh_sig = (tmp_path / "payload.sig").read_bytes()
    pgp_sig = gpg(tmp_path / "gpg", "--armor", "--detach-sign", "-u", fpr, stdin=payload)
    with keys_of(asc) as keys:
        assert check_signature(keys, payload, pgp_sig).ok
        assert check_signature(keys, payload, ssh_sig).reason == "unknown-key"
    with keys_of(Path(f"{ops}.pub")) as keys:
        assert check_signature(keys, payload, ssh_sig).ok
        assert check_signature(keys, payload, pgp_sig).reason == "unknown-key"
        x509 = b"-----BEGIN SIGNED MESSAGE-----\nMIAGCSqGSIb3DQEHAqCAMIACAQE=\n-----END SIGNED MESSAGE-----\n"
        assert check_signature(keys, payload, x509).reason == "unknown-key"


@needs_ssh
def test_an_ssh_signature_of_another_namespace_or_damaged(tmp_path):
    """A trusted key's signature made for another purpose (`ssh-keygen -Y sign -n file`)
    does not sign a commit; a damaged armor is a bad signature, not an error."""
    ops = ssh_key(tmp_path / "keys", "ops")
    payload = tmp_path / "payload"
    payload.write_bytes(b"tree 0\n\nmessage\n")
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(ops), "-n", "file", str(payload)], check=True,
                   capture_output=True)
    sig = (tmp_path / "payload.sig").read_bytes()
    with keys_of(Path(f"{ops}.pub")) as keys:
        other = check_signature(keys, payload.read_bytes(), sig)
        assert (other.ok, other.reason, other.signer) == (False, "bad-signature", "ops@example"), other
        assert "namespace" in other.message
        damaged = sig.replace(b"U1NIU0lH", b"U1NIU0lI")  # "SSHSIG" -> "SSHSIH"
        assert check_signature(keys, payload.read_bytes(), damaged).reason == "bad-signature"


@needs_ssh
def test_an_ssh_signer_outside_its_validity(tmp_path):
    """An allowed-signers line with `valid-before` in the past (OpenSSH 8.5 and later)."""
    ops = ssh_key(tmp_path / "keys", "ops")
    payload = tmp_path / "payload"
    payload.write_bytes(b"tree 0\n\nmessage\n")
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(ops), "-n", "git", str(payload)], check=True,
                   capture_output=True)
    kind, b64 = Path(f"{ops}.pub").read_text().split()[:2]
    with Keys([f'ops namespaces="git",valid-before="20200101" {kind} {b64}'], []) as keys:
        got = check_signature(keys, payload.read_bytes(), (tmp_path / "payload.sig").read_bytes())
    version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr
    if re.search(r"OpenSSH_([0-7]\.|8\.[0-4])", version):
        pytest.skip(f"{version.strip()} does not know valid-before in allowed signers")
    assert (got.ok, got.reason, got.signer) == (False, "expired-key", "ops"), got


@needs_gpg
def test_a_signed_message_passed_off_as_a_signature(tmp_path):
    """A trusted key's old signed message (`gpg --sign`, its data inside), armored as a
    signature: gpgv would check the data inside, not the payload. Refused."""
    asc, fpr = gpg_key(tmp_path / "gpg", "ops")
    message = gpg(tmp_path / "gpg", "--armor", "--sign", "-u", fpr, stdin=b"an old release note\n")
    forged = message.replace(b"PGP MESSAGE", b"PGP SIGNATURE")
    with keys_of(asc) as keys:
        for sig in (message, forged):  # git reads both armor headers as OpenPGP signatures
            got = check_signature(keys, b"tree 0\n\nunsigned payload\n", sig)
            assert (got.ok, got.reason) == (False, "bad-signature"), got


@needs_ssh
@needs_gpg
def test_programs_and_keys_come_from_nftrec_not_the_environment(tmp_path, monkeypatch):
    """A `gpgv` and an `ssh-keygen` of a writer's on PATH that say "good", a GNUPGHOME
    holding the writer's key, a HOME with the writer's allowed signers: none is used."""
    ops = ssh_key(tmp_path / "keys", "ops")
    mallory = ssh_key(tmp_path / "keys", "mallory")
    ops_asc, _ = gpg_key(tmp_path / "gpg-ops", "ops")
    _, mallory_fpr = gpg_key(tmp_path / "gpg-mallory", "mallory")
    bin_, marker = tmp_path / "bin", tmp_path / "ran"
    bin_.mkdir()
    for name in ("gpgv", "ssh-keygen", "gpg"):
        (bin_ / name).write_text(f"#!/bin/sh\necho ran >> {marker}\necho '[GNUPG:] GOODSIG 0 x'\nexit 0\n")
        (bin_ / name).chmod(0o755)
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "allowed_signers").write_text(f"mallory {Path(f'{mallory}.pub').read_text()}")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("GNUPGHOME", str(tmp_path / "gpg-mallory"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    payload = tmp_path / "payload"
    payload.write_bytes(b"tree 0\n\nmessage\n")
    subprocess.run([shutil.which("ssh-keygen", path="/usr/bin:/bin"), "-q", "-Y", "sign", "-f", str(mallory), "-n",
                    "git", str(payload)], check=True, capture_output=True)
    pgp_sig = subprocess.run(["/usr/bin/gpg", "--batch", "--armor", "--detach-sign", "-u", mallory_fpr],
                             input=payload.read_bytes(), check=True, capture_output=True).stdout
    with keys_of(Path(f"{ops}.pub"), ops_asc) as keys:
        assert check_signature(keys, payload.read_bytes(), (tmp_path / "payload.sig").read_bytes()).reason == \
            "unknown-key"
        assert check_signature(keys, payload.read_bytes(), pgp_sig).reason == "unknown-key"
    assert not marker.exists()


@needs_gpg
def test_keys_live_in_a_private_directory_that_close_removes(tmp_path):
    asc, _ = gpg_key(tmp_path / "gpg", "ops")
    keys = keys_of(asc)
    home = keys.home
    assert home.is_dir() and oct(home.stat().st_mode & 0o777) == "0o700"
    keys.close()
    assert not home.exists()
    keys.close()  # twice: nothing to do
    damaged = tmp_path / "damaged.asc"
    damaged.write_bytes(asc.read_bytes().replace(b"\n=", b"\n=AAAA", 1))  # a CRC-24 that does not match
    with pytest.raises(TrustError, match="damaged.asc holds a damaged OpenPGP armored key"):
        keys_of(damaged)


@pytest.mark.skipif(os.geteuid() != 0, reason="hides /usr/bin/gpgv in a mount namespace: needs root")
@needs_ssh
@needs_gpg
def test_a_missing_checker_names_its_package(tmp_path):
    """gpgv hidden (a non-executable file mounted over it, in a mount namespace of its own):
    Keys with an OpenPGP key says to install gpgv; with SSH keys only, it is not needed."""
    asc, _ = gpg_key(tmp_path / "gpg", "ops")
    (tmp_path / "empty").write_bytes(b"")
    script = ("from reconciler.intake.gitsign import Keys, TrustError\n"
              "Keys(['ops namespaces=\"git\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9xibwvbB+uuIfRGlwmhxcMeOpmUYW+aBLnJmTxF0wW'],"
              " []).close()\n"
              f"try:\n    Keys([], [('ops.asc', open({str(asc)!r}, 'rb').read())])\n"
              "except TrustError as e:\n    print(e)\n")
    gpgv = shutil.which("gpgv", path="/usr/bin:/bin")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f'mount --bind "$1" {gpgv} && exec "$2" -c "$3"', "-", str(tmp_path / "empty"),
                           sys.executable, script], capture_output=True, text=True, timeout=60)
    if "propagation" in done.stderr:
        pytest.skip(f"no private mount namespace here (a chroot?): {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "install the gpgv package" in done.stdout, done.stdout
