"""The desired ruleset as plain data and its nft text form. A `Ruleset` holds one `Table`
per family: chains (rules in order) and named sets and maps (elements unordered). Every
nft command text nftrec sends comes from the `*_cmd` functions here (knftables' text
format), and every string in them passes `check_name`/`check_comment`/`check_atom`
first: the last defence against nft-syntax injection, behind schema validation."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FAMILIES = ("ip", "ip6")  # IPv4 table, IPv6 table


class NftSyntaxError(ValueError):
    """A string that would change the meaning of an nft command if written out."""


# nft's identifier grammar is wider; this is the subset nftrec generates (kube-proxy's
# chain names carry '/' and '.'). Max length: knftables.NameLengthMax.
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9/_.\-]{0,255}")
# Comments are written inside double quotes; nothing that could close or escape them.
_COMMENT_RE = re.compile(r"[A-Za-z0-9 _.:/\-@()*,+=!<>\[\]]{0,128}")
# Set keys and map values: IPs, CIDRs, protocols, ports, verdicts, chain names.
_ATOM_RE = re.compile(r"[A-Za-z0-9_.:/\-\[\] ]{1,300}")


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise NftSyntaxError(f"not a safe nft object name: {name!r}")
    return name


def check_comment(comment: str) -> str:
    if not _COMMENT_RE.fullmatch(comment):
        raise NftSyntaxError(f"not a safe nft comment: {comment!r}")
    return comment


def check_atom(atom: str) -> str:
    if not _ATOM_RE.fullmatch(atom) or "  " in atom:
        raise NftSyntaxError(f"not a safe nft set key or value: {atom!r}")
    return atom


# _ATOM_RE for many atoms at once, each followed by a newline (which no atom may hold).
_ATOMS_RE = re.compile(r"(?:[A-Za-z0-9_.:/\-\[\] ]{1,300}\n)*")


def _atoms_safe(elements, values: bool) -> bool:
    """Whether check_atom would pass every key part (and value, when `values`) of
    `elements`: one match over all of them (a declaration holds every element of a set).
    False: let check_atom find (and name) the bad one."""
    atoms = [a for e in elements for a in e.key]
    if values:
        atoms += [e.value for e in elements]
    if not all(type(a) is str for a in atoms):
        return False
    joined = "\n".join(atoms) + "\n"
    # the count: an atom holding a newline would otherwise read as two good ones
    return joined.count("\n") == len(atoms) and _ATOMS_RE.fullmatch(joined) is not None and "  " not in joined


# Set/map data types (`ipv4_addr . inet_proto . inet_service`, `verdict`), set flags and
# base-chain types/hooks are written unquoted, so they are checked too.
_TYPE_RE = re.compile(r"[a-z][a-z0-9_]*(?: \. [a-z][a-z0-9_]*)*")
_FLAGS = frozenset({"constant", "dynamic", "interval", "timeout"})
_CHAIN_TYPES = frozenset({"filter", "nat", "route"})
_HOOKS = frozenset({"prerouting", "input", "forward", "output", "postrouting", "ingress"})


def check_type(type_: str) -> str:
    if not isinstance(type_, str) or not _TYPE_RE.fullmatch(type_):
        raise NftSyntaxError(f"not a safe nft data type: {type_!r}")
    return type_


# `typeof` expressions: only the exact ones the compiler writes (compile/layout.py).
TYPEOF_EXPRESSIONS = frozenset({
    "numgen random mod 1", "verdict",
    *(f"{fam} daddr . {proto} dport" for fam in ("ip", "ip6") for proto in ("tcp", "udp", "sctp")),
    # the shared ClientIP-affinity set: client address . 64-bit endpoint id (two halves)
    *(f"{fam} saddr . numgen random mod 1 . numgen random mod 1" for fam in ("ip", "ip6")),
})


def check_typeof(expr: str) -> str:
    if expr not in TYPEOF_EXPRESSIONS:
        raise NftSyntaxError(f"not a known nft typeof expression: {expr!r}")
    return expr


def _check_word(value: str, allowed: frozenset, what: str) -> str:
    if value not in allowed:
        raise NftSyntaxError(f"not a known nft {what}: {value!r}")
    return value


# --- the model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseHook:
    """What makes a chain a base chain: `type filter hook input priority 0`."""

    type: str  # filter | nat
    hook: str  # prerouting | input | forward | output | postrouting
    priority: int  # numeric, as knftables writes it (dstnat-10 = -110)


@dataclass(frozen=True)
class Rule:
    body: str  # e.g. "ip daddr @cluster-ips reject"
    comment: str | None = None

    @property
    def text(self) -> str:
        if self.comment is None:
            return self.body
        return f'{self.body} comment "{check_comment(self.comment)}"'


@dataclass(frozen=True)
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()
    base: BaseHook | None = None
    comment: str | None = None


@dataclass(frozen=True)
class Element:
    key: tuple[str, ...]  # ("172.30.0.41", "tcp", "80")
    value: str | None = None  # maps only: "goto service-…", "drop", "10.0.0.1 . 80"
    comment: str | None = None

    @property
    def key_text(self) -> str:
        return " . ".join(check_atom(k) for k in self.key)


@dataclass
class NamedSet:
    """A named set (value_type None) or map; `elements` is keyed by `Element.key`."""

    name: str
    type: str  # "ipv4_addr . inet_proto . inet_service"
    value_type: str | None = None  # "verdict" for vmaps; None for plain sets
    flags: tuple[str, ...] = ()  # ("dynamic", "timeout") for affinity sets
    timeout: int | None = None  # seconds
    comment: str | None = None
    elements: dict[tuple[str, ...], Element] = field(default_factory=dict)
    # True: `type`/`value_type` are nft expressions written as `typeof KEY : VALUE`
    # (the sharded endpoint maps: `typeof numgen random mod 1 : ip daddr . tcp dport`).
    typeof: bool = False
    # Maximum number of elements (`size N`); None: nft's default (65,535 for a set that
    # an `update` fills). Only the shared affinity set sets it (compile/layout.py).
    size: int | None = None

    @property
    def is_map(self) -> bool:
        return self.value_type is not None

    def add(self, element: Element) -> None:
        self.elements[element.key] = element

    def with_elements(self, elements: dict) -> "NamedSet":
        """`dataclasses.replace(self, elements=elements)` at a fraction of its cost (a
        watch sync's projections copy hundreds of sets)."""
        return NamedSet(self.name, self.type, self.value_type, self.flags, self.timeout, self.comment,
                        elements, self.typeof, self.size)


@dataclass
class Table:
    family: str  # "ip" | "ip6"
    name: str
    comment: str | None = None
    chains: dict[str, Chain] = field(default_factory=dict)  # insertion order = creation order
    sets: dict[str, NamedSet] = field(default_factory=dict)  # sets and maps


@dataclass
class Ruleset:
    tables: dict[str, Table] = field(default_factory=dict)  # by family
    # Which Service ("namespace/name") each object belongs to, for plans grouped by
    # Service. Keys are `object_id(...)` strings; objects of no Service are absent.
    owners: dict[str, str] = field(default_factory=dict)
    # A projection (compile/projection.project): (family, set name) of the shared sets
    # it cut down to some Services' elements; a transaction must not flush and re-declare
    # those whole. Empty for a whole ruleset.
    partial: frozenset = field(default=frozenset(), compare=False)
    # A projection: (family, set name) -> element keys, for the shared sets it kept whole
    # (so a transaction may flush and re-declare them) although only these keys can
    # differ from the other side's projection (every other element belongs to an
    # unchanged Service); engine/changes.diff compares just those. Empty: compare all.
    focus: dict = field(default_factory=dict, compare=False)


def chain_id(family: str, chain: str) -> str:
    return f"{family} chain {chain}"


def set_id(family: str, set_name: str) -> str:
    return f"{family} set {set_name}"


def element_id(family: str, set_name: str, key: tuple[str, ...]) -> str:
    return f"{family} element {set_name} {' . '.join(key)}"


# --- nft command texts ------------------------------------------------------------------


def _obj(family: str, table: str) -> str:
    if family not in FAMILIES:
        raise NftSyntaxError(f"unsupported family {family!r}")
    return f"{family} {check_name(table)}"


def table_cmd(verb: str, table: Table) -> str:
    """`add table ip nftrec { comment "…" ; }`, or `delete table ip nftrec`."""
    text = f"{verb} table {_obj(table.family, table.name)}"
    if verb == "add" and table.comment:
        text += f' {{ comment "{check_comment(table.comment)}" ; }}'
    return text


def chain_cmd(verb: str, family: str, table: str, chain: Chain) -> str:
    """`add chain …` with its properties; `flush chain …` / `delete chain …` by name."""
    text = f"{verb} chain {_obj(family, table)} {check_name(chain.name)}"
    if verb != "add":
        return text
    if chain.base is not None:
        b = chain.base
        text += (f" {{ type {_check_word(b.type, _CHAIN_TYPES, 'chain type')}"
                 f" hook {_check_word(b.hook, _HOOKS, 'hook')} priority {int(b.priority)} ; }}")
    elif chain.comment:
        text += f' {{ comment "{check_comment(chain.comment)}" ; }}'
    return text


def rule_cmd(family: str, table: str, chain: str, rule: Rule) -> str:
    check_rule_body(rule.body)
    return f"add rule {_obj(family, table)} {check_name(chain)} {rule.text}"


def chain_rules_cmd(family: str, table: str, chain: Chain) -> str:
    """`add chain ip nftrec service-… { rule ; rule ; }`: the chain's rules added through
    its (identical) declaration. nft 1.0.6 fills its set cache from the kernel for every
    `add rule` but not for a chain declaration: the sets the rules reference must then
    be declared earlier in the same transaction (engine/changes.transaction_for)."""
    for r in chain.rules:
        check_rule_body(r.body)
    rules = [r.text for r in chain.rules]
    if not rules:
        raise NftSyntaxError(f"{chain.name}: no rules")
    decl = chain_cmd("add", family, table, chain)
    head = decl[:-1] if decl.endswith("}") else decl + " { "  # `… { type … ; ` or `… { `
    return head + " ; ".join(rules) + " ; }"


def set_cmd(verb: str, family: str, table: str, s: NamedSet) -> str:
    kind = "map" if s.is_map else "set"
    text = f"{verb} {kind} {_obj(family, table)} {check_name(s.name)}"
    if verb != "add":
        return text
    if s.typeof:
        parts = [f"typeof {check_typeof(s.type)}" + (f" : {check_typeof(s.value_type)}" if s.is_map else "")]
    else:
        parts = [f"type {check_type(s.type)}" + (f" : {check_type(s.value_type)}" if s.is_map else "")]
    if s.size is not None:
        parts.append(f"size {int(s.size)}")
    if s.flags:
        parts.append("flags " + ",".join(_check_word(f, _FLAGS, "set flag") for f in s.flags))
    if s.timeout is not None:
        parts.append(f"timeout {int(s.timeout)}s")
    if s.comment:
        parts.append(f'comment "{check_comment(s.comment)}"')
    return text + " { " + " ; ".join(parts) + " ; }"


def declarable(s: NamedSet) -> bool:
    """Whether `set_elements_cmd` can write elements into `s`: a set or map without flags
    (interval sets need nft's view of their elements to merge ranges; dynamic/timeout
    sets are the kernel's), whose elements carry no comment."""
    return not s.flags and all(e.comment is None for e in s.elements.values())


def set_elements_cmd(family: str, table: str, s: NamedSet, elements) -> str:
    """`add map ip nftrec endpoint-dnat-tcp-2a { typeof … ; comment "…" ; elements = { 8 : 10.0.0.1 . 80 , … } ; }`
    (or `add set … { type … ; elements = { … } ; }`): elements added through the set's
    (byte-identical) declaration. nft 1.0.6 fills its cache from the kernel for `add
    element` but not for a declaration. Only for `declarable` sets."""
    elements = list(elements)
    safe = _atoms_safe(elements, s.is_map)  # then the per-atom checks below cannot fail
    items = []
    for e in elements:
        if e.comment or s.flags or (e.value is None) == s.is_map:
            raise NftSyntaxError(f"{s.name} element {e.key_text}: not writable in a declaration")
        if safe:
            text = " . ".join(e.key)
            items.append(f"{text} : {e.value}" if s.is_map else text)
        else:
            items.append(e.key_text + (f" : {check_atom(e.value)}" if s.is_map else ""))
    if not items:
        raise NftSyntaxError(f"{s.name}: no elements")
    decl = set_cmd("add", family, table, s)  # `… { type … ; comment "…" ; }`
    return decl[:-1] + "elements = { " + " , ".join(items) + " } ; }"


def element_cmd(verb: str, family: str, table: str, s: NamedSet, e: Element) -> str:
    """`add element ip nftrec service-ips { 172.30.0.41 . tcp . 80 : goto service-… }`.

    The comment goes after the key, before ` : value` (kube-proxy's order). A delete
    names the key only.
    """
    text = f"{verb} element {_obj(family, table)} {check_name(s.name)} {{ {e.key_text}"
    if verb == "add":
        if e.comment:
            text += f' comment "{check_comment(e.comment)}"'
        if s.is_map:
            if e.value is None:
                raise NftSyntaxError(f"map {s.name} element {e.key_text} has no value")
            text += f" : {check_atom(e.value)}"
    return text + " }"


# Rule bodies are built by the compiler from checked atoms and names, or listed by nft
# (a history entry adopted from the kernel); this is the final guard that nothing able to
# end a statement or start a string/comment/variable (`;`, newline, `"`, `'`, `#`, `$`,
# `\`) can be in one. The operators `|`, `&` and `^` are how nft lists `or`, `and`, `xor`.
_RULE_BODY_RE = re.compile(r"[A-Za-z0-9 _.:/\-@!=,{}\[\]|&^]+")


def check_rule_body(body: str) -> str:
    if not _RULE_BODY_RE.fullmatch(body) or "  " in body:
        raise NftSyntaxError(f"not a safe nft rule body: {body!r}")
    return body
