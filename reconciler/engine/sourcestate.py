"""The state of `nftrec watch oci://...`'s source, for `nftrec status`: `source.json` in the
table's state directory, written by daemon/fetcher.py when something changes (a new
artifact published, a failed fetch, the recovery), never for an unchanged poll. It names
the reference, the last good artifact and the last failure (reason, message, when).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from reconciler.atomic import atomic_write
from reconciler.engine.state import StateStore, utc_now

SOURCE_FILE = "source.json"


def source_state_path(store: StateStore) -> Path:
    return store.dir / SOURCE_FILE


def write_source_state(store: StateStore, doc: dict) -> None:
    doc = dict(doc, writer="nftrec watch", pid=os.getpid(), updatedAt=utc_now())
    atomic_write(source_state_path(store), (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


def read_source_state(store: StateStore) -> dict | None:
    """The source state; None when absent or unreadable (status must not fail over it)."""
    try:
        doc = json.loads(source_state_path(store).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("reference"), str) else None


def source_status_json(doc: dict | None) -> dict:
    if doc is None:
        return {}
    keys = ("reference", "digest", "revision", "fetchedAt", "lastError", "lastErrorReason", "lastErrorAt",
            "failingSince", "failures")
    return {"source": {k: doc.get(k) for k in keys}}


def source_status_lines(doc: dict | None) -> list[str]:
    if doc is None:
        return []
    if doc.get("digest"):
        lines = [f"source:    {doc['reference']}: artifact {doc.get('revision') or doc['digest']} fetched at "
                 f"{doc.get('fetchedAt')}"]
    else:
        lines = [f"source:    {doc['reference']}: nothing fetched yet"]
    if doc.get("lastError"):
        lines.append(f"  failing: since {doc.get('failingSince')}, {doc.get('failures')} attempt(s), the last at "
                     f"{doc.get('lastErrorAt')} ({doc.get('lastErrorReason')}): {doc['lastError']}; the kernel keeps "
                     f"the last good artifact's ruleset")
    return lines
