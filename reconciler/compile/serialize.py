"""A `Ruleset` as JSON (state history, saved plans) and its digest. Every model field is
present, so `ruleset_from_json(ruleset_to_json(rs)) == rs`, creation order included.
`digest(rs)` is the sha256 of the canonical form: chains and sets also sorted by name,
sorted keys, compact separators, ASCII escapes, so equal rulesets (dicts compare
unordered) have equal digests. The reader checks structure and types, not nft syntax."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from reconciler.compile.ruleset import BaseHook, Chain, Element, NamedSet, Rule, Ruleset, Table

# {"formatVersion": 1, "owners": {object id: Service key}, "tables": [{"family", "name",
#  "comment", "chains": [{"name", "comment", "base": {"type", "hook", "priority"} | null,
#  "rules": [{"body", "comment"}]}], "sets": [{"name", "type", "valueType", "flags",
#  "timeout", "comment", "typeof" (when true), "size" (when set), "elements": [{"key",
#  "value", "comment"}] (sorted by key)}]}] (sorted by family); unset fields are null.
FORMAT_VERSION = 1


class SerializeError(ValueError):
    """A JSON document that is not a serialised Ruleset of a version we read."""


# --- writing ---------------------------------------------------------------------------


def _chain_to_json(c: Chain) -> dict:
    base = None
    if c.base is not None:
        base = {"type": c.base.type, "hook": c.base.hook, "priority": c.base.priority}
    return {
        "name": c.name,
        "comment": c.comment,
        "base": base,
        "rules": [{"body": r.body, "comment": r.comment} for r in c.rules],
    }


def _set_to_json(s: NamedSet) -> dict:
    elements = sorted(s.elements.values(), key=lambda e: e.key)
    return {
        "name": s.name,
        "type": s.type,
        "valueType": s.value_type,
        "flags": list(s.flags),
        "timeout": s.timeout,
        "comment": s.comment,
        **({"typeof": True} if s.typeof else {}),  # absent: old state files stay readable
        **({"size": s.size} if s.size is not None else {}),  # likewise
        "elements": [element_to_json(e) for e in elements],
    }


def element_to_json(e: Element) -> dict:
    """One set element's JSON form (in `_set_to_json`'s elements)."""
    return {"key": list(e.key), "value": e.value, "comment": e.comment}


def ruleset_to_json(rs: Ruleset) -> dict:
    """The documented JSON form (a dict of plain JSON types); see the module docstring."""
    tables = []
    for family in sorted(rs.tables):
        t = rs.tables[family]
        if t.family != family:
            # The model keys tables by family; a mismatch would not read back the same.
            raise SerializeError(f"table {t.name!r} is filed under family {family!r} but says {t.family!r}")
        tables.append({
            "family": t.family,
            "name": t.name,
            "comment": t.comment,
            "chains": [_chain_to_json(c) for c in t.chains.values()],
            "sets": [_set_to_json(s) for s in t.sets.values()],
        })
    return {"formatVersion": FORMAT_VERSION, "tables": tables, "owners": dict(rs.owners)}


def canonical_json(obj: Any) -> bytes:
    """The byte form digests are taken of: sorted keys, no whitespace, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def digest(rs: Ruleset) -> str:
    """sha256 hex of the canonical JSON of `rs` (chains and sets sorted by name)."""
    return parts_digest(digest_parts(rs))


def parts_digest(parts) -> str:
    """sha256 hex of the concatenation of `parts` (digest_parts), hashed one by one."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


def digest_json(doc: dict) -> str:
    """digest() of a ruleset already in its JSON form (`ruleset_to_json`)."""
    return hashlib.sha256(digest_form(doc)).hexdigest()


def digest_bytes(rs: Ruleset) -> bytes:
    """digest_form(ruleset_to_json(rs)), byte for byte: the join of digest_parts(rs)."""
    return b"".join(digest_parts(rs))


def digest_parts(rs: Ruleset) -> list:
    """digest_bytes(rs) as a list of byte strings whose concatenation it is, without
    holding the whole JSON document at once (form_parts of digest_pieces)."""
    return form_parts(*digest_pieces(rs))


def digest_pieces(rs: Ruleset) -> tuple[bytes, list]:
    """The canonical bytes of `rs` piece by piece (canonical JSON is compositional:
    sorted keys, no whitespace): (owners, [(family, name, comment, [(chain name, bytes)],
    [(set name, the set without elements, its elements one per line)])]), tables by
    family, chains and sets by name, elements by key. A lazily read ruleset
    (engine/recorded.py) hands back the recorded bytes of what it never decoded."""
    enc = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode
    tables = []
    for family in sorted(rs.tables):
        t = rs.tables[family]
        if t.family != family:
            raise SerializeError(f"table {t.name!r} is filed under family {family!r} but says {t.family!r}")
        raw_chain = getattr(t.chains, "raw", lambda name: None)
        raw_set = getattr(t.sets, "raw", lambda name: None)
        chains = [(n, raw_chain(n) or enc(_chain_to_json(t.chains[n])).encode("ascii")) for n in sorted(t.chains)]
        sets = [(n, *(raw_set(n) or _set_pieces(t.sets[n], enc))) for n in sorted(t.sets)]
        tables.append((t.family, t.name, t.comment, chains, sets))
    return _owners_bytes(rs.owners, enc), tables


def _set_pieces(s: NamedSet, enc) -> tuple[bytes, bytes]:
    """(the set without elements, its elements one per line); a recorded set's elements
    read lazily give their lines as they now are (engine/recorded.LazyElements)."""
    lines = getattr(s.elements, "lines", lambda: None)()
    if lines is None:  # one encoder call; '},{"' only ever joins two elements (flat objects)
        array = enc([element_to_json(e) for e in sorted(s.elements.values(), key=lambda e: e.key)])
        lines = array[1:-1].replace('},{"', '}\n{"').encode("ascii")
    return enc(_set_to_json(s.with_elements({}))).encode("ascii"), lines


_NO_ELEMENTS = b'"elements":[]'  # in a canonical set without elements (no string holds an unescaped '"')


def form_parts(owners: bytes, tables: list) -> list:
    """The digest form (digest_bytes) as a list of parts, from digest_pieces' pieces."""
    enc = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode
    parts = [b'{"formatVersion":', enc(FORMAT_VERSION).encode("ascii"), b',"owners":', owners, b',"tables":[']
    for i, (family, name, comment, chains, sets) in enumerate(tables):
        parts.append(b',{"chains":[' if i else b'{"chains":[')
        for j, (_, body) in enumerate(chains):
            parts += (b",", body) if j else (body,)
        parts.append(f'],"comment":{enc(comment)},"family":{enc(family)},"name":{enc(name)},"sets":['
                     .encode("ascii"))
        for j, (_, head, lines) in enumerate(sets):
            head = bytes(head)
            at = head.index(_NO_ELEMENTS) + len(_NO_ELEMENTS) - 1
            parts += (b"," if j else b"", head[:at], bytes(lines).replace(b"\n", b","), head[at:])
        parts.append(b"]}")
    parts.append(b"]}")
    return parts


_OWNERS_CHUNK = 4096


def _owners_bytes(owners: dict, enc) -> bytes:
    """enc(owners), byte for byte, in chunks of sorted keys: one encoder call over a big
    table holds the GIL for long, which `nftrec watch`'s state writer thread
    (daemon/statewriter.py) would make a sync wait for; a chunk is short."""
    if len(owners) <= _OWNERS_CHUNK:
        return enc(owners).encode("ascii")
    keys = sorted(owners)
    chunks = (enc({k: owners[k] for k in keys[i:i + _OWNERS_CHUNK]})[1:-1] for i in range(0, len(keys), _OWNERS_CHUNK))
    return ("{" + ",".join(chunks) + "}").encode("ascii")


def digest_form(doc: dict) -> bytes:
    """The bytes a ruleset's digest is the sha256 of: its JSON form (left as it is) with
    chains and sets sorted by name, as canonical_json. Also a valid serialised ruleset
    (the state's history files hold exactly these bytes)."""
    tables = [{**t, "chains": sorted(t["chains"], key=lambda c: c["name"]),
               "sets": sorted(t["sets"], key=lambda s: s["name"])} for t in doc["tables"]]
    return canonical_json({**doc, "tables": tables})


# --- reading ---------------------------------------------------------------------------
# Small typed getters, so a damaged document fails with the JSON path of the bad field.


def _field(d: Any, key: str, types: type | tuple[type, ...], where: str, nullable: bool = False) -> Any:
    if not isinstance(d, dict):
        raise SerializeError(f"{where}: expected an object, found {type(d).__name__}")
    if key not in d:
        raise SerializeError(f"{where}: missing field {key!r}")
    v = d[key]
    if v is None and nullable:
        return None
    # bool is an int subclass in Python; a JSON true is never a priority or a timeout.
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in _as_tuple(types)):
        want = "/".join(t.__name__ for t in _as_tuple(types)) + (" or null" if nullable else "")
        raise SerializeError(f"{where}.{key}: expected {want}, found {type(v).__name__}")
    return v


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _str_list(d: dict, key: str, where: str) -> tuple[str, ...]:
    items = _field(d, key, list, where)
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise SerializeError(f"{where}.{key}[{i}]: expected str, found {type(x).__name__}")
    return tuple(items)


def _chain_from_json(d: Any, where: str) -> Chain:
    base_d = _field(d, "base", dict, where, nullable=True)
    base = None
    if base_d is not None:
        w = f"{where}.base"
        base = BaseHook(
            type=_field(base_d, "type", str, w),
            hook=_field(base_d, "hook", str, w),
            priority=_field(base_d, "priority", int, w),
        )
    rules = []
    for i, r in enumerate(_field(d, "rules", list, where)):
        w = f"{where}.rules[{i}]"
        rules.append(Rule(body=_field(r, "body", str, w), comment=_field(r, "comment", str, w, nullable=True)))
    return Chain(
        name=_field(d, "name", str, where),
        rules=tuple(rules),
        base=base,
        comment=_field(d, "comment", str, where, nullable=True),
    )


def _set_from_json(d: Any, where: str) -> NamedSet:
    s = NamedSet(
        name=_field(d, "name", str, where),
        type=_field(d, "type", str, where),
        value_type=_field(d, "valueType", str, where, nullable=True),
        flags=_str_list(d, "flags", where),
        timeout=_field(d, "timeout", int, where, nullable=True),
        comment=_field(d, "comment", str, where, nullable=True),
        typeof=d.get("typeof", False) is True,
        size=_field(d, "size", int, where) if "size" in d else None,
    )
    elements = _field(d, "elements", list, where)
    fast = _elements_fast(elements)
    if fast is not None and len(fast) == len(elements):
        s.elements = fast
        return s
    for i, e in enumerate(elements):
        w = f"{where}.elements[{i}]"
        el = Element(
            key=_str_list(e, "key", w),
            value=_field(e, "value", str, w, nullable=True),
            comment=_field(e, "comment", str, w, nullable=True),
        )
        if el.key in s.elements:
            raise SerializeError(f"{w}: duplicate key {list(el.key)} in set {s.name!r}")
        s.add(el)
    return s


def _elements_fast(elements: list) -> dict | None:
    """The elements of a well-formed document (nftrec's own files) with one type check per
    field and no per-field error text; None when anything is off, and the caller's
    checking loop names the bad field."""
    out = {}
    try:
        for e in elements:
            key, value, comment = tuple(e["key"]), e["value"], e["comment"]
            if not (all(type(x) is str for x in key) and (value is None or type(value) is str)
                    and (comment is None or type(comment) is str)) or len(e) != 3:
                return None
            out[key] = Element(key, value, comment)
    except (KeyError, TypeError):
        return None
    return out


def ruleset_from_json(d: Any) -> Ruleset:
    """Rebuild a Ruleset; `SerializeError` names the first bad field by its JSON path."""
    version = _field(d, "formatVersion", int, "ruleset")
    if version != FORMAT_VERSION:
        raise SerializeError(
            f"ruleset: formatVersion {version} is not one this nftrec reads (it reads {FORMAT_VERSION})"
        )
    rs = Ruleset()
    for i, t in enumerate(_field(d, "tables", list, "ruleset")):
        where = f"ruleset.tables[{i}]"
        table = Table(
            family=_field(t, "family", str, where),
            name=_field(t, "name", str, where),
            comment=_field(t, "comment", str, where, nullable=True),
        )
        if table.family in rs.tables:
            raise SerializeError(f"{where}: a second table for family {table.family!r}")
        for j, c in enumerate(_field(t, "chains", list, where)):
            chain = _chain_from_json(c, f"{where}.chains[{j}]")
            if chain.name in table.chains:
                raise SerializeError(f"{where}.chains[{j}]: duplicate chain {chain.name!r}")
            table.chains[chain.name] = chain
        for j, s in enumerate(_field(t, "sets", list, where)):
            named = _set_from_json(s, f"{where}.sets[{j}]")
            if named.name in table.sets:
                raise SerializeError(f"{where}.sets[{j}]: duplicate set {named.name!r}")
            table.sets[named.name] = named
        rs.tables[table.family] = table
    owners = _field(d, "owners", dict, "ruleset")
    for k, v in owners.items():
        if not isinstance(v, str):
            raise SerializeError(f"ruleset.owners[{k!r}]: expected str, found {type(v).__name__}")
    rs.owners = dict(owners)
    return rs
