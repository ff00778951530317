"""Diagnostics on stderr, as text (default) or JSON lines (`--log-format json`).

Results (plans, status, rendered scripts) go to stdout and are never logged; everything
said *about* a run — input problems, warnings, errors — goes through here, so a log
collector gets one JSON object per line with the same fields the text shows.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

log = logging.getLogger("nftrec")


class _Text(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if getattr(record, "plain", False):  # already "file:line:col: ..." shaped
            return msg
        return f"nftrec: {record.levelname.lower()}: {msg}"


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "fields", None) or {})
        return json.dumps(doc, ensure_ascii=False)


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (tests swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def setup(fmt: str = "text") -> None:
    for h in list(log.handlers):
        log.removeHandler(h)
    handler = _Stderr()
    handler.setFormatter(_Json() if fmt == "json" else _Text())
    log.addHandler(handler)
    # NFTREC_LOG_LEVEL=debug shows the debug lines (cache misses, fast-path decisions).
    level = os.environ.get("NFTREC_LOG_LEVEL", "info").upper()
    log.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else logging.INFO)
    log.propagate = False


def problem(p) -> None:
    """One input problem (problems.Problem): its text line, or its fields as JSON."""
    level = {"error": logging.ERROR, "warning": logging.WARNING}.get(p.severity, logging.INFO)
    log.log(level, p.format_text(), extra={"plain": True, "fields": p.to_json()})


setup()  # importers that never call setup() (library use, tests) still get text on stderr
