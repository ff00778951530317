"""The live side: nftrec's tables as a canonical `Ruleset` (rule bodies in ruletext's
normal form, as `canonical` puts a desired Ruleset), its fingerprint, and the generation
token. The listing is nft's text form: nft 1.0.6's JSON drops table and chain comments
and the `dynamic` set flag.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from dataclasses import dataclass, field, replace

from reconciler.compile import FAMILIES, BaseHook, Chain, Element, NamedSet, Rule, Ruleset, Table
from reconciler.kernel.interface import Interface, NftError
from reconciler.kernel.ruletext import PROTOCOL_NAMES, canonical_rule, split_comment


def canonical_rule_obj(rule: Rule) -> Rule:
    return Rule(canonical_rule(rule.body), rule.comment)


def canonical(rs: Ruleset) -> Ruleset:
    """A copy of a (desired) Ruleset with rule bodies in normal form."""
    tables = {}
    for fam, t in rs.tables.items():
        chains = {
            n: replace(c, rules=tuple(canonical_rule_obj(r) for r in c.rules)) for n, c in t.chains.items()
        }
        tables[fam] = Table(t.family, t.name, t.comment, chains, dict(t.sets))
    return Ruleset(tables, dict(rs.owners), focus=rs.focus)


# --- parsing nft's text listing ------------------------------------------------------------

# Stateful objects nft can hold in a table besides chains and sets. nftrec creates none of
# them; one found in our table was added by hand and is deleted like any other stray object.
# (listing keyword, nft command word for `delete <word> <family> <table> <name>`)
OTHER_KINDS = {
    "counter": "counter", "quota": "quota", "limit": "limit", "secmark": "secmark",
    "synproxy": "synproxy", "flowtable": "flowtable",
    "ct helper": "ct helper", "ct timeout": "ct timeout", "ct expectation": "ct expectation",
}


@dataclass
class LiveTable(Table):
    """A table as read from the kernel, with what the desired model never has: `flags`
    (`dormant`: the kernel ignores every hook of the table; `owner`/`persist`: held by
    another process) and `others`, named stateful objects by name → OTHER_KINDS key."""

    flags: tuple[str, ...] = ()
    others: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LiveBaseHook(BaseHook):
    """A base chain's hook as read from the kernel, when its policy is not `accept`
    (nftrec never sets a policy, so the kernel default `accept` is what we want).
    Never equal to a desired `BaseHook`, so diff re-creates the chain."""

    policy: str = "accept"


def table_flags(t: Table) -> tuple[str, ...]:
    return getattr(t, "flags", ())


def table_others(t: Table) -> dict[str, str]:
    return getattr(t, "others", {})


def chain_policy(c: Chain) -> str:
    return getattr(c.base, "policy", "accept") if c.base is not None else "accept"

_DURATION = re.compile(r"(\d+)(d|h|ms|m|s)")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}


def parse_duration(text: str) -> int:
    """`10800s` (numeric time output) or `3h`, `1d2h3m4s` → seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError(f"not an nft duration: {text!r}")
    return int(sum(int(n) * _UNITS[u] for n, u in parts))


# A listing holds every element of the table: the plain case (no quoted comment in the
# text) is split with str methods, the quote-aware scan is kept for the rest.
_ELEMENT_ITEM = re.compile(r'(?:[^,"]+|"[^"]*")+')
_MAP_ARROW = re.compile(r' : (?=(?:[^"]*"[^"]*")*[^"]*$)')
_ELEMENT_COMMENT = re.compile(r'\s+comment\s+"([^"]*)"')
_RUNTIME_ATTRS = re.compile(r"\s+(timeout|expires)\s+\S+")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` (",") outside double quotes."""
    quotes = text.count('"')
    if quotes == 0:
        parts = text.split(sep)
    elif quotes % 2 == 0 and sep == ",":
        parts = _ELEMENT_ITEM.findall(text)  # the runs between commas outside quotes
    else:  # an unbalanced quote: the scan's reading of it
        parts, cur, quoted = [], [], False
        for ch in text:
            if ch == '"':
                quoted = not quoted
            if ch == sep and not quoted:
                parts.append("".join(cur))
                cur = []
            else:
                cur.append(ch)
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _parse_element(text: str, is_map: bool) -> Element:
    value = None
    quoted = '"' in text
    if is_map:
        parts = _MAP_ARROW.split(text, maxsplit=1) if quoted else text.split(" : ", 1)
        text, value = parts[0], (parts[1].strip() if len(parts) > 1 else None)
    comment = None
    m = _ELEMENT_COMMENT.search(text) if quoted else None
    if m:
        comment, text = m.group(1), text[: m.start()] + text[m.end() :]
    # Runtime-only attributes of dynamic elements (never in our desired side).
    if "timeout" in text or "expires" in text:
        text = _RUNTIME_ATTRS.sub("", text)
    key = tuple(p.strip() for p in text.split(" . ")) if " . " in text else (text.strip(),)
    return Element(key, value, comment)


def parse_table(text: str, family: str) -> Table:
    """Parse `list table <family> <name>` output (numeric prio/time) into a Table."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("table "):
        raise ValueError("not an nft table listing")
    name = lines[0].split()[2]
    table = LiveTable(family, name)
    i, n = 1, len(lines)
    while i < n:
        line = lines[i].strip()
        i += 1
        if not line or line == "}":
            continue
        if line.startswith("comment "):
            table.comment = split_comment(" " + line)[1]
            continue
        if line.startswith("flags "):
            table.flags = tuple(f.strip() for f in line[6:].split(","))
            continue
        kind, _, rest = line.partition(" ")
        if kind == "ct":
            sub, _, rest = rest.partition(" ")
            kind = f"ct {sub}"
        obj_name = rest.rsplit(" {", 1)[0].strip()
        body: list[str] = []
        while i < n and lines[i].strip() != "}":
            body.append(lines[i].strip())
            i += 1
        i += 1
        if kind == "chain":
            table.chains[obj_name] = _parse_chain(obj_name, body)
        elif kind in ("set", "map"):
            table.sets[obj_name] = _parse_set(obj_name, kind, body)
        elif kind in OTHER_KINDS:
            table.others[obj_name] = kind
        else:
            raise ValueError(f"unexpected object in table listing: {line!r}")
    if not table.flags and not table.others:  # the usual case: a plain Table, equal to desired's
        return Table(family, name, table.comment, table.chains, table.sets)
    return table


def _parse_chain(name: str, body: list[str]) -> Chain:
    base = comment = None
    rules = []
    for line in body:
        if not line:
            continue
        if line.startswith("type ") and " hook " in line and "priority" in line:
            m = re.match(r"type (\S+) hook (\S+)(?: device \S+)? priority (-?\d+);(?: policy (\w+);)?", line)
            if m is None:
                raise ValueError(f"cannot read base chain {name}: {line!r} (numeric priority expected)")
            policy = m.group(4) or "accept"
            if policy == "accept":
                base = BaseHook(m.group(1), m.group(2), int(m.group(3)))
            else:
                base = LiveBaseHook(m.group(1), m.group(2), int(m.group(3)), policy)
        elif line.startswith('comment "') and not rules:
            comment = split_comment(" " + line)[1]
        else:
            b, c = split_comment(line)
            rules.append(Rule(canonical_rule(b), c))
    return Chain(name, tuple(rules), base, comment)


def _parse_set(name: str, kind: str, body: list[str]) -> NamedSet:
    s = NamedSet(name, "")
    elems_text = None
    j = 0
    while j < len(body):
        line = body[j]
        j += 1
        if line.startswith(("type ", "typeof ")):
            s.typeof = line.startswith("typeof ")
            t = line[7:] if s.typeof else line[5:]
            if kind == "map":
                s.type, _, s.value_type = (x.strip() for x in t.partition(" : "))
            else:
                s.type = t
        elif line.startswith("flags "):
            s.flags = tuple(line[6:].replace(" ", "").split(","))
        elif line.startswith("timeout "):
            s.timeout = parse_duration(line[8:].strip())
        elif line.startswith('comment "'):
            s.comment = split_comment(" " + line)[1]
        elif line.startswith("elements = {"):
            chunk = [line[len("elements = {") :]]
            while not chunk[-1].rstrip().endswith("}") and j < len(body):
                chunk.append(body[j])
                j += 1
            elems_text = " ".join(chunk).rstrip()[:-1]
        # size, policy, gc-interval, auto-merge: kernel/nft defaults we never set
    if elems_text and "dynamic" not in s.flags:  # dynamic sets: filled by the kernel
        if '"' in elems_text or "timeout" in elems_text or "expires" in elems_text:
            for e in _split_top(elems_text):
                el = _parse_element(e, kind == "map")
                s.elements[el.key] = el
        else:
            s.elements = _plain_elements(elems_text, kind == "map")
        if "inet_proto" in s.type and not s.typeof:
            s.elements = _protocol_names(s.elements, s.type)
    return s


def _protocol_names(elements: dict, type_: str) -> dict:
    """`10.96.0.10 . 6 . 53` (nft before 1.0) → `10.96.0.10 . tcp . 53`: the protocol of an
    `inet_proto` key part by name, as nftrec writes it and later nft lists it. Every element
    of a listing spells it alike, so a first element with a name means nothing to do."""
    at = [i for i, part in enumerate(type_.split(" . ")) if part == "inet_proto"]
    first = next(iter(elements.values()), None)
    if first is None or not any(i < len(first.key) and first.key[i] in PROTOCOL_NAMES for i in at):
        return elements
    out = {}
    for e in elements.values():
        key = tuple(PROTOCOL_NAMES.get(k, k) if i in at else k for i, k in enumerate(e.key))
        out[key] = Element(key, e.value, e.comment)
    return out


def _plain_elements(text: str, is_map: bool) -> dict:
    """_parse_element of every element of a list without quotes or runtime attributes
    (nearly all of a big listing's), inlined: key -> Element."""
    out = {}
    strip = str.strip
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        value = None
        if is_map:
            item, _, value = item.partition(" : ")
            value = value.strip() if _ else None
        key = tuple(map(strip, item.split(" . "))) if " . " in item else (item.strip(),)
        out[key] = Element(key, value, None)
    return out


def read_live(nft: Interface, table_name: str) -> Ruleset:
    """nftrec's tables (both families) as a canonical Ruleset; absent tables are absent."""
    from reconciler import progress

    with progress.step(f"listing table {table_name} in the kernel"):
        return parse_live(list_live(nft, table_name), table_name)


def list_live(nft: Interface, table_name: str) -> dict[str, str | None]:
    """nft's listings of nftrec's tables, {family: text or None}: read_live without the
    parse, for a caller that lists on another thread (nft prints outside the GIL)."""
    return {family: nft.list_table(family, table_name) for family in FAMILIES}


def parse_live(listings: dict[str, str | None], table_name: str) -> Ruleset:
    """read_live's Ruleset from list_live's listings."""
    rs = Ruleset()
    for family in FAMILIES:
        text = listings.get(family)
        if text is not None:
            try:
                rs.tables[family] = parse_table(text, family)
            except ValueError as e:
                raise NftError(
                    f"cannot read table {family} {table_name}: {e}. Something other than nftrec "
                    f"put it there; look with `nft list table {family} {table_name}`, delete it by "
                    f"hand, or run `nftrec cleanup` and apply again") from None
    return rs


def read_live_objects(nft: Interface, table_name: str,
                      wanted: dict[str, tuple[list[str], list[NamedSet]]]) -> Ruleset | None:
    """Just these chains and sets of nftrec's tables ({family: (chain names, sets)}), in
    canonical form, in Tables without a comment (nft lists none with an object); None
    when any of them is absent."""
    rs = Ruleset()
    for family, (chains, sets) in wanted.items():
        text = nft.list_objects(family, table_name, chains, sets)
        if text is None:
            return None
        table = Table(family, table_name)
        block: list[str] = []
        for line in text.splitlines() + ["table"]:  # nft prints a `table … {` block per object
            if line.startswith("table") and block:
                try:
                    part = parse_table("\n".join(block), family)
                except ValueError as e:
                    raise NftError(f"cannot read objects of table {family} {table_name}: {e}") from None
                table.chains.update(part.chains)
                table.sets.update(part.sets)
                block = []
            block.append(line)
        rs.tables[family] = table
    return rs


def read_runtime_keys(nft: Interface, family: str, table_name: str, set_name: str) -> list[tuple[str, ...]] | None:
    """The keys a dynamic set (no map, no comments: what an `update` writes) holds right
    now: runtime state, which `read_live` leaves out. None when the table or the set is
    absent. Split with str methods, not `_parse_element`: the shared affinity set holds
    up to millions of entries."""
    text = nft.list_objects(family, table_name, [], [NamedSet(set_name, "")])
    if text is None:
        return None
    at = text.find("elements = {")
    if at < 0:
        return []
    end = text.find("}", at)
    if end < 0:
        raise NftError(f"cannot read the elements of set {set_name} of table {family} {table_name} in nft's listing")
    keys = []
    for item in text[at + len("elements = {"):end].split(","):
        item = item.split(" timeout ", 1)[0].split(" expires ", 1)[0].strip()
        if item:
            keys.append(tuple(item.split(" . ")))
    return keys


# --- fingerprint ---------------------------------------------------------------------------


def fingerprint(live: Ruleset) -> str:
    """sha256 over the canonical live form: order-independent for elements and sets,
    order-dependent for rules; dynamic sets' runtime elements are not part of it."""
    h = hashlib.sha256()
    for fam in sorted(live.tables):
        t = live.tables[fam]
        h.update(f"table {fam} {t.name} {t.comment!r}\n".encode())
        if table_flags(t) or table_others(t):  # only when present: old fingerprints stay valid
            h.update(f"flags {sorted(table_flags(t))} others {sorted(table_others(t).items())}\n".encode())
        for name in sorted(t.chains):
            c = t.chains[name]
            h.update(f"chain {name} {c.base!r} {c.comment!r}\n".encode())
            for r in c.rules:
                h.update(f"  {r.body}\x00{r.comment!r}\n".encode())
        for name in sorted(t.sets):
            s = t.sets[name]
            h.update(f"set {name} {s.type}|{s.value_type}|{sorted(s.flags)}|{s.timeout}|{s.comment!r}\n".encode())
            if "dynamic" in s.flags:
                continue
            for line in sorted(f"{' . '.join(e.key)}|{e.value}|{e.comment}" for e in s.elements.values()):
                h.update(line.encode() + b"\n")
    return h.hexdigest()


# --- the generation token ------------------------------------------------------------------


def kernel_token(nft: Interface) -> int | None:
    """The generation id, bound to this boot and this namespace instance (its cookie; the
    kernel reuses a deleted namespace's inode number), so a re-created namespace or a
    reboot, which count again, never matches a recorded generation by accident. None
    (no fast path) when the kernel has no cookie."""
    cookie = nft.netns_cookie()
    gen = nft.generation()
    if gen is None or cookie is None:
        return None
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    epoch = int.from_bytes(hashlib.sha256(f"{boot}:{cookie}".encode()).digest()[:6], "big")
    return (epoch << 32) | (gen & 0xFFFFFFFF)
