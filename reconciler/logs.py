"""Diagnostics on stderr, as text (default) or JSON lines (`--log-format json`).

Results (plans, status, scripts) go to stdout and are never logged. `escape` is the one
escaping function: control characters, line separators and bidi overrides in a message
become visible escapes, so input cannot forge a text record; JSON keeps raw values.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

log = logging.getLogger("nftrec")

# Characters a terminal or a line-oriented log reader acts on instead of showing: C0
# controls (newline, carriage return, ESC, ...), DEL, C1 controls, the Unicode line and
# paragraph separators, and the bidirectional formatting characters (which reorder what
# is displayed: "Trojan Source").
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = {c for c in range(0x20)} | {0x7F} | set(range(0x80, 0xA0)) | {0x2028, 0x2029} | {ord(c) for c in _BIDI}
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES = {c: _NAMED.get(chr(c)) or (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}


def escape(text: str) -> str:
    """`text` made safe to print as (part of) one diagnostic line: every control
    character, line/paragraph separator and bidi override becomes a visible escape
    (`\\n`, `\\x1b`, `\\u2028`, as Python's repr writes them); everything else, backslashes
    included, stays as it is (so values already shown with repr() are unchanged)."""
    return text.translate(_ESCAPES)


def escape_lines(text: str) -> str:
    """For messages that carry another tool's multi-line output (nft's error with its
    caret line): each line escaped, and every line after the first indented by two
    spaces so that none of them can pass for a diagnostic of its own."""
    return "\n  ".join(escape(line) for line in text.split("\n"))


class _Text(logging.Formatter):
    """One record = one line (`nftrec: LEVEL: message` or a Problem's own line), with
    the message escaped. A record logged with `extra={"lines": True}` keeps its line
    breaks, its continuation lines indented (escape_lines)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        msg = escape_lines(msg) if getattr(record, "lines", False) else escape(msg)
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
