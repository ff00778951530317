"""The recorded ruleset read lazily: a one-Service `apply` looks at a few chains and sets
of the last applied ruleset, so only those are decoded.

A history entry's body is the ruleset's digest form (`compile.digest_bytes`: canonical
JSON, chains and sets sorted by name). `lazy_ruleset(text)` indexes where each chain and
set lies in that text without decoding it, and returns a `Ruleset` whose tables' `chains`
and `sets` are `LazyObjects`: a mapping that decodes an object (through
`compile.ruleset_from_json`, with all its checks) the first time it is read. At 10,000
Services that replaces a 1.3-3 s decode of 19,000 chains and 5,000 sets by an index of a
few ms, plus the handful of objects the change touches.

`LazyObjects.raw(name)` gives back the exact bytes of an object that was never decoded,
so `compile.digest_bytes` re-uses them for the next history entry instead of encoding
every object again. An object that was decoded is encoded again: it may have been
changed in place, and its bytes then no longer describe it.

Why splitting the text without a JSON parser is exact: the caller passes only a body
whose sha256 is its entry's digest, i.e. the canonical form digest_bytes wrote. In it a
`"` inside a string is always escaped, so a pattern holding an unescaped `"` (such as
`{"base":`, which opens a chain, and nothing else) matches structure only, never string
content. Anything unexpected makes `lazy_ruleset` return None, and the caller decodes the
whole text as before (`compile.ruleset_from_text`).
"""

from __future__ import annotations

import json
import re
from collections.abc import MutableMapping

from reconciler.compile import Ruleset, SerializeError, Table, ruleset_from_json

_HEAD = b'{"formatVersion":1,"owners":'
_TABLES = b'},"tables":['
_STR = rb'"(?:[^"\\]|\\.)*"'
_NAME = rb'[A-Za-z][A-Za-z0-9/_.\-]*'
# between a table's chains and its sets (keys in canonical order)
_TABLE_MID = re.compile(rb'\],"comment":(null|' + _STR + rb'),"family":"(ip6?)","name":"(' + _NAME + rb')","sets":\[')
_CHAIN_START = re.compile(rb'\{"base":')
_SET_START = re.compile(rb'\{"comment":(?:null|' + _STR + rb'),"elements":\[')
_NAME_AT = re.compile(rb'"name":"(' + _NAME + rb')"')
_NEXT_TABLE = b']},{"chains":['
_END = b"]}]}"


class _Span(tuple):
    """(start, end) of an undecoded object in the text (a type of its own, so that no
    decoded value is ever taken for one)."""


class LazyObjects(MutableMapping):
    """name -> Chain or NamedSet, decoded on first access; iteration order is the text's
    (sorted by name, as ruleset_from_text would give)."""

    __slots__ = ("_d", "_buf", "_decode")

    def __init__(self, buf: bytes, spans: dict, decode):
        self._buf = buf
        self._decode = decode
        self._d: dict = {name: _Span(span) for name, span in spans.items()}

    def __getitem__(self, name):
        v = self._d[name]
        if type(v) is _Span:
            v = self._d[name] = self._decode(self._buf[v[0]:v[1]], name)
        return v

    def __setitem__(self, name, value) -> None:
        self._d[name] = value

    def __delitem__(self, name) -> None:
        del self._d[name]

    def __contains__(self, name) -> bool:
        return name in self._d

    def __iter__(self):
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def raw(self, name) -> memoryview | None:
        """The canonical bytes of `name` while it was never decoded (module doc), else
        None. A view, not a copy: the next history entry is joined from them."""
        v = self._d.get(name)
        return memoryview(self._buf)[v[0]:v[1]] if type(v) is _Span else None

    @property
    def decoded(self) -> int:
        """How many objects were decoded (for tests and logs)."""
        return sum(type(v) is not _Span for v in self._d.values())


def _decoder(family: str, kind: str):
    def decode(text: bytes, name: str):
        table = {"family": family, "name": "x", "comment": None, "chains": [], "sets": []}
        table[kind].append(json.loads(text))
        objs = getattr(ruleset_from_json({"formatVersion": 1, "owners": {}, "tables": [table]})
                       .tables[family], kind)
        if list(objs) != [name]:
            raise SerializeError(f"ruleset: the {kind[:-1]} indexed as {name!r} is named {list(objs)}")
        return objs[name]
    return decode


def _spans(buf: bytes, pattern: re.Pattern, start: int, end: int) -> dict | None:
    """{name: (start, end)} of the objects of one JSON array [start, end) whose every
    member opens with `pattern`; None when the text is not laid out that way."""
    if start == end:
        return {}
    starts = [m.start() for m in pattern.finditer(buf, start, end)]
    if not starts or starts[0] != start:
        return None
    out: dict = {}
    for i, a in enumerate(starts):
        b = starts[i + 1] - 1 if i + 1 < len(starts) else end
        if (i + 1 < len(starts) and buf[b] != 0x2C) or buf[b - 1] != 0x7D:  # ',' between, '}' closing
            return None
        # a chain's name comes before its rules; a set's after its elements: either way
        # the object's only unescaped `"name":"` (rules and elements have no name key)
        p = buf.find(b'"name":"', a, b) if pattern is _CHAIN_START else buf.rfind(b'"name":"', a, b)
        m = _NAME_AT.match(buf, p) if p >= 0 else None
        name = m.group(1).decode("ascii") if m is not None else None
        if name is None or name in out:
            return None
        out[name] = (a, b)
    return out


def lazy_ruleset(buf: bytes, start: int = 0, end: int | None = None) -> Ruleset | None:
    """The ruleset of the canonical digest form in buf[start:end] (module doc), decoded
    lazily (offsets into `buf`: no copy of a 20 MB body is made); None when the text is
    not laid out as digest_bytes writes it."""
    end = len(buf) if end is None else end
    if not buf.startswith(_HEAD, start):
        return None
    t_at = buf.find(_TABLES, start, end)
    if t_at < 0:
        return None
    try:
        owners = json.loads(buf[start + len(_HEAD):t_at + 1])
    except ValueError:
        return None
    if not isinstance(owners, dict) or not all(type(v) is str for v in owners.values()):
        return None
    rs = Ruleset(owners=owners)
    pos = t_at + len(_TABLES)
    if not buf.endswith(_END, start, end):
        return None
    while True:
        if not buf.startswith(b'{"chains":[', pos, end):
            return None
        chains_at = pos + len(b'{"chains":[')
        mid = _TABLE_MID.search(buf, chains_at, end)
        if mid is None:
            return None
        nxt = buf.find(_NEXT_TABLE, mid.end(), end)
        last = nxt < 0
        sets_end = end - len(_END) if last else nxt
        chains = _spans(buf, _CHAIN_START, chains_at, mid.start())
        sets = _spans(buf, _SET_START, mid.end(), sets_end)
        family = mid.group(2).decode("ascii")
        if chains is None or sets is None or family in rs.tables:
            return None
        comment = json.loads(mid.group(1))
        rs.tables[family] = Table(family, mid.group(3).decode("ascii"), comment,
                                  LazyObjects(buf, chains, _decoder(family, "chains")),
                                  LazyObjects(buf, sets, _decoder(family, "sets")))
        if last:
            return rs
        pos = nxt + len(b']},')
