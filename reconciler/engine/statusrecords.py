"""Status records on git, with no server: after each outcome the node commits a small JSON
record (rollout.Record) as the only file (`status.json`) of a commit on its own ref
refs/nftrec/status/<nodeName> of `status.remote`, its parent the previous record, so the
ref's history is the node's log. Records are read back (`fetch_records`) by other nodes
and `fleet status`: they are untrusted there, and `parse_record` is strict. git runs as
statusgit runs it; the queue and its pusher are statusqueue.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from pathlib import Path
from typing import Sequence

from reconciler.engine.statusgit import REF_PREFIX, StatusGitError, fetch_tips, shown
from reconciler.engine.statusqueue import Queue
from reconciler.intake import OUTCOMES, Record, StatusSettings
from reconciler.logs import escape, log

MAX_RECORD_BYTES = 16 << 10  # a record is a few hundred bytes; labels and an error at most
MAX_TEXT = 1024  # characters of a wave name, a revision or an error (record_json cuts the error)
MAX_LABELS = 64
QUEUE_DIR = "status-queue"  # under the state directory: one file per record not yet pushed

_KEYS = {"node", "labels", "wave", "applied", "attempted", "outcome", "error", "time"}
_DNS = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NODE = re.compile(_DNS)
_LABEL_KEY = re.compile(rf"({_DNS}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?Z")


def valid_node(name: str) -> bool:
    """A nodeName as the node config takes it (a DNS-1123 subdomain) that git takes as the
    last component of a ref (not ending in .lock)."""
    return (isinstance(name, str) and 0 < len(name) <= 253 and _NODE.fullmatch(name) is not None
            and not name.endswith(".lock"))


def rfc3339(t: float) -> str:
    """Unix seconds as RFC 3339 UTC with milliseconds: 2026-12-06T10:30:00.000Z."""
    ms = int(round(t * 1000))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _parse_time(text: str) -> float | None:
    m = _TIME.fullmatch(text)
    if not m:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) + float(m.group(7) or 0)


def _text(value: str) -> str:
    """A free-text field as a record carries it: one line, no control or bidi character
    (visible escapes instead), at most MAX_TEXT characters."""
    return escape(str(value))[:MAX_TEXT]


def record_json(record: Record) -> bytes:
    """The record as the file of its commit: canonical JSON (sorted keys, no spaces, ASCII),
    one object and a newline. Free text is made one safe line and cut to MAX_TEXT, so that
    parse_record takes back every record a valid node config writes; ValueError for a
    node name or labels that the node config would not take."""
    if not valid_node(record.node):
        raise ValueError(f"{record.node!r} is not a node name a status ref can carry")
    labels = dict(record.labels)
    if not _valid_labels(labels):
        raise ValueError(f"the labels {labels!r} are not node labels a status record can carry")
    doc = {"node": record.node, "labels": labels, "wave": _text(record.wave), "applied": _text(record.applied),
           "attempted": _text(record.attempted), "outcome": record.outcome, "error": _text(record.error),
           "time": rfc3339(record.time)}
    if record.outcome not in OUTCOMES:
        raise ValueError(f"{record.outcome!r} is not a status outcome ({', '.join(OUTCOMES)})")
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def _valid_labels(labels: object) -> bool:
    return (isinstance(labels, dict) and len(labels) <= MAX_LABELS
            and all(isinstance(k, str) and len(k) <= 317 and _LABEL_KEY.fullmatch(k)
                    and isinstance(v, str) and len(v) <= 63 and _LABEL_VALUE.fullmatch(v) for k, v in labels.items()))


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _refuse_constant(name: str) -> None:
    raise ValueError(name)


def parse_record(raw: bytes, ref: str) -> Record | None:
    """A record read from a remote (written by another node: untrusted): None when it is
    not a well-formed record of the node its ref names. `ref` is the full ref
    (refs/nftrec/status/<node>) or the node name. Well-formed: at most MAX_RECORD_BYTES
    of UTF-8 JSON, exactly the record's keys (no duplicate), strings where strings go,
    the node config's rules for the node name and labels, an outcome of OUTCOMES, an RFC
    3339 UTC time, no control or bidi character and at most MAX_TEXT characters of text."""
    node = ref[len(REF_PREFIX):] if ref.startswith(REF_PREFIX) else ref
    if not isinstance(raw, (bytes, bytearray)) or len(raw) > MAX_RECORD_BYTES or not valid_node(node):
        return None
    try:
        doc = json.loads(bytes(raw).decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or set(doc) != _KEYS or doc["node"] != node or not _valid_labels(doc["labels"]):
        return None
    texts = ("wave", "applied", "attempted", "error")
    if not all(isinstance(doc[k], str) and len(doc[k]) <= MAX_TEXT and escape(doc[k]) == doc[k] for k in texts):
        return None
    if doc["outcome"] not in OUTCOMES or not isinstance(doc["time"], str):
        return None
    when = _parse_time(doc["time"])
    if when is None:
        return None
    return Record(node=node, labels=tuple(sorted(doc["labels"].items())), wave=doc["wave"], applied=doc["applied"],
                  attempted=doc["attempted"], outcome=doc["outcome"], error=doc["error"], time=when)


class StatusChannel:
    """One node's outcomes, queued durably under `state_dir` and pushed in the background
    (statusqueue.Queue: in order, with backoff; consecutive records that differ only in
    their time are sent as the latest of them)."""

    def __init__(self, state_dir: Path, settings: StatusSettings, *, backoff: tuple[float, float] = (1.0, 300.0)):
        self.settings = settings
        self._queue = Queue(Path(state_dir) / QUEUE_DIR, settings.remote, settings.ssh_key, backoff=backoff)

    def enqueue(self, record: Record) -> None:
        """Queue `record` durably and return at once; the pusher sends it (and every one
        queued before it, in order) when the remote is reachable. Never raises: a record
        that cannot be written is logged and dropped."""
        try:
            raw = record_json(record)
        except ValueError as e:
            log.error("status record not queued: %s", e)
            return
        self._queue.put(raw)

    def start(self) -> None:
        self._queue.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the pusher (a running git is killed); what is queued stays queued."""
        self._queue.stop(timeout)

    def flush(self, timeout: float) -> bool:
        """One attempt, in this thread and without the pusher, to send what is queued (a
        one-shot run before it exits), every git command of it within `timeout` seconds:
        whether the queue is empty now. What is left is sent next time; why in last_error."""
        return self._queue.send_all(timeout)

    @property
    def pending(self) -> int:
        """Records queued, not yet pushed."""
        return self._queue.pending()

    @property
    def last_error(self) -> str | None:
        """Why the last push failed; None after a push that succeeded (or before any)."""
        return self._queue.last_error


def fetch_records(remote: str, ssh_key: str | None = None, *, timeout: float = 30.0, started=None
                  ) -> tuple[Sequence[Record], str | None]:
    """Every node's latest record from `remote`, fetching only refs/nftrec/status/* (depth 1,
    no checkout: each tip's status.json is read from the objects), sorted by node; (the
    records, None) or ((), why they could not be read). A record that is not well-formed
    (parse_record) is left out. `started`: fetch_tips's (a cancel hook)."""
    try:
        tips = fetch_tips(remote, ssh_key, timeout, MAX_RECORD_BYTES, started)
    except StatusGitError as e:
        return (), f"cannot read the status records of {shown(remote)}: {e}"
    records = [r for r in (parse_record(raw, ref) for ref, raw in tips) if r is not None]
    return tuple(sorted(records, key=lambda r: r.node)), None
