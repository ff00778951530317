"""The commit record: one small fsynced line per commit, written before the commit is reported.

`tables/<table>/commits.jsonl` says what the kernel holds even when the heavy record
(history and status.json, which `watch` writes later on its state-writer thread) never
came: a `status` after a crash names the kernel's revision, and the next `watch` or
`apply` keeps the kernel's ruleset of that commit in the history (`adopt_commit`) before
anything replaces it. Each line carries a checksum; a torn or damaged line is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler import logs
from reconciler.atomic import atomic_write
from reconciler.engine.state import FORMAT_VERSION, StateStore, Status, read_status, utc_now
from reconciler.compile import Ruleset
from reconciler.kernel import Interface, fingerprint, kernel_token, read_live

if TYPE_CHECKING:
    from reconciler.intake import Baseline

RECORD = "commits.jsonl"
KEEP = 32  # entries kept when the file is rewritten
COMPACT_AT = 64 * 1024  # bytes: past this the next append rewrites the file with the last KEEP entries
_TAIL = 16 * 1024  # an append reads this much of the end to find the last sequence
_MAX_LINE = 4096  # a longer entry lists fewer Services (the tail read always holds the last line)
_SHOWN = 10  # Services named per entry (their count is always there)

# (JSON key, attribute, types, nullable)
_FIELDS = (
    ("sequence", "sequence", int, False),
    ("revision", "revision", str, True),
    ("committedAt", "committed_at", str, False),
    ("writer", "writer", str, False),
    ("kind", "kind", str, False),
    ("token", "token", int, True),
    ("fingerprint", "fingerprint", str, True),
    ("operations", "operations", int, False),
    ("servicesChanged", "services_changed", int, False),
    ("services", "services", list, False),
    ("revisionTime", "revision_time", int, True),  # may be absent (older nftrecs): read as null
    ("trust", "trust", str, True),
)


@dataclass(frozen=True)
class Commit:
    """One line of the record. `token` is the kernel's generation token right after the
    commit; `fingerprint` the listing's when the commit was verified by one (kernel.
    fingerprint). Either tells whether the kernel still holds what this commit left: the
    ruleset's own digest costs a pass over the whole ruleset, which the history pays later."""

    sequence: int
    revision: str | None
    committed_at: str
    writer: str
    kind: str  # full / partial (watch's syncs), apply, rollback, plan, allow-rollback, restore
    token: int | None
    fingerprint: str | None
    operations: int
    services_changed: int
    services: tuple = ()  # the first Services changed, as "+ns/name", "~ns/name", "-ns/name"
    revision_time: int | None = None  # with `verify`: the revision's signed time (Verdict.time)
    trust: str | None = None  # with `verify`: signed, first-use or allow-rollback

    def to_json(self) -> dict:
        return {key: list(getattr(self, attr)) if key == "services" else getattr(self, attr)
                for key, attr, _, _ in _FIELDS}


def _check(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:16]


def encode(c: Commit) -> bytes:
    """One line: the entry's canonical JSON with its checksum appended as the last key."""
    doc = {"formatVersion": FORMAT_VERSION, **c.to_json()}
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return (body[:-1] + f',"check":"{_check(body.encode())}"}}\n').encode()


def decode(line: bytes) -> Commit | None:
    """The entry of one line (without its newline), or None when it is not one whole,
    unchanged entry of this format: a torn or damaged line is never trusted."""
    head, sep, tail = line.rpartition(b',"check":"')
    if not sep or len(tail) != 18 or not tail.endswith(b'"}'):
        return None
    body = head + b"}"
    if _check(body) != tail[:16].decode("ascii", "replace"):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("formatVersion") != FORMAT_VERSION:
        return None
    values = {}
    for key, attr, types, nullable in _FIELDS:
        v = doc.get(key)
        if not ((v is None and nullable) or (isinstance(v, types) and not isinstance(v, bool))):
            return None
        if key == "services":
            if not all(isinstance(x, str) for x in v):
                return None
            v = tuple(v)
        values[attr] = v
    return Commit(**values)


def _entries(data: bytes) -> list[Commit]:
    """The whole, valid entries of `data`, by sequence; a last line without its newline
    (a write cut short) and any damaged line are skipped."""
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or the torn end of an interrupted append
    found = [c for c in map(decode, lines) if c is not None]
    torn = bool(data) and not data.endswith(b"\n")
    if torn or len(found) < len(lines):
        logs.log.debug(f"commit record: {len(lines) - len(found) + torn} torn or damaged line(s) ignored")
    return sorted(found, key=lambda c: c.sequence)


def record_path(store: StateStore) -> Path:
    return store.dir / RECORD


def read_commits(store: StateStore) -> list[Commit]:
    """Every valid entry, oldest first (none when the file is absent or unreadable)."""
    try:
        return _entries(record_path(store).read_bytes())
    except OSError:
        return []


def newest_commit(store: StateStore) -> Commit | None:
    found = read_commits(store)
    return found[-1] if found else None


def commit_ahead(store: StateStore, status: Status) -> Commit | None:
    """The newest commit when status.json and the history do not include it yet (a daemon
    killed before its state writer ran), else None."""
    c = newest_commit(store)
    if c is None:
        return None
    if status.commit_sequence is None and status.last_applied_at is not None and status.last_applied_at > c.committed_at:
        return None  # status.json written without a commit sequence, after this commit
    return c if c.sequence > (status.commit_sequence or 0) else None


def rollback_baseline(store: StateStore) -> Baseline | None:
    """The intake.Baseline a signed revision must not roll back from: the last applied
    revision of the newer of the commit record (fsynced at commit time) and status.json
    (which watch's state writer writes later), with its signed time from whichever record
    holds it. A damaged status.json leaves the record. None when neither names a revision:
    nothing was applied yet, and `verify` trusts the first revision (on first use)."""
    from reconciler.intake import Baseline

    status = read_status(store)
    newest = newest_commit(store)
    found = [(status.last_applied_revision, status.last_applied_revision_time, "status")]
    if newest is not None:  # first when status.json does not describe it yet
        found.insert(0 if commit_ahead(store, status) is not None else 1,
                     (newest.revision, newest.revision_time, "commits"))
    revision, origin = next(((r, o) for r, _, o in found if r), (None, ""))
    if revision is None:
        return None
    time = next((t for r, t, _ in found if r == revision and t is not None), None)
    return Baseline(revision, time, origin)


def _shown(services: list[str]) -> tuple:
    return tuple(s[:300] for s in services[:_SHOWN])


def append_commit(store: StateStore, *, revision: str | None, writer: str, kind: str, token: int | None,
                  operations: int, services: list[str], fingerprint: str | None = None,
                  revision_time: int | None = None, trust: str | None = None) -> Commit:
    """Append one entry and fsync it; the caller holds the namespace lock. The sequence
    follows the record's last entry (or status.json's, when the record has none). A torn
    end, a missing file or one past COMPACT_AT is rewritten atomically instead, with the
    last KEEP valid entries and the new one."""
    path = record_path(store)
    fd = None
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        last, size = None, 0
        if fd is not None:
            size = os.fstat(fd).st_size
            tail = os.pread(fd, min(size, _TAIL), max(0, size - _TAIL))
            if tail.endswith(b"\n"):
                last = decode(tail[:-1].rpartition(b"\n")[2])
        if last is not None:
            sequence = last.sequence + 1
        else:  # no record, or its end is not a whole entry: read what is whole
            old = read_commits(store)
            sequence = max(old[-1].sequence if old else 0, read_status(store).commit_sequence or 0) + 1
        c = Commit(sequence, revision, utc_now(), writer, kind, token, fingerprint, operations,
                   len(services), _shown(services), revision_time, trust)
        line = encode(c)
        while len(line) > _MAX_LINE and c.services:
            c = replace(c, services=c.services[:-1])
            line = encode(c)
        if last is not None and size + len(line) <= COMPACT_AT:
            os.write(fd, line)
            os.fsync(fd)
            return c
    finally:
        if fd is not None:
            os.close(fd)
    old = read_commits(store)
    kept = [encode(e) for e in old[max(0, len(old) - KEEP + 1):]]
    atomic_write(path, b"".join(kept) + line)
    return c


def adopt_commit(store: StateStore, nft: Interface, table: str, live: Ruleset | None = None,
                 token: int | None = None) -> bool:
    """Keep the kernel's ruleset of a commit the history lacks, before anything replaces
    it: when the newest commit is ahead of status.json and the kernel is as it left it
    (the generation token unchanged, or the listing's fingerprint the recorded one), the
    listing becomes its history entry and status.json names it. `live` and `token` (taken
    before that listing): a listing the caller already has. True when an entry was kept."""
    status = read_status(store)
    c = commit_ahead(store, status)
    if c is None:
        return False
    before = token if live is not None else kernel_token(nft)
    if live is None:
        live = read_live(nft, table)
    same = c.token is not None and before == c.token and kernel_token(nft) == c.token
    fp = fingerprint(live)
    if not (same or (c.fingerprint is not None and fp == c.fingerprint)) or not live.tables:
        logs.log.info(f"revision {c.revision} was committed at {c.committed_at} but not recorded in the history, and "
                      f"the kernel's table {table} changed since; its ruleset is not kept (the next commit is "
                      f"recorded as usual)", extra={"fields": {"event": "state", "sequence": c.sequence}})
        return False
    store.record_applied(c.revision, live, fp, before, commit=c.sequence, applied_at=c.committed_at, listed=True,
                         revision_time=c.revision_time, trust=c.trust)
    logs.log.info(f"revision {c.revision}, committed at {c.committed_at} by a {c.writer} that stopped before "
                  f"recording it, is in the history now (its ruleset as listed from the kernel)",
                  extra={"fields": {"event": "state", "sequence": c.sequence, "revision": c.revision}})
    return True
