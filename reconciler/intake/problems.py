"""Problems: every finding of load, validate and config, in one shape.

A Problem says what is wrong, where (file:line:col, object, field) and what to do. Errors
block apply; warnings and notices are printed and do not.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

from reconciler import logs

ERROR = "error"
WARNING = "warning"
NOTICE = "notice"
UNKNOWN_FIELD = "unknown-field"  # Problem.code of a field that the kind does not have
FIELD_VALIDATION = ("strict", "warn", "ignore")  # kubectl's --validate / --field-validation values

_MAX_SHOWN = 80


def show(value: object) -> str:
    """A user-supplied value rendered safely on one line (quotes, newlines escaped)."""
    text = repr(value)
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return text


def safe_name(value: object) -> str:
    """An object name or namespace for a message: as is when harmless, else escaped."""
    if isinstance(value, str) and value and len(value) <= 253:
        if all(c.isalnum() and c.isascii() or c in "-._" for c in value):
            return value
    return show(value)


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    col: int
    kind: str  # "Service", ... ; "" when unknown
    obj: str  # "namespace/name" or "" (already made safe by the producer)
    field: str  # dotted path like spec.ports[0].port; "" when not about one field
    message: str  # a plain sentence: what is wrong and what to do
    severity: str = ERROR  # "error" | "warning" | "notice"
    code: str = ""  # UNKNOWN_FIELD: its severity follows --field-validation (validate.settle)

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def location(self) -> str:
        if not self.file:
            return ""
        if self.line <= 0:
            return self.file
        return f"{self.file}:{self.line}:{self.col or 1}"

    def format_text(self) -> str:
        """`file:line:col: Kind ns/name: field.path: sentence` (gcc style for non-errors:
        `file:line:col: warning: Kind ns/name: ...`). Empty parts are left out. Always one
        line: control characters in any part (a file name with a newline) are escaped."""
        parts = []
        loc = self.location()
        if loc:
            parts.append(loc)
        if self.severity != ERROR:
            parts.append(self.severity)
        who = " ".join(p for p in (self.kind, self.obj) if p)
        if who:
            parts.append(who)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return logs.escape(": ".join(parts))

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.format_text()


def field_path(path: tuple | list) -> str:
    """("spec", "ports", 0, "port") -> "spec.ports[0].port"; keys that are not plain
    identifiers (label keys like kubernetes.io/service-name) -> ['...']."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.replace("-", "").replace("_", "").isalnum() and part.isascii():
            out += ("." if out else "") + part
        else:
            out += f"[{show(part)}]"
    return out


def nearest(name: object, known) -> str | None:
    """The known name `name` most likely misspells: the same but for case, else the
    closest by difflib's ratio (at least 0.6), else None."""
    if not isinstance(name, str):
        return None
    folded = {k.lower(): k for k in known}
    if name.lower() in folded:
        return folded[name.lower()]
    close = difflib.get_close_matches(name, list(known), n=1)
    if not close:
        close = difflib.get_close_matches(name.lower(), list(folded), n=1)
        close = [folded[c] for c in close]
    return close[0] if close else None


def unknown_field(path: tuple, known) -> str:
    """The message for a field its kind does not have, with the nearest known name."""
    guess = nearest(path[-1], known)
    hint = f"; did you mean {guess}?" if guess else "; remove it or fix its spelling"
    return (f"unknown field {show(path[-1])}{hint} (Kubernetes refuses unknown fields too; "
            "--field-validation=warn or ignore accepts them)")


def count(problems: list[Problem], severity: str) -> int:
    return sum(1 for p in problems if p.severity == severity)
