"""Read the live side: nftrec's own tables, as a canonical `Ruleset`.

Pipeline position: compile → ruleset ─┐
                   kernel → **live** ─┴→ diff → transaction → apply

nft rewrites rules on read-back (`mark set mark or 0x4000` lists as
`meta mark set meta mark | 0x00004000`, anonymous sets are sorted and merged, ...).
Rather than guess nft's printer exactly, `canonical_rule` is a *normal form*: applied to
our rule text and to nft's listing of it, both give the same string (it is idempotent
on its own output, and mostly equal to how nft 1.0.6 prints). `canonical(ruleset)`
applies it to a desired Ruleset; `read_live` applies it while parsing the listing.

The listing is nft's text form, not JSON: nft 1.0.6's JSON drops table and chain
comments and the `dynamic` set flag. One text listing carries everything.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from pathlib import Path
from dataclasses import dataclass, field, replace
from functools import lru_cache

from reconciler.kernel.nft import Interface, NftError
from reconciler.compile import FAMILIES, BaseHook, Chain, Element, NamedSet, Rule, Ruleset, Table

# --- rule text normal form -----------------------------------------------------------------

_TOKEN = re.compile(r'"[^"]*"|[{},]|[^\s{},]+')
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_IPISH = re.compile(r"[0-9a-fA-F.:/\-]*[0-9][0-9a-fA-F.:/\-]*")
_OPS = {"or": "|", "and": "&", "xor": "^"}
_L4 = {"tcp", "udp", "sctp", "udplite", "dccp"}
_COMMENT_TAIL = re.compile(r'\s+comment\s+"([^"]*)"$')


def split_comment(text: str) -> tuple[str, str | None]:
    """`body comment "c"` → (body, c); nft prints a rule's comment last."""
    if '"' not in text:  # most rules: no comment to look for
        return text.strip(), None
    m = _COMMENT_TAIL.search(text)
    if m is None:
        return text.strip(), None
    return text[: m.start()].strip(), m.group(1)


def _ip(tok: str):
    """An address/prefix/range token as a list of networks, or None."""
    if not _IPISH.fullmatch(tok) or ("." not in tok and ":" not in tok) or tok == ".":
        return None
    try:
        if "-" in tok and "/" not in tok:
            lo, hi = (ipaddress.ip_address(x) for x in tok.split("-", 1))
            return list(ipaddress.summarize_address_range(lo, hi))
        return [ipaddress.ip_network(tok, strict=False)]
    except ValueError:
        return None


def _net_text(n) -> str:
    # nft prints a full-length prefix as a plain address.
    return str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)


def _sort_key(text: str):
    head = text.split(" ", 1)[0]
    return (0, int(head), text) if head.isdigit() else (1, 0, text)


def _group(items: list, verbatim: bool) -> list:
    """Normalise one `{ … }` group; returns the token list to put in its place."""
    elems: list[list] = [[]]
    for t in items:
        if t == ",":
            elems.append([])
        else:
            elems[-1].append(t)
    elems = [e for e in elems if e]
    texts = [" ".join(_flat(e)) for e in elems]
    if verbatim:  # `update @set { ip saddr }`: a key expression, not a set
        return ["{", " , ".join(texts), "}"] if texts else ["{", "}"]
    is_map = any(":" in e for e in elems)
    if not is_map:
        nets = [_ip(t) for t in texts]
        if texts and all(n is not None for n in nets):
            # nft merges overlapping/adjacent intervals of an anonymous set.
            flat = [x for n in nets for x in n]
            merged = []
            for v in (4, 6):
                merged += list(ipaddress.collapse_addresses(x for x in flat if x.version == v))
            texts = [_net_text(n) for n in sorted(merged, key=lambda n: (n.version, n))]  # numeric, as nft
        else:
            texts = sorted(set(texts), key=_sort_key)
        if len(texts) == 1:
            return [texts[0]]  # a one-element anonymous set lists as the bare value
    else:
        texts = sorted(texts, key=_sort_key)
    return ["{ " + ", ".join(texts) + " }"]


def _flat(tokens: list) -> list:
    out = []
    for t in tokens:
        out.extend(t if isinstance(t, list) else [t])
    return out


def _nest(tokens: list[str]) -> list:
    """Turn `{ … }` runs into normalised group tokens (innermost first)."""
    out: list = []
    stack: list[list] = []
    for t in tokens:
        if t == "{":
            stack.append(out)
            out = []
        elif t == "}" and stack:
            items, out = out, stack.pop()
            verbatim = bool(out) and isinstance(out[-1], str) and out[-1].startswith("@")
            out.extend(_group(items, verbatim))
        else:
            out.append(t)
    while stack:  # unbalanced: leave as is
        items, out = out, stack.pop()
        out.extend(["{"] + items)
    return out


# Tokens canonical_rule treats by context (the others by their form alone, _token_form).
_CONTEXT = frozenset({"mark", "dnat", "snat", "meta", *_OPS})


@lru_cache(maxsize=65536)
def canonical_rule(text: str) -> str:
    """The normal form of a rule body (no comment), equal for our text and nft's listing."""
    # Without quotes, braces or commas the tokens are the words (a listing's usual rule;
    # str.split is several times cheaper than the token pattern).
    toks = _TOKEN.findall(text) if ('"' in text or "{" in text or "}" in text or "," in text) else text.split()
    forms = _FORMS
    out: list[str] = []
    i, n = 0, len(toks)
    while i < n:
        t = toks[i]
        form = forms.get(t)
        if form is None:
            form = _token_form(t)
        if form:  # an address that normalises, or (a hex number's form,)
            out.append(form if form.__class__ is str else form[0])
        elif t not in _CONTEXT:
            if t.isdigit() and len(out) >= 2 and out[-1] in ("!=", "==") and _HEX.fullmatch(out[-2]):
                out.append("0x%08x" % int(t))  # `mark and 0x4000 != 0`
            else:
                out.append(t)
        elif t == "mark":
            out += ("mark",) if out and out[-1] in ("meta", "ct") else ("meta", "mark")
        elif t in _OPS:
            out.append(_OPS[t])
        elif t == "dnat" or t == "snat":
            out.append(t)
            # `dnat ip addr . port to …` lists as `dnat ip to …`
            if toks[i + 1 : i + 2] in (["ip"], ["ip6"]) and toks[i + 2 : i + 6] == ["addr", ".", "port", "to"]:
                out += [toks[i + 1], "to"]
                i += 5
        elif i + 3 < n and toks[i + 1] == "l4proto" and toks[i + 2] in _L4 and toks[i + 3] == toks[i + 2]:
            i += 3  # `meta l4proto tcp tcp dport 80`: nft drops the implied dependency
            continue
        else:
            out.append(t)
        i += 1
    return " ".join(_nest(out) if "{" in out else out)


# token -> its normal form out of context: "" when it is its own, the new text when an
# address normalises, (form,) for a hex number. A listing repeats its keywords and
# addresses thousands of times: each is parsed once.
_FORMS: dict[str, object] = {}


_V4_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_V4 = re.compile(rf"{_V4_OCTET}(?:\.{_V4_OCTET}){{3}}")


def _token_form(t: str):
    if _HEX.fullmatch(t):
        form = ("0x%08x" % int(t, 16),)
    elif _V4.fullmatch(t) or (t.count(":") == 1 and "." in t):
        # an IPv4 address in nft's spelling lists as itself; `10.0.0.1:80` (one colon
        # and a dot) is no address: both without ipaddress's parse (or its exception)
        form = ""
    else:
        nets = _ip(t) if t not in ("{", "}", ",") else None
        form = _net_text(nets[0]) if nets and len(nets) == 1 else t
        if form == t:
            form = ""
    if len(_FORMS) < (1 << 17):
        _FORMS[t] = form
    return form


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
    """A table as read from the kernel: also what the desired model never has.

    `flags`: table flags (`dormant`: the kernel ignores every hook of the table, i.e. none
    of our rules is in effect; `owner`/`persist`: held by another process). `others`:
    named stateful objects (counter, quota, ...) by name → kind (an `OTHER_KINDS` key).
    """

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


# `plan --refresh` parses every element of the table (85,000 at 10,000 Services): these
# take the plain case (no quoted comment in the text) with str methods and keep the
# quote-aware scan for the rest.
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
    return s


def _plain_elements(text: str, is_map: bool) -> dict:
    """_parse_element of every element of a list without quotes or runtime attributes
    (all of a 10,000-Service listing's 85,000), inlined: key -> Element."""
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
        return parse_live({family: nft.list_table(family, table_name) for family in FAMILIES}, table_name)


def parse_live(listings: dict[str, str | None], table_name: str) -> Ruleset:
    """read_live's Ruleset from its listings ({family: list_table's text or None}), for a
    caller that listed them itself (`plan --refresh` starts the listing early)."""
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
    up to millions of entries (10,000 took 130 ms that way)."""
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


def kernel_token(nft) -> int | None:
    """The generation id, bound to this boot and this namespace instance: a namespace
    re-created under the same name, or a reboot, starts counting again and must never
    match a recorded generation by accident. The instance is the namespace's cookie
    (never reused within a boot); a namespace's inode number is not enough: the kernel
    hands a deleted namespace's inode to the next new one. None (no fast path) when the
    kernel has no cookie."""
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
