"""`oci://HOST[:PORT]/REPO:TAG` and `oci://HOST[:PORT]/REPO@sha256:HEX`: the parsed reference,
and the one error every part of the OCI source raises (`SourceError`, whose `reason` is a
metric label). The grammar is the OCI distribution spec's: lower-case path components
joined by `/`, tags of at most 128 characters, sha256 digests only (the one algorithm every
registry and Flux use).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

OCI_PREFIX = "oci://"

# the reasons a SourceError gives (the label of nftrec_source_errors_total{reason})
SOURCE_ERROR_REASONS = ("bad-reference", "unreachable", "tls", "auth", "not-found", "insecure-refused", "bad-response",
           "digest-mismatch", "bad-artifact", "unsafe-archive", "too-large")

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]{0,61}[A-Za-z0-9])"
_HOST_RE = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?")
MAX_REPOSITORY = 255  # the distribution spec's bound on a repository name


class SourceError(Exception):
    """The OCI source failed: `reason` (one of SOURCE_ERROR_REASONS, a metric label) and `message`, a
    sentence that says what, where and what to do."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_oci(text: str | Path | None) -> bool:
    """Whether a command argument names an OCI artifact rather than a directory."""
    return isinstance(text, str) and text.startswith(OCI_PREFIX)


def is_digest(text: str) -> bool:
    return bool(_DIGEST_RE.fullmatch(text))


@dataclass(frozen=True)
class Reference:
    """A parsed `oci://` reference; at least one of tag and digest is set (a digest pins)."""

    host: str  # "127.0.0.1:5000" (port included when given)
    repository: str  # "team/manifests"
    tag: str | None = None
    digest: str | None = None  # "sha256:<64 hex>"

    def __str__(self) -> str:
        return (f"{OCI_PREFIX}{self.host}/{self.repository}"
                + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else ""))

    def at(self, digest: str) -> Reference:
        """The same repository pinned to `digest` (the tag kept, for display)."""
        return Reference(self.host, self.repository, self.tag, digest)


def parse_reference(text: str) -> Reference:
    """`oci://HOST[:PORT]/REPO:TAG`, `...REPO@sha256:HEX` or `...REPO:TAG@sha256:HEX` (the
    digest wins); SourceError("bad-reference") naming the part that is wrong."""
    shown = repr(text) if len(text) <= 300 else repr(text[:300]) + "..."
    example = "write oci://HOST[:PORT]/REPOSITORY:TAG or oci://HOST[:PORT]/REPOSITORY@sha256:HEX"
    if not is_oci(text):
        raise SourceError("bad-reference", f"{shown} is not an OCI reference; {example}")
    rest = text[len(OCI_PREFIX):]
    host, slash, path = rest.partition("/")
    if not slash or not host or not path:
        raise SourceError("bad-reference", f"{shown} has no repository after the host; {example}")
    if not _HOST_RE.fullmatch(host) or (":" in host.rsplit("]", 1)[-1] and not 0 < int(host.rsplit(":", 1)[1]) < 65536):
        raise SourceError("bad-reference", f"{shown}: {host!r} is not a registry host[:port]; {example}")
    digest = tag = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST_RE.fullmatch(digest):
            raise SourceError("bad-reference", f"{shown}: {digest!r} is not a digest; give sha256: and 64 lower-case hex digits")
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG_RE.fullmatch(tag):
            raise SourceError("bad-reference", f"{shown}: {tag!r} is not a tag (letters, digits, '_', '.', '-', "
                                               f"at most 128, not starting with '.' or '-')")
    if not _REPOSITORY_RE.fullmatch(path) or len(path) > MAX_REPOSITORY:
        raise SourceError("bad-reference", f"{shown}: {path!r} is not a repository name (lower-case letters and "
                                           f"digits, components joined by '/', separated inside by '.', '_' or '-')")
    if tag is None and digest is None:
        raise SourceError("bad-reference", f"{shown} names no tag and no digest; {example}")
    return Reference(host, path, tag, digest)
