"""A history entry's ruleset as JSON Lines (state/README.md): written by `ruleset_lines`,
read by `read_ruleset`. The lines are the ruleset's canonical pieces (owners, each table,
its chains and sets by name, each set's elements by key, one per line), so the entry's
digest is checked over them without decoding them. Read lazily, a chain or set is decoded
when first read, and a big set's elements one by one (`LazyElements`).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import MutableMapping
from json.encoder import encode_basestring_ascii

from reconciler.compile import Element, Ruleset, SerializeError, Table, canonical_json, element_to_json, \
    form_parts, parts_digest, ruleset_from_json

# A line that opens a piece, from the newline before it: canonical JSON holds no raw
# newline, so "\n[" only opens a line; element lines open with '{'.
_PIECE = re.compile(rb'\n\["(owners|table|chain|set)",(?:"([^"\\]*)",(?:"([^"\\]*)",)?)?')
_STR = re.compile(rb'"(?:[^"\\]|\\.)*",')
_NL = re.compile(rb"\n")
# A set whose element lines take this many bytes gets them lazily (LazyElements); a
# smaller one is decoded whole when read (cheaper than finding its elements one by one).
LAZY_ELEMENTS_BYTES = 64 * 1024


def ruleset_lines(owners: bytes, tables: list):
    """The lines of a ruleset from its `compile.digest_pieces`, as parts to write."""
    yield b'["owners",' + bytes(owners) + b"]\n"
    for family, name, comment, chains, sets in tables:
        fam = canonical_json(family) + b","
        yield b'["table",' + fam + canonical_json({"comment": comment, "name": name}) + b"]\n"
        for n, body in chains:
            yield b"".join((b'["chain",', fam, _name(n), body, b"]\n"))
        for n, head, lines in sets:
            yield b"".join((b'["set",', fam, _name(n), head, b"]\n"))
            if lines:
                yield lines
                yield b"\n"


def _name(name: str) -> bytes:
    """canonical_json(name) + b",", for a name."""
    return (encode_basestring_ascii(name) + ",").encode("ascii")


def read_ruleset(buf: bytes, start: int, digest: str, *, lazy: bool) -> Ruleset:
    """The ruleset of the lines in buf[start:], checked against `digest` (the sha256 of
    its digest form); chains and sets decoded when first read when `lazy`.
    SerializeError when the lines are not as ruleset_lines writes them or do not match."""
    if not buf.endswith(b"\n") or (start < len(buf) and buf[start - 1:start] != b"\n"):
        raise SerializeError("ruleset lines: the text does not end with a line")
    marks = list(_PIECE.finditer(buf, start - 1))
    if not marks or marks[0].start() != start - 1:
        raise SerializeError("ruleset lines: the first line is not the owners line")
    ends = [m.start() for m in marks[1:]] + [len(buf) - 1]
    owners = None
    tables: list = []  # [family, name, comment, {chain: (a, b)}, {set: (a, b, c, d)}]
    chains = sets = last = None
    for m, end in zip(marks, ends):
        kind, family, name = m.groups()
        eol = buf.find(b"\n", m.end())
        if buf[eol - 1] != 0x5D or (kind != b"set" and eol != end):  # ']' closes the line; only sets have more
            raise SerializeError(f"ruleset lines: a {kind.decode()} line at byte {m.start() + 1} is damaged")
        at = m.end()
        if family is not None:
            family = family.decode("ascii")  # canonical JSON is ASCII; no escapes matched
        if kind in (b"chain", b"set"):
            if name is None:  # a family or name spelled with escapes
                (family, name), at = _strings(buf, m.start() + len(kind) + 5, 2)
            else:
                name = name.decode("ascii")
            if not tables or tables[-1][0] != family:
                raise SerializeError(f"ruleset lines: {kind.decode()} {name!r} is not of its table")
            objs = chains if kind == b"chain" else sets
            if objs and name <= last[kind == b"set"]:
                raise SerializeError(f"ruleset lines: {kind.decode()} {name!r} is out of order")
            last[kind == b"set"] = name
            objs[name] = (at, eol - 1) if kind == b"chain" else (at, eol - 1, eol + 1, max(eol, end))
        elif kind == b"table":
            if family is None:
                (family,), at = _strings(buf, m.end(), 1)
            d = json.loads(buf[at:eol - 1])
            if not isinstance(d, dict) or set(d) != {"comment", "name"} or type(d["name"]) is not str \
                    or type(d["comment"]) not in (str, type(None)) or (tables and tables[-1][0] >= family):
                raise SerializeError(f"ruleset lines: the table line of family {family!r} is damaged or out of order")
            chains, sets, last = {}, {}, [None, None]
            tables.append([family, d["name"], d["comment"], chains, sets])
        elif owners is not None or tables:
            raise SerializeError("ruleset lines: the owners line is not first, or not alone")
        else:
            owners = (at, eol - 1)
    if owners is None:
        raise SerializeError("ruleset lines: no owners line")
    view = memoryview(buf)
    pieces = [(f, n, c, [(k, view[a:b]) for k, (a, b) in chains.items()],
               [(k, view[a:b], view[c:d]) for k, (a, b, c, d) in sets.items()]) for f, n, c, chains, sets in tables]
    if parts_digest(form_parts(view[owners[0]:owners[1]], pieces)) != digest:
        raise SerializeError("ruleset lines: the lines do not match the recorded digest (edited or damaged)")
    del pieces, view
    rs = Ruleset(owners=json.loads(buf[owners[0]:owners[1]]))
    if type(rs.owners) is not dict or not all(type(v) is str for v in rs.owners.values()):
        raise SerializeError("ruleset lines: the owners line is not an object of strings")
    for family, name, comment, chains, sets in tables:
        rs.tables[family] = t = Table(family, name, comment, LazyObjects(buf, chains, _decoder(family, "chains", lazy)),
                                      LazyObjects(buf, sets, _decoder(family, "sets", lazy)))
        if not lazy:
            t.chains, t.sets = dict(t.chains.items()), dict(t.sets.items())
    return rs


class _Span(tuple):
    """Where an undecoded object lies in the text (a type of its own, so that no decoded
    value is ever taken for one)."""


class LazyObjects(MutableMapping):
    """name -> Chain or NamedSet, decoded on first access; iteration is by name."""

    __slots__ = ("_d", "_buf", "_view", "_decode")

    def __init__(self, buf: bytes, spans: dict, decode):
        self._buf, self._view = buf, memoryview(buf)
        self._decode = decode
        self._d: dict = {name: _Span(span) for name, span in spans.items()}

    def __getitem__(self, name):
        v = self._d[name]
        if type(v) is _Span:
            v = self._d[name] = self._decode(self._buf, v, name)
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

    def raw(self, name):
        """The recorded bytes of `name` while it was never decoded, as compile.digest_pieces
        takes them (a chain's; a set's without elements and its element lines), else None.
        Views, not copies. A decoded object may have been changed in place: it is encoded."""
        v = self._d.get(name)
        if type(v) is not _Span:
            return None
        view = self._view
        return view[v[0]:v[1]] if len(v) == 2 else (view[v[0]:v[1]], view[v[2]:v[3]])

    @property
    def decoded(self) -> int:
        """How many objects were decoded (for tests and logs)."""
        return sum(type(v) is not _Span for v in self._d.values())


def _decoder(family: str, kind: str, lazy: bool):
    def decode(buf: bytes, span: tuple, name: str):
        d = json.loads(buf[span[0]:span[1]])
        if kind == "chains":
            return _one(family, kind, d, name)
        a, b = span[2], span[3]

        def full():
            return _one(family, kind, dict(d, elements=_elements(buf, a, b)), name).elements

        if lazy and b - a >= LAZY_ELEMENTS_BYTES:
            s = _one(family, kind, d, name)
            s.elements = LazyElements(buf, a, b, full)
            return s
        return _one(family, kind, dict(d, elements=_elements(buf, a, b)), name)
    return decode


def _strings(buf: bytes, at: int, n: int) -> tuple[list, int]:
    """The `n` JSON strings at buf[at:], each followed by ',', and where they end."""
    out = []
    for _ in range(n):
        m = _STR.match(buf, at)
        if m is None:
            raise SerializeError(f"ruleset lines: no string at byte {at}")
        out.append(json.loads(buf[at:m.end() - 1]))
        at = m.end()
    return out, at


def _elements(buf: bytes, a: int, b: int) -> list:
    """The element lines buf[a:b], decoded."""
    return json.loads(b"[" + buf[a:b].replace(b"\n", b",") + b"]") if a < b else []


def _one(family: str, kind: str, d, name: str):
    """The chain or set of JSON form `d`, decoded with all of ruleset_from_json's checks."""
    if not isinstance(d, dict):
        raise SerializeError(f"ruleset: the {kind[:-1]} {name!r} is not a JSON object")
    table = {"family": family, "name": "x", "comment": None, "chains": [], "sets": []}
    table[kind].append(d)
    objs = getattr(ruleset_from_json({"formatVersion": 1, "owners": {}, "tables": [table]}).tables[family], kind)
    if list(objs) != [name]:
        raise SerializeError(f"ruleset: the {kind[:-1]} indexed as {name!r} is named {list(objs)}")
    return objs[name]


class _Lazy:
    """A sequence of n items computed on demand by `at(i)`: bisect over the keys of a
    sorted text's lines decodes only the lines it visits (bisect's key= is Python 3.10's)."""

    def __init__(self, n: int, at):
        self.n, self.at = n, at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.at(i)


class LazyElements(MutableMapping):
    """A recorded set's elements (key -> Element) in its element lines buf[start:end]: one
    is found as `"key":<canonical key>` (only its line holds that: no JSON string holds an
    unescaped '"') and decoded alone; changes are kept aside. Iteration, len and == decode
    the whole set through `full` and replay the changes; `lines()` gives the lines as the
    elements now are without decoding the rest."""

    __slots__ = ("_buf", "_start", "_end", "_full", "_d", "_now", "_log", "_starts")

    def __init__(self, buf: bytes, start: int, end: int, full) -> None:
        self._buf, self._start, self._end, self._full = buf, start, end, full
        self._d: dict | None = None  # every element, once decoded
        self._now: dict = {}  # key -> its Element, or None when deleted (changes since read)
        self._log: list = []  # (key, Element or None) in the order made (dict order on replay)
        self._starts: list[int] | None = None  # where each line opens (lines())

    def _whole(self) -> dict:
        if self._d is None:
            d = self._full()
            for k, e in self._log:
                if e is None:
                    del d[k]
                else:
                    d[k] = e
            self._d = d
            self._now = self._log = None
        return self._d

    def _raw(self, key) -> Element | None:
        """The recorded element keyed `key`, or None."""
        if type(key) is not tuple or not all(type(x) is str for x in key):
            return None
        buf = self._buf
        p = buf.find(b'"key":' + canonical_json(list(key)), self._start, self._end)
        if p < 0:
            return None
        a = buf.rfind(b"\n", self._start, p) + 1 or self._start
        b = buf.find(b"\n", p, self._end)
        d = json.loads(buf[a:self._end if b < 0 else b])
        if not (type(d) is dict and len(d) == 3 and d.get("key") == list(key)
                and all(v is None or type(v) is str for v in (d.get("value"), d.get("comment")))):
            raise SerializeError(f"ruleset: a recorded element keyed {list(key)} has the wrong shape")
        return Element(key, d["value"], d["comment"])

    def __getitem__(self, key):
        if self._d is not None:
            return self._d[key]
        if key in self._now:
            e = self._now[key]
        else:
            e = self._now[key] = self._raw(key)  # kept: read once (a change replaces it)
        if e is None:
            raise KeyError(key)
        return e

    def __contains__(self, key) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __setitem__(self, key, e) -> None:
        if self._d is not None:
            self._d[key] = e
            return
        self._now[key] = e
        self._log.append((key, e))

    def __delitem__(self, key) -> None:
        if self._d is not None:
            del self._d[key]
            return
        self[key]  # KeyError when absent
        self._now[key] = None
        self._log.append((key, None))

    def __iter__(self):
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())

    def copy(self):
        """A copy to change (the recorded lines shared); a dict once decoded."""
        if self._d is not None:
            return dict(self._d)
        c = LazyElements(self._buf, self._start, self._end, self._full)
        c._now, c._log, c._starts = dict(self._now), list(self._log), self._starts
        return c

    def lines(self):
        """The element lines as the elements now are (sorted by key); None once decoded whole."""
        if self._d is not None:
            return None
        buf, start, end = self._buf, self._start, self._end
        changed = {k: e for k, e in self._now.items() if e != self._raw(k)}  # unlike the text
        if not changed:
            return memoryview(buf)[start:end]
        if self._starts is None:
            self._starts = [start] + [m.end() for m in _NL.finditer(buf, start, end)]
        starts = self._starts
        n = len(starts)

        def line(i: int) -> bytes:
            return buf[starts[i]:starts[i + 1] - 1 if i + 1 < n else end]

        def key_at(i: int) -> tuple:
            return tuple(json.loads(line(i))["key"])

        keys = _Lazy(n, key_at)
        edits = []  # (index in the text, key, Element or None, replaces the element there)
        for k, e in changed.items():
            i = bisect_left(keys, k)
            edits.append((i, k, e, i < n and key_at(i) == k))
        edits.sort(key=lambda x: (x[0], x[1]))
        out: list[bytes] = []
        done = 0  # the text's lines before this index are in `out`
        for i, k, e, replaces in edits:
            if i > done:
                out.append(buf[starts[done]:starts[i] - 1 if i < n else end])
            done = max(done, i + 1 if replaces else i)
            if e is not None:
                out.append(canonical_json(element_to_json(e)))
        if done < n:
            out.append(buf[starts[done]:end])
        return b"\n".join(out)
