"""Signatures over git payloads, checked by nftrec's own programs with nftrec's own keys.

A commit's or tag's signature (SSH or OpenPGP, as git writes them) is checked over the
payload git signed by running `ssh-keygen -Y verify` or `gpgv` directly: absolute paths
found once, a clean environment, a private directory holding the keys, the payload on
stdin. Nothing a repository's config names (gpg.program, gpg.ssh.program) ever runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote  # gpgv's status lines %-escape user ids

TIMEOUT = 60.0  # seconds, per ssh-keygen or gpgv process

_SSH_SIG = b"-----BEGIN SSH SIGNATURE-----"
_PGP_SIG = (b"-----BEGIN PGP SIGNATURE-----", b"-----BEGIN PGP MESSAGE-----")  # git takes both as OpenPGP
_ARMOR = re.compile(rb"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n(.*?)-----END PGP PUBLIC KEY BLOCK-----", re.S)
# gpgv's status keywords that refuse a signature, strongest first: (reason, sentence)
_REFUSE = {
    "REVKEYSIG": ("revoked-key", "the signing key is revoked"),
    "EXPKEYSIG": ("expired-key", "the signing key has expired"),
    "EXPSIG": ("expired-signature", "the signature has expired"),
    "BADSIG": ("bad-signature", "the signature does not verify (the signed content was changed after signing)"),
    "NO_PUBKEY": ("unknown-key", "the signing key is not one of verify.keys"),
    "ERRSIG": ("bad-signature", "gpgv cannot check the signature"),
}


class TrustError(Exception):
    """`verify` cannot be used as configured: a key file, a directory that is not a git
    checkout, a missing tool. A configuration error: nothing is applied."""


@dataclass(frozen=True)
class Checked:
    """The outcome of one signature: ok, else a reason (a metric label) and one sentence;
    the signer (SSH principal, OpenPGP user id) and key fingerprint when known."""
    ok: bool
    reason: str
    message: str
    signer: str = ""
    key: str = ""


class Keys:
    """The trusted keys, ready for ssh-keygen and gpgv, in a private temporary directory
    (an allowed-signers file, an OpenPGP keyring) that close() removes. `ssh_signers` are
    allowed-signers lines, `pgp_keys` (file name, armored public key). TrustError when a
    key cannot be read or the program that checks its kind is not installed."""

    def __init__(self, ssh_signers: list[str], pgp_keys: list[tuple[str, bytes]]) -> None:
        self._signers = [_signer_key(line) for line in ssh_signers]  # (principal, public key blob)
        self._ssh_keygen = _program("ssh-keygen", "openssh-client") if ssh_signers else ""
        self._gpgv = _program("gpgv", "gpgv") if pgp_keys else ""
        keyring = b"".join(_dearmor(name, raw) for name, raw in pgp_keys)
        self.home = Path(tempfile.mkdtemp(prefix="nftrec-keys-"))
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.home), True)  # at exit too
        self._allowed = self.home / "allowed_signers"
        self._keyring = self.home / "keyring.gpg"
        self._allowed.write_text("".join(line + "\n" for line in ssh_signers))
        self._keyring.write_bytes(keyring)
        self._env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(self.home), "GNUPGHOME": str(self.home)}

    def close(self) -> None:
        self._remove()

    def __enter__(self) -> Keys:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, argv: list[str], signature: bytes, payload: bytes) -> subprocess.CompletedProcess:
        """`argv` with the signature in a private file (its path replaces "{sig}") and
        the payload on stdin; cwd is the private directory, never the repository."""
        fd, sigfile = tempfile.mkstemp(dir=self.home, suffix=".sig")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(signature)
            argv = [sigfile if a == "{sig}" else a for a in argv]
            try:
                return subprocess.run(argv, input=payload, capture_output=True, env=self._env, cwd=self.home,
                                      timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                raise TrustError(f"{argv[0]} took longer than {TIMEOUT:.0f} s to check a signature") from None
        finally:
            os.unlink(sigfile)


def check_signature(keys: Keys, payload: bytes, signature: bytes | None, namespace: str = "git") -> Checked:
    """Whether `signature` (as git stores it: armored SSH or OpenPGP) is a good signature
    of `payload` by one of `keys`. `namespace` is the SSH signature namespace."""
    if not signature or not signature.strip():
        return Checked(False, "unsigned", "it is not signed")
    head = signature.lstrip()
    if head.startswith(_SSH_SIG):
        return _check_ssh(keys, payload, signature, namespace)
    if head.startswith(_PGP_SIG):
        return _check_pgp(keys, payload, signature)
    return Checked(False, "unknown-key", "its signature is neither SSH nor OpenPGP (X.509?), the kinds of key "
                                         "verify.keys holds")


def _check_ssh(keys: Keys, payload: bytes, signature: bytes, namespace: str) -> Checked:
    """The principal whose allowed-signers key is the signature's, then `ssh-keygen -Y verify`."""
    blob = _sshsig_key(signature)
    if blob is None:
        return Checked(False, "bad-signature", "its SSH signature cannot be read (damaged armor or blob)")
    key = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    principal = next((name for name, known in keys._signers if known == blob), None)
    if principal is None:
        return Checked(False, "unknown-key", "the signing key is not one of verify.keys", key=key)
    done = keys._run([keys._ssh_keygen, "-Y", "verify", "-f", str(keys._allowed), "-I", principal, "-n", namespace,
                      "-s", "{sig}"], signature, payload)
    if done.returncode == 0:
        return Checked(True, "", "", principal, key)
    said = done.stderr.decode("utf-8", "replace")
    if "expired" in said or "not yet valid" in said:
        return Checked(False, "expired-key", "the signing key is outside its validity in verify.keys", principal, key)
    if "namespace" in said:
        return Checked(False, "bad-signature", f"the SSH signature is not for the {namespace!r} namespace", principal,
                       key)
    return Checked(False, "bad-signature", "the signature does not verify (the signed content was changed after "
                                           "signing)", principal, key)


def _check_pgp(keys: Keys, payload: bytes, signature: bytes) -> Checked:
    """`gpgv` with the keyring of `keys` (it trusts each key there), judged by its status lines."""
    if not keys._gpgv:
        return Checked(False, "unknown-key", "the signing key is not one of verify.keys (it holds no OpenPGP key)")
    done = keys._run([keys._gpgv, "--keyring", str(keys._keyring), "--status-fd", "1", "{sig}", "-"], signature,
                     payload)
    status: dict[str, list[str]] = {}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("[GNUPG:] "):
            word, _, rest = line[9:].partition(" ")
            status.setdefault(word, rest.split(" "))
    for word, (reason, sentence) in _REFUSE.items():
        if word in status:
            fields = status[word]
            signer = clean(unquote(" ".join(fields[1:]))) if word.endswith("SIG") and word != "ERRSIG" else ""
            return Checked(False, reason, sentence, signer, status.get("KEY_CONSIDERED", fields)[0])
    valid, good = status.get("VALIDSIG", []), status.get("GOODSIG", [])
    if done.returncode != 0 or len(valid) < 10 or not good or valid[8] not in ("00", "01"):
        return Checked(False, "bad-signature", "its OpenPGP signature is not a good detached signature of the content")
    return Checked(True, "", "", clean(unquote(" ".join(good[1:]))), valid[9])


def clean(text: str) -> str:
    """A signer's name as one printable line (it comes from a key's user id)."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)[:200]


def _program(name: str, package: str) -> str:
    found = shutil.which(name, path="/usr/bin:/bin")
    if found is None:
        raise TrustError(f"verify.keys holds a key that {name} checks, and {name} is not installed in /usr/bin: "
                         f"install the {package} package")
    return found


def _signer_key(line: str) -> tuple[str, bytes]:
    """(principal, public key blob) of an allowed-signers line `name [options] type base64`."""
    words = line.split()
    for i, word in enumerate(words[1:-1], 1):
        if re.fullmatch(r"(ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+", word):
            try:
                return words[0], base64.b64decode(words[i + 1], validate=True)
            except binascii.Error:
                break
    raise TrustError(f"verify.keys: {line[:80]!r} is not an allowed-signers line (name, key type, base64 key)")


def _sshsig_key(signature: bytes) -> bytes | None:
    """The public key blob inside an armored SSHSIG (openssh PROTOCOL.sshsig: "SSHSIG",
    uint32 version, string publickey, ...), None when it cannot be read."""
    body = re.search(rb"-----BEGIN SSH SIGNATURE-----(.*?)-----END SSH SIGNATURE-----", signature, re.S)
    try:
        blob = base64.b64decode(b"".join((body.group(1) if body else b"").split()), validate=True)
    except binascii.Error:
        return None
    if blob[:6] != b"SSHSIG" or len(blob) < 14:
        return None
    (size,) = struct.unpack(">I", blob[10:14])
    key = blob[14:14 + size]
    return key if len(key) == size and size > 0 else None


def _dearmor(name: str, raw: bytes) -> bytes:
    """The binary OpenPGP packets of the armored public key blocks in `raw` (OpenPGP ASCII
    armor: header lines, base64, an optional CRC-24 line). TrustError when damaged."""
    blocks = _ARMOR.findall(raw)
    out = []
    for block in blocks:
        lines = [ln.strip() for ln in block.splitlines() if ln.strip() and b":" not in ln]  # no armor headers
        crc = [ln for ln in lines if ln.startswith(b"=")]
        try:
            data = base64.b64decode(b"".join(ln for ln in lines if not ln.startswith(b"=")), validate=True)
            if crc and base64.b64decode(crc[0][1:], validate=True) != _crc24(data).to_bytes(3, "big"):
                raise ValueError
        except (binascii.Error, ValueError):
            raise TrustError(f"verify.keys: {name} holds a damaged OpenPGP armored key; export it again "
                             "(gpg --armor --export KEYID)") from None
        first = data[0] if data else 0
        tag = first & 0x3F if first & 0x40 else (first >> 2) & 0x0F
        if not first & 0x80 or tag != 6:
            raise TrustError(f"verify.keys: {name} holds an OpenPGP block that is not a public key; export the "
                             "public key (gpg --armor --export KEYID)")
        out.append(data)
    if not out:
        raise TrustError(f"verify.keys: {name} holds no OpenPGP public key block")
    return b"".join(out)


def _crc24(data: bytes) -> int:
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF
