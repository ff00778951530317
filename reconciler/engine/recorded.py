"""The recorded ruleset read lazily: a one-Service `apply` looks at a few chains and sets
of the last applied ruleset, so only those are decoded.

A history entry's body is the ruleset's digest form (`compile.digest_bytes`: canonical
JSON, chains and sets sorted by name). `lazy_ruleset(text)` indexes where each chain and
set lies in that text without decoding it, and returns a `Ruleset` whose tables' `chains`
and `sets` are `LazyObjects`: a mapping that decodes an object (through
`compile.ruleset_from_json`, with all its checks) the first time it is read. At 10,000
Services that replaces a 1.3-3 s decode of 19,000 chains and 5,000 sets by an index of a
few ms, plus the handful of objects the change touches.

A set whose elements take LAZY_ELEMENTS_BYTES or more (at 10,000 Services the static
sets cluster-ips, service-ips and service-nodeports: 3,000-11,000 elements each) gets
them as `LazyElements`: an element is found by its key in the text and decoded alone,
changes are kept aside, and the set's next history bytes are its recorded ones with the
changed elements cut out and spliced in (`LazyElements.encoded`). A one-Service change
then reads and writes a handful of its elements; anything needing all of them (iterating,
len) decodes the set whole, with the changes replayed.

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
from bisect import bisect_left
from collections.abc import MutableMapping

from reconciler.compile import Element, Ruleset, SerializeError, Table, canonical_json, element_to_json, \
    ruleset_from_json

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
            v = self._d[name] = self._decode(self._buf, v[0], v[1], name)
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
    def decode(buf: bytes, a: int, b: int, name: str):
        elements = None
        if kind == "sets":
            m = _SET_START.match(buf, a, b)
            e_end = buf.find(_ELEMENTS_END, m.end(), b) if m is not None else -1
            if e_end < 0:
                raise SerializeError(f"ruleset: the set indexed as {name!r} has no elements array")
            if e_end - m.end() >= LAZY_ELEMENTS_BYTES:
                elements = (m.end(), e_end)
                text = buf[a:m.end()] + buf[e_end:b]  # the set without its elements
            else:
                text = buf[a:b]
        else:
            text = buf[a:b]
        obj = _one(family, kind, json.loads(text), name)
        if elements is not None:
            obj.elements = LazyElements(buf, *elements, lambda: _one(family, kind, json.loads(buf[a:b]), name).elements)
        return obj
    return decode


def _one(family: str, kind: str, d, name: str):
    """The chain or set of JSON form `d`, decoded with all of ruleset_from_json's checks."""
    table = {"family": family, "name": "x", "comment": None, "chains": [], "sets": []}
    table[kind].append(d)
    objs = getattr(ruleset_from_json({"formatVersion": 1, "owners": {}, "tables": [table]}).tables[family], kind)
    if list(objs) != [name]:
        raise SerializeError(f"ruleset: the {kind[:-1]} indexed as {name!r} is named {list(objs)}")
    return objs[name]


# A set whose elements take this many bytes gets them lazily (LazyElements): at 10,000
# Services the static sets a Service has elements in (cluster-ips, service-ips,
# service-nodeports) hold 3,000-11,000 elements each (~1 MB), of which a one-Service
# change reads and replaces a handful. Below it a set is decoded whole (cheaper than
# indexing it).
LAZY_ELEMENTS_BYTES = 64 * 1024
_ELEMENTS_END = b'],"flags":['  # a set's keys are sorted: "elements" is followed by "flags"
_ELEMENT_START = re.compile(rb'\{"comment":')


class LazyElements(MutableMapping):
    """A recorded set's elements (key -> Element) read from the canonical text of its
    JSON array, buf[start:end] (sorted by key, as compile.digest_bytes writes it): an
    element is found by its key and decoded alone; changes are kept aside (`_log`). Anything
    that needs every element (iteration, len, ==) decodes the whole set once through
    `full` (every check of compile.ruleset_from_json) and replays the changes on it, so
    the dict is what the eager reader plus the same changes gives, in the same order.
    `encoded()` gives the canonical bytes of the changed array without decoding it, for
    the next history entry (compile.digest_parts).

    Why searching the text is exact: as in the module doc, a pattern holding an
    unescaped `"` matches structure only; an element's key is found as
    `"key":<its canonical JSON>,"value":`, which only that element's text holds."""

    __slots__ = ("_buf", "_start", "_end", "_full", "_d", "_now", "_log", "_starts")

    def __init__(self, buf: bytes, start: int, end: int, full) -> None:
        self._buf, self._start, self._end, self._full = buf, start, end, full
        self._d: dict | None = None  # every element, once decoded
        self._now: dict = {}  # key -> its Element, or None when deleted (changes since read)
        self._log: list = []  # (key, Element or None) in the order made (dict order on replay)
        self._starts: list[int] | None = None  # where each element opens (encoded())

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

    def _span(self, key) -> tuple[int, int] | None:
        """(start, end) of the element keyed `key` in the text, or None."""
        if type(key) is not tuple or not all(type(x) is str for x in key):
            return None
        p = self._buf.find(b'"key":' + canonical_json(list(key)) + b',"value":', self._start, self._end)
        if p < 0:
            return None
        a = self._buf.rfind(b'{"comment":', self._start, p)
        b = self._buf.find(b'},{"comment":', p, self._end)
        return a, (self._end if b < 0 else b + 1)

    def _raw(self, key) -> Element | None:
        span = self._span(key)
        if span is None:
            return None
        d = json.loads(self._buf[span[0]:span[1]])
        k, value, comment = d["key"], d["value"], d["comment"]
        if not (len(d) == 3 and type(k) is list and tuple(k) == key and (value is None or type(value) is str)
                and (comment is None or type(comment) is str)):
            raise SerializeError(f"ruleset: a recorded element keyed {list(key)} has the wrong shape")
        return Element(key, value, comment)

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
        """A copy to change (the recorded text shared); a dict once decoded."""
        if self._d is not None:
            return dict(self._d)
        c = LazyElements(self._buf, self._start, self._end, self._full)
        c._now, c._log, c._starts = dict(self._now), list(self._log), self._starts
        return c

    def encoded(self) -> bytes | None:
        """The canonical bytes of the array's contents as the elements now are (sorted by
        key, as compile.digest_parts encodes them); None once decoded whole."""
        if self._d is not None:
            return None
        buf, start, end = self._buf, self._start, self._end
        changed = {k: e for k, e in self._now.items() if e != self._raw(k)}  # unlike the text
        if not changed:
            return memoryview(buf)[start:end]
        if self._starts is None:
            self._starts = [m.start() for m in _ELEMENT_START.finditer(buf, start, end)]
        starts = self._starts
        n = len(starts)

        def key_at(i: int) -> tuple:
            return tuple(json.loads(buf[starts[i]:starts[i + 1] - 1 if i + 1 < n else end])["key"])

        edits = []  # (index in the text, key, Element or None, replaces the element there)
        for k, e in changed.items():
            i = bisect_left(range(n), k, key=key_at)
            edits.append((i, k, e, i < n and key_at(i) == k))
        edits.sort(key=lambda x: (x[0], x[1]))
        out: list[bytes] = []
        done = 0  # the text's elements before this index are in `out`
        for i, k, e, replaces in edits:
            if i > done:
                out.append(buf[starts[done]:starts[i] - 1 if i < n else end])
            done = max(done, i + 1 if replaces else i)
            if e is not None:
                out.append(canonical_json(element_to_json(e)))
        if done < n:
            out.append(buf[starts[done]:end])
        return b",".join(out)


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
