"""Status records on git, with no server: after each outcome the node commits a small JSON
record (rollout.Record) as the only file of a commit on its own ref
refs/nftrec/status/<nodeName> of `status.remote`, its parent the previous record. The
queue is durable in the state directory; a background pusher sends it with backoff and
never blocks or delays a sync. git runs in a private temporary repository with nftrec's
own configuration, never one that another user writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from reconciler.intake import Record

REF_PREFIX = "refs/nftrec/status/"


@dataclass(frozen=True)
class StatusSettings:
    """The node config's `status`: the remote (a git URL) and an SSH key file (optional)."""

    remote: str
    ssh_key: str | None = None


def record_json(record: Record) -> bytes:
    """The record as the file of its commit: canonical JSON, one object."""
    raise NotImplementedError


def parse_record(raw: bytes, ref: str) -> Record | None:
    """A record read from a remote (written by another node: untrusted): None when it is
    not a well-formed record of the node its ref names."""
    raise NotImplementedError


class StatusChannel:
    """One node's outcomes, queued durably under `state_dir` and pushed in the background."""

    def __init__(self, state_dir: Path, settings: StatusSettings):
        raise NotImplementedError

    def enqueue(self, record: Record) -> None:
        """Queue `record` durably and return at once; the pusher sends it (and every one
        queued before it, in order) when the remote is reachable."""
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        raise NotImplementedError


def fetch_records(remote: str, ssh_key: str | None = None, *, timeout: float = 30.0
                  ) -> tuple[Sequence[Record], str | None]:
    """Every node's latest record from `remote`, fetching only refs/nftrec/status/*; (the
    records, None) or ((), why they could not be read)."""
    raise NotImplementedError
