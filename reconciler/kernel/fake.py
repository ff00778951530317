"""The Fake: in-memory nftables for unit tests, the whole `Interface`.

It parses exactly the command shapes compile's `*_cmd` functions write, fails like the
kernel on missing or busy objects, and lists in nft's text format. `run` is atomic: it
applies to a deep copy and swaps only on success. It counts what it was asked to list.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Callable, TypeVar

from reconciler.compile import NamedSet, Table
from reconciler.kernel.interface import NftError, NotFound
from reconciler.kernel.ruletext import split_comment
from reconciler.kernel.transaction import Transaction

T = TypeVar("T")


@dataclass
class _FChain:
    base: str | None  # "type filter hook input priority 0" or None
    comment: str | None
    rules: list[str] = field(default_factory=list)


@dataclass
class _FSet:
    kind: str  # "set" | "map"
    spec: dict  # "type", "flags", "timeout", "comment" (raw texts)
    elements: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)  # key -> (comment, value)


@dataclass
class _FTable:
    comment: str | None
    chains: dict[str, _FChain] = field(default_factory=dict)
    sets: dict[str, _FSet] = field(default_factory=dict)


_REF_CHAIN = re.compile(r"\b(?:goto|jump)\s+([^\s,}]+)")
_REF_SET = re.compile(r"@([^\s,}]+)")


class Fake:
    """The `Interface` in memory. `cookie` is the namespace cookie it reports (None: a
    kernel without one, so there is no kernel token)."""

    def __init__(self, cookie: int | None = 1) -> None:
        self.tables: dict[tuple[str, str], _FTable] = {}
        self.gen = 0
        self.cookie = cookie
        self.runs: list[Transaction] = []  # every successful transaction, for assertions
        self.full_listings = 0  # list_table calls
        self.object_listings: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []  # (family, chains, sets)

    # -- Interface

    def run(self, tx: Transaction) -> None:
        if not len(tx):
            return
        state = copy.deepcopy(self.tables)
        for i, op in enumerate(tx):
            try:
                self._apply(state, op)
            except NftError as e:
                raise type(e)(f"Error: {e.text}\n{op}\n(transaction op {i + 1})", tx.text()) from None
        self.tables = state
        self.gen += 1
        self.runs.append(tx)

    def check(self, tx: Transaction) -> None:
        state = copy.deepcopy(self.tables)
        for op in tx:
            self._apply(state, op)

    def run_script(self, script: str) -> None:
        """One-line commands, and `table … { … }` blocks as list_table prints them (a
        rollback's restore script), as one transaction."""
        from reconciler.kernel.live import parse_table

        tx = Transaction()
        lines = iter(script.splitlines())
        for line in lines:
            if line.startswith("table "):
                block = [line]
                while block[-1] != "}":
                    block.append(next(lines))
                _declare(tx, parse_table("\n".join(block), line.split()[1]))
            elif line.strip():
                tx.raw(line.strip())
        self.run(tx)

    def list_tables(self) -> list[tuple[str, str]]:
        return list(self.tables)

    def generation(self) -> int | None:
        return self.gen

    def netns_cookie(self) -> int | None:
        return self.cookie

    def version(self) -> str | None:
        return "1.0.6"  # the nft whose listing format the Fake prints

    def in_namespace(self, fn: Callable[[], T]) -> T:
        return fn()

    def close(self) -> None:
        pass

    def list_table(self, family: str, table: str) -> str | None:
        self.full_listings += 1
        return self._listing(family, table)

    def list_objects(self, family: str, table: str, chains: list[str], sets: list[NamedSet]) -> str | None:
        names = [st.name for st in sets]
        self.object_listings.append((family, tuple(chains), tuple(names)))
        t = self.tables.get((family, table))
        if t is None or any(c not in t.chains for c in chains) or any(n not in t.sets for n in names):
            return None
        if not chains and not names:
            return ""
        return self._listing(family, table, set(chains), set(names))

    def _listing(self, family: str, table: str, chains: set[str] | None = None,
                 sets: set[str] | None = None) -> str | None:
        """nft's text form of one table; with `chains`/`sets`, only those objects (as one
        block: a parser cannot tell that apart from nft's block per object)."""
        t = self.tables.get((family, table))
        if t is None:
            return None
        whole = chains is None and sets is None
        out = [f"table {family} {table} {{"]
        if t.comment and whole:
            out.append(f'\tcomment "{t.comment}"')
        for name, s in t.sets.items():
            if not whole and name not in (sets or ()):
                continue
            out.append(f"\t{s.kind} {name} {{")
            if "typeof" in s.spec:
                out.append(f"\t\ttypeof {s.spec['typeof']}")
            else:
                out.append(f"\t\ttype {s.spec['type']}")
            for k in ("flags", "timeout"):
                if s.spec.get(k):
                    out.append(f"\t\t{k} {s.spec[k]}")
            if s.spec.get("comment"):
                out.append(f'\t\tcomment "{s.spec["comment"]}"')
            if s.elements:
                elems = []
                for key, (comment, value) in s.elements.items():
                    e = key + (f' comment "{comment}"' if comment else "")
                    elems.append(e + (f" : {value}" if value is not None else ""))
                out.append("\t\telements = { " + ",\n\t\t\t     ".join(elems) + " }")
            out.append("\t}")
            out.append("")
        for name, c in t.chains.items():
            if not whole and name not in (chains or ()):
                continue
            out.append(f"\tchain {name} {{")
            if c.base:
                out.append(f"\t\t{c.base}; policy accept;")
            if c.comment:
                out.append(f'\t\tcomment "{c.comment}"')
            out.extend(f"\t\t{r}" for r in c.rules)
            out.append("\t}")
            out.append("")
        if out[-1] == "":
            out.pop()
        out.append("}")
        return "\n".join(out) + "\n"

    # -- the command interpreter

    @staticmethod
    def _apply(tables: dict[tuple[str, str], _FTable], op: str) -> None:
        m = re.match(r"(add|flush|delete) (table|chain|rule|set|map|element) (ip6?) (\S+)\s*(.*)$", op)
        if not m:
            raise NftError(f"syntax error (the fake knows only nftrec's shapes): {op}")
        verb, kind, family, tname, rest = m.groups()
        key = (family, tname)
        if kind == "table":
            if verb == "add":
                c = re.search(r'comment "([^"]*)"', rest)
                if key not in tables:
                    tables[key] = _FTable(c.group(1) if c else None)
                elif c:
                    tables[key].comment = c.group(1)
            elif key not in tables:
                raise NotFound("No such file or directory")
            elif verb == "delete":
                del tables[key]
            else:
                t = tables[key]
                for ch in t.chains.values():
                    ch.rules.clear()
                for s in t.sets.values():
                    s.elements.clear()
            return
        t = tables.get(key)
        if t is None:
            raise NotFound("No such file or directory")
        name, _, rest = rest.partition(" ")
        if kind == "chain":
            Fake._chain(t, verb, name, rest)
        elif kind == "rule":
            Fake._rule(t, name, rest)
        elif kind in ("set", "map"):
            Fake._set(t, verb, kind, name, rest)
        else:
            Fake._element(t, verb, name, rest)

    @staticmethod
    def _refs(t: _FTable, text: str) -> None:
        # The kernel resolves jump/goto targets and @set references when a rule or
        # element is added: a missing one is ENOENT.
        for target in _REF_CHAIN.findall(text):
            if target not in t.chains:
                raise NotFound("No such file or directory")
        for s in _REF_SET.findall(text):
            if s not in t.sets:
                raise NotFound("No such file or directory")

    @staticmethod
    def _used(t: _FTable, chain: str) -> bool:
        pat = re.compile(r"\b(?:goto|jump)\s+" + re.escape(chain) + r"(?=[\s,}]|$)")
        for name, c in t.chains.items():
            if name != chain and any(pat.search(r) for r in c.rules):
                return True
        return any(v and pat.search(v) for s in t.sets.values() for _, v in s.elements.values())

    @staticmethod
    def _chain(t: _FTable, verb: str, name: str, rest: str) -> None:
        if verb == "add":
            base = comment = None
            # `{ type … ; }`, `{ comment "…" ; }`, then rules (ruleset.chain_rules_cmd);
            # no rule body or comment holds a `;` (ruleset.check_rule_body, check_comment)
            rest = rest.strip()
            stmts = [x.strip() for x in rest[1:-1].split(";")] if rest.startswith("{") else []
            stmts = [x for x in stmts if x]
            if stmts and stmts[0].startswith("type "):
                base = stmts.pop(0)
            elif stmts and stmts[0].startswith("comment "):
                comment = re.match(r'comment "([^"]*)"', stmts.pop(0)).group(1)
            old = t.chains.get(name)
            if old is None:
                t.chains[name] = _FChain(base, comment)
            elif base is not None and old.base is None:
                raise NftError("File exists")  # a regular chain cannot become a base chain
            elif base is not None and old.base != base:
                raise NftError("Operation not supported")  # hooks cannot change in place
            elif comment:
                old.comment = comment
            for body in stmts:
                Fake._rule(t, name, body)
            return
        c = t.chains.get(name)
        if c is None:
            raise NotFound("No such file or directory")
        if verb == "flush":
            c.rules.clear()
        else:  # kernel >= 6.x deletes the chain's own rules; refused while referenced
            if Fake._used(t, name):
                raise NftError("Device or resource busy")
            del t.chains[name]

    @staticmethod
    def _rule(t: _FTable, chain: str, body: str) -> None:
        c = t.chains.get(chain)
        if c is None:
            raise NotFound("No such file or directory")
        Fake._refs(t, body)
        c.rules.append(body)

    @staticmethod
    def _set(t: _FTable, verb: str, kind: str, name: str, rest: str) -> None:
        if verb == "add":
            spec = {}
            elements = None
            for part in rest.strip().strip("{}").split(";"):
                part = part.strip()
                if part.startswith("elements = {"):  # set_elements_cmd: elements in the declaration
                    elements = part[len("elements = {"):].rstrip().rstrip("}").split(",")
                elif part:
                    k, _, v = part.partition(" ")
                    spec[k] = v.strip('"') if k == "comment" else v
            old = t.sets.get(name)
            if old is None:
                t.sets[name] = _FSet(kind, spec)
            elif old.kind != kind or any(old.spec.get(k) != spec.get(k) for k in ("type", "typeof", "flags", "timeout")):
                raise NftError("File exists")  # a definition cannot change in place
            for e in elements or ():
                Fake._element(t, "add", name, "{ " + e.strip() + " }")
            return
        s = t.sets.get(name)
        if s is None or s.kind != kind:
            raise NotFound("No such file or directory")
        if verb == "flush":
            s.elements.clear()
            return
        ref = re.compile(r"@" + re.escape(name) + r"(?=[\s,}]|$)")
        if any(ref.search(r) for c in t.chains.values() for r in c.rules):
            raise NftError("Device or resource busy")
        del t.sets[name]

    @staticmethod
    def _element(t: _FTable, verb: str, name: str, rest: str) -> None:
        s = t.sets.get(name)
        if s is None:
            raise NotFound("No such file or directory")
        body = rest.strip()
        if not (body.startswith("{") and body.endswith("}")):
            raise NftError(f"syntax error: {rest}")
        body = body[1:-1].strip()
        value = None
        if s.kind == "map" and verb == "add":
            body, sep, value = body.rpartition(" : ")
            if not sep:
                raise NftError("syntax error: map element without a value")
            Fake._refs(t, value)
        body, comment = split_comment(body)
        key = " . ".join(shlex.split(body.replace(" . ", " ")))
        if verb == "add":
            if key in s.elements and s.elements[key][1] != value:
                raise NftError("File exists")  # kernel: same key, other data
            s.elements[key] = (comment, value)
        elif key not in s.elements:
            raise NotFound("No such file or directory")
        else:
            del s.elements[key]


def _declare(tx: Transaction, t: Table) -> None:
    """The commands that make table `t` as parsed from a listing: objects first, then
    what refers to them (map elements to chains, rules to chains and sets)."""
    fam, name = t.family, t.name
    tx.add(fam, name, Table(fam, name, t.comment))
    for s in t.sets.values():
        tx.add(fam, name, replace(s, elements={}))
    for c in t.chains.values():
        tx.add(fam, name, replace(c, rules=()))
    for s in t.sets.values():
        for e in s.elements.values():
            tx.add(fam, name, e, set=s)
    for c in t.chains.values():
        for r in c.rules:
            tx.add_rule(fam, name, c.name, r)
