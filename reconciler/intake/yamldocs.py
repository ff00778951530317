"""Re-parsing an edited YAML file document by document (watch: one endpoint moved in a
file of 100 EndpointSlices re-parses one document, not 100). `parse(text, known, whole)`
returns what `whole(text)` (parse.parse_yaml) returns, plus this text's segments for the
next call; segments found in `known` (the previous version's) are not parsed again.
"""

# A line that starts with `---` followed by a blank or the line's end is always a document
# start in YAML (libyaml and ruamel's scanner end any scalar there, or refuse the file):
# the text splits there into segments of one document each (the first may hold none:
# comments before the first `---`). Documents do not reach across a `---` (anchors are per
# document), so a segment parsed alone gives the data it gives in the whole file, at
# positions shifted by its first line (columns are unchanged). Each segment is kept by its
# digest, with its document at positions relative to the segment. Anything unusual
# (directives, `...` end markers, line breaks other than `\n`, a segment that fails or
# holds more than one document) parses the whole text, so errors and their positions are
# exactly the whole parser's.

from __future__ import annotations

import hashlib
from bisect import bisect_right
from typing import Callable

Parsed = list  # [(data, line, col, item positions)], parse.parse_yaml's result

# ruamel counts \r, \x85, \u2028, \u2029 as line breaks too; a BOM may restart a stream
_ODD_CHARS = ("\r", "\x85", "\u2028", "\u2029", "\ufeff")


def _line_starts(text: str, marker: str) -> list[int]:
    """Offsets of the lines that start with `marker` followed by a blank or the line's
    end (str.find: a regex over the whole text costs ten times more)."""
    out = []
    k = len(marker)
    i = 0 if text.startswith(marker) else text.find("\n" + marker) + 1 or -1
    while i >= 0:
        if text[i + k:i + k + 1] in ("", " ", "\t", "\n"):
            out.append(i)
        i = text.find("\n" + marker, i) + 1 or -1
    return out


def _key(segment: str) -> bytes:
    return hashlib.blake2b(segment.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def split(text: str) -> list[tuple[int, str]] | None:
    """[(first line, 0-based; segment text)], or None when the text is unusual (module doc)."""
    # `%` directives apply to the next document, `...` ends one without starting another
    # ("%" first: a one-character search, where "\n%" tries every line break)
    if (any(c in text for c in _ODD_CHARS) or ("%" in text and (text.startswith("%") or "\n%" in text))
            or _line_starts(text, "...")):
        return None
    starts = _line_starts(text, "---")
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    out = []
    line = 0
    for a, b in zip(starts, starts[1:] + [len(text)]):
        seg = text[a:b]
        out.append((line, seg))
        line += seg.count("\n")
    return out


def _relative(doc, first: int):
    data, line, col, items = doc
    return data, line - first, col, [(i_line - first, i_col) for i_line, i_col in items] if items else items


def _absolute(doc, first: int):
    data, line, col, items = doc
    return data, line + first, col, [(i_line + first, i_col) for i_line, i_col in items] if items else items


def _whole(text: str, segments: list[tuple[int, str]] | None, whole: Callable[[str], Parsed]) -> tuple[Parsed, dict]:
    """whole(text), and its documents assigned to segments by their first line (no
    segments when that is not one document per explicit segment)."""
    parsed = whole(text)
    if segments is None:
        return parsed, {}
    firsts = [first for first, _ in segments]
    by_segment: dict[int, tuple] = {}
    for doc in parsed:
        i = bisect_right(firsts, doc[1] - 1) - 1  # doc[1] is 1-based
        if i < 0 or i in by_segment:
            return parsed, {}
        by_segment[i] = doc
    known = {}
    for i, (first, seg) in enumerate(segments):
        doc = by_segment.get(i)
        if doc is None and seg.startswith("---"):
            return parsed, {}  # an explicit document start always gives a document
        known[_key(seg)] = None if doc is None else _relative(doc, first)
    return parsed, known


def parse(text: str, known: dict | None, whole: Callable[[str], Parsed]) -> tuple[Parsed, dict]:
    """(what whole(text) returns, this text's segments); module doc. Raises what whole raises."""
    segments = split(text)
    if segments is None or not known:
        return _whole(text, segments, whole)
    out: Parsed = []
    new: dict = {}
    for first, seg in segments:
        k = _key(seg)
        if k in known:
            doc = known[k]
        else:
            try:
                alone = whole(seg)
            except Exception:  # noqa: BLE001 - the whole text's parse reports it, at its position
                return _whole(text, segments, whole)
            if len(alone) > 1 or (not alone and seg.startswith("---")):
                return _whole(text, segments, whole)
            doc = alone[0] if alone else None
        new[k] = doc
        if doc is not None:
            out.append(_absolute(doc, first))
    return out, new
