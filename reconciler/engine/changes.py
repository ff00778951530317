"""Compare desired and live rulesets; build the minimal transaction between them.

`diff` is semantic: rules per chain in order (canonical form), set and map elements keyed
by element key, definitions field by field; dynamic sets (affinity) are never compared.
`transaction_for` orders one transaction so the kernel accepts it: create before
reference, drop references before delete (a chain may go in the same transaction as the
rule or map element that jumped to it, so no follow-up transaction as in kube-proxy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

from reconciler.kernel import OTHER_KINDS, canonical, chain_policy, table_flags, table_others
from reconciler.kernel import Transaction
from reconciler.compile import HAIRPIN_VMAP, Chain, Element, NamedSet, NftSyntaxError, Ruleset, Table, chain_id, \
    chain_range, chain_rules_cmd, check_name, declarable, element_id, hairpin_shard_of, set_cmd, set_elements_cmd, \
    set_id

# --- the result ----------------------------------------------------------------------------


@dataclass
class Change:
    action: str  # "add" | "change" | "remove"
    family: str
    kind: str  # "table" | "chain" | "set" | "element" | "object" (a counter, quota, ... someone added)
    name: str  # table, chain or set name (the set's, for an element)
    key: tuple[str, ...] | None = None  # elements only
    owner: str | None = None  # "namespace/name" of the Service, None for shared objects
    reason: str = ""  # one line, for `plan`
    old: object = field(default=None, repr=False, compare=False)  # the live object
    new: object = field(default=None, repr=False, compare=False)  # the desired object

    @property
    def id(self) -> str:
        if self.kind == "chain":
            return chain_id(self.family, self.name)
        if self.kind == "set":
            return set_id(self.family, self.name)
        if self.kind == "element":
            return element_id(self.family, self.name, self.key or ())
        if self.kind == "object":
            return f"{self.family} object {self.name}"
        return f"{self.family} table {self.name}"


@dataclass
class FamilyChanges:
    family: str
    table: Change | None = None  # add / remove / change (= re-create: comments are immutable)
    chains_added: list[Change] = field(default_factory=list)
    chains_removed: list[Change] = field(default_factory=list)
    chains_changed: list[Change] = field(default_factory=list)  # flushed and rewritten, or re-created
    sets_added: list[Change] = field(default_factory=list)
    sets_removed: list[Change] = field(default_factory=list)
    sets_changed: list[Change] = field(default_factory=list)  # definition changed: re-created
    elements_added: list[Change] = field(default_factory=list)
    elements_removed: list[Change] = field(default_factory=list)
    elements_changed: list[Change] = field(default_factory=list)  # value/comment: delete + add
    others_removed: list[Change] = field(default_factory=list)  # stateful objects nftrec never makes

    def __iter__(self) -> Iterator[Change]:
        if self.table:
            yield self.table
        for lst in (
            self.chains_added, self.chains_removed, self.chains_changed,
            self.sets_added, self.sets_removed, self.sets_changed,
            self.elements_added, self.elements_removed, self.elements_changed,
            self.others_removed,
        ):  # fmt: skip
            yield from lst


@dataclass
class Changes:
    families: dict[str, FamilyChanges] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Change]:
        for fc in self.families.values():
            yield from fc

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @property
    def empty(self) -> bool:
        return not any(True for _ in self)

    def by_owner(self) -> dict[str | None, list[Change]]:
        """Changes grouped by Service (None: shared objects), for `plan`."""
        out: dict[str | None, list[Change]] = {}
        for c in self:
            out.setdefault(c.owner, []).append(c)
        return out

    def owners(self) -> set[str]:
        return {c.owner for c in self if c.owner}


# --- ownership of live-only objects --------------------------------------------------------

# <prefix>-<HASH8>-<ns>/<svc>/<proto>/<port>[__<ip>/<port>]   (kube-proxy's naming)
_SVC_NAME = re.compile(r"^(?:service|local|external|firewall|endpoint|affinity)-[A-Z2-7]{8}-([^/]+)/([^/]+)/")
_EP_IP = re.compile(r"__([0-9A-Fa-f.]+)/\d+$")
_DNAT_IP = re.compile(r"dnat to \[?([0-9A-Fa-f.:]+?)\]?:\d+$|\d : ([0-9A-Fa-f.:]+) \. \d+")


def owner_of_name(name: str) -> str | None:
    m = _SVC_NAME.match(name)
    return f"{m.group(1)}/{m.group(2)}" if m else None


class _Owners:
    """Who owns an object: desired.owners first, else derived from names and values
    (a hairpin shard's set, chain and vmap element: from its elements' owners, `_shard`)."""

    def __init__(self, desired: Ruleset, live: Ruleset, focus: dict | None = None):
        self.known = desired.owners
        # our own ruleset as the other side (watch: the projection of what we applied)
        # knows who owned what it loses; a kernel listing knows nothing (empty)
        self.known_live = live.owners
        self._sides: tuple | None = (desired, live, focus)  # indexed on first need
        self._rulesets = (desired, live)  # where a hairpin shard's elements are read (`_shard`)
        self._shards: dict[tuple[str, str], str | None] = {}  # (family, shard set) → its one owner

    def __getattr__(self, name: str):
        # by_ip, by_index, map_users: built when a set or element asks (a diff with no
        # such change, e.g. `plan --refresh` with nothing to do, never walks both sides)
        if name in ("by_ip", "by_index", "map_users") and self._sides is not None:
            self._index(*self._sides)
            self._sides = None
            return getattr(self, name)
        raise AttributeError(name)

    def _index(self, desired: Ruleset, live: Ruleset, focus: dict | None) -> None:
        self.by_ip: dict[str, str] = {}  # service/endpoint IP → owner, for plain set keys
        self.by_index: dict[tuple[str, str, str], str] = {}  # (family, map, index) → owner (layout sharded)
        self.map_users: dict[tuple[str, str], set[str]] = {}  # (family, map) → its Services, both sides
        focus = focus or {}
        for rs in (desired, live):
            for fam, t in rs.tables.items():
                for name, c in t.chains.items():
                    o = owner_of_name(name)
                    if not o:
                        continue
                    r = chain_range(c)
                    if r is not None:
                        self.map_users.setdefault((fam, r[0]), set()).add(o)
                        for i in range(r[1], r[1] + r[2]):
                            self.by_index.setdefault((fam, r[0], str(i)), o)
                    m = _EP_IP.search(name)
                    if m:
                        self.by_ip.setdefault(m.group(1).replace(".", ":") if fam == "ip6" else m.group(1), o)
                    for r in c.rules:  # DNAT targets: owners of hairpin elements
                        for m in _DNAT_IP.finditer(r.body):
                            self.by_ip.setdefault(m.group(1) or m.group(2), o)
                for s in t.sets.values():
                    keys = focus.get((fam, s.name))  # only these are compared (diff): the rest needs no owner
                    elems = s.elements.values() if keys is None else \
                        [s.elements[k] for k in keys if k in s.elements]
                    for e in elems:
                        o = self._from_value(e)
                        if o:
                            self.by_ip.setdefault(e.key[0], o)
                        elif e.value and " . " in e.value:  # endpoint map (layout sharded): DNAT targets
                            o = self.by_index.get((fam, s.name, e.key[0]))
                            if o:
                                self.by_ip.setdefault(e.value.split(" . ")[0], o)

    @staticmethod
    def _from_value(e: Element) -> str | None:
        if e.value and e.value.split()[0] in ("goto", "jump"):
            o = owner_of_name(e.value.split()[1])
            if o:
                return o
        if e.comment and "/" in e.comment:  # no-endpoint elements: "ns/svc:port"
            return e.comment.split(":", 1)[0]
        return None

    def chain(self, fam: str, name: str) -> str | None:
        return self.known.get(chain_id(fam, name)) or owner_of_name(name) or self._shard(fam, name)

    def set(self, fam: str, name: str) -> str | None:
        o = self.known.get(set_id(fam, name)) or owner_of_name(name)
        if o is None and name.startswith("endpoint-"):
            # a shared endpoint map (layout sharded) used by one Service only: created for
            # its first user or removed with its last one, that Service's change
            users = self.map_users.get((fam, name), set())
            if len(users) == 1:
                return next(iter(users))
        return o or self._shard(fam, name)

    def element(self, fam: str, set_name: str, e: Element) -> str | None:
        eid = element_id(fam, set_name, e.key)
        o = self.known.get(eid) or self.known_live.get(eid) or self._from_value(e)
        if o is None and set_name == HAIRPIN_VMAP:
            # `… : goto hairpin-XX`: that shard's owner, if one; asked before the indexes,
            # which hold no vmap key (building them walks both sides)
            return self._shard(fam, e.value.split()[-1]) if e.value else None
        return o or self.by_index.get((fam, set_name, e.key[0])) or self.by_ip.get(e.key[0])

    def _shard(self, fam: str, name: str) -> str | None:
        """The owner of a hairpin shard's set or chain (layout sharded): the one Service
        owning every element of the shard's set, else None (shared). A shard lives only
        while its set holds an element, so its creation and removal are that Service's
        change; read where the set exists: desired (created), else live (removed)."""
        shard = hairpin_shard_of(name)
        if shard is None:
            return None
        if (fam, shard) not in self._shards:
            self._shards[(fam, shard)] = self._sole_owner(fam, shard)
        return self._shards[(fam, shard)]

    def _sole_owner(self, fam: str, shard: str) -> str | None:
        for rs in self._rulesets:
            t = rs.tables.get(fam)
            s = t.sets.get(shard) if t is not None else None
            if s is not None:
                break
        else:
            return None
        owner = None
        for e in s.elements.values():
            o = self.element(fam, shard, e)
            if o is None or (owner is not None and o != owner):
                return None  # an element of no Service, or of a second one
            owner = o
        return owner


# --- diff ----------------------------------------------------------------------------------


_SET_REF = re.compile(r"@([^\s,{}]+)")  # a set or map a rule body uses


def _set_def(s: NamedSet) -> tuple:
    return (s.type, s.value_type, tuple(sorted(s.flags)), s.timeout, s.comment, s.typeof)


def _refs_set(chain: Chain, set_name: str) -> bool:
    pat = re.compile(r"@" + re.escape(set_name) + r"(?=[\s,}]|$)")
    return any(pat.search(r.body) for r in chain.rules)


def _elem_text(e: Element) -> str:
    return " . ".join(e.key) + (f" : {e.value}" if e.value is not None else "")


def _focus(desired: Ruleset, live: Ruleset) -> dict[tuple[str, str], frozenset]:
    """The element keys to compare per set (`Ruleset.focus`, two projections): only sets
    both sides focus on; the union of both sides' keys (a Service's index range may
    differ between them)."""
    return {k: keys | live.focus[k] for k, keys in desired.focus.items() if k in live.focus}


def _key_order(key: tuple[str, ...]) -> tuple:
    """Element keys in a stable order (a map's numeric indexes by value): a plan must
    not depend on hashing."""
    return tuple((0, int(k), "") if k.isdigit() else (1, 0, k) for k in key)


def diff(desired: Ruleset, live: Ruleset) -> Changes:
    """What differs between `desired` (as compiled) and `live` (from read_live).
    Two projections (compile.project) compare only their `focus` keys of a shared set."""
    focus = _focus(desired, live)
    # Rules are compared in canonical form, so only a table the kernel has needs it: a new
    # table's chains are only added, and transaction_for writes `desired`'s own rules.
    want = canonical(desired) if any(fam in live.tables for fam in desired.tables) else desired
    who = _Owners(desired, live, focus)
    out = Changes()
    for fam in sorted(set(want.tables) | set(live.tables)):
        fc = FamilyChanges(fam)
        d, l = want.tables.get(fam), live.tables.get(fam)
        if d is None:
            fc.table = Change("remove", fam, "table", l.name, reason="no longer desired", old=l)
        elif l is None or l.comment != d.comment or table_flags(l) or _unwritable_name(l):
            # A table comment cannot be changed in place (nft keeps the old one silently);
            # flags (`dormant`: none of the table's hooks is active) are cleared the same way;
            # an object someone added under a name our command texts refuse to write
            # (ruleset.check_name) can only go with the whole table.
            if l is None:
                why = "new table"
            elif l.comment != d.comment:
                why = f"table comment {l.comment!r} is not nftrec's: re-created"
            elif table_flags(l):
                why = f"table flags {','.join(table_flags(l))} (not nftrec's): re-created"
            else:
                why = f"object {_unwritable_name(l)!r} is not nftrec's and cannot be deleted by name: re-created"
            fc.table = Change("add" if l is None else "change", fam, "table", d.name, reason=why, old=l, new=d)
            _all_of(fc, d, who)
        else:
            _diff_table(fc, d, l, who, focus)
        if any(True for _ in fc):
            out.families[fam] = fc
    return out


def _unwritable_name(t: Table) -> str | None:
    """The first chain/set/object name in `t` that check_name would refuse, if any."""
    for name in [*t.chains, *t.sets, *table_others(t)]:
        try:
            check_name(name)
        except NftSyntaxError:
            return name
    return None


def _all_of(fc: FamilyChanges, d: Table, who: _Owners) -> None:
    """Everything in `d` as additions (a new or re-created table)."""
    fam = fc.family
    for c in d.chains.values():
        fc.chains_added.append(Change("add", fam, "chain", c.name, owner=who.chain(fam, c.name), reason="new chain", new=c))
    for s in d.sets.values():
        fc.sets_added.append(Change("add", fam, "set", s.name, owner=who.set(fam, s.name), reason="new set", new=s))
        _elements_added(fc, s, s.elements.values(), who)


def _elements_added(fc: FamilyChanges, s: NamedSet, elems, who: _Owners, reason: str = "new element") -> None:
    if "dynamic" in s.flags:
        return
    for e in elems:
        fc.elements_added.append(
            Change("add", fc.family, "element", s.name, e.key, who.element(fc.family, s.name, e),
                   f"{reason}: {_elem_text(e)}", new=e)  # fmt: skip
        )


def _diff_table(fc: FamilyChanges, d: Table, l: Table, who: _Owners, focus: dict | None = None) -> None:
    fam = fc.family
    focus = focus or {}
    # Sets first: a re-created set forces a rewrite of every chain that references it.
    recreated: list[str] = []
    for name, s in d.sets.items():
        ls = l.sets.get(name)
        if ls is None:
            fc.sets_added.append(Change("add", fam, "set", name, owner=who.set(fam, name), reason="new set", new=s))
            _elements_added(fc, s, s.elements.values(), who)
        elif _set_def(s) != _set_def(ls):
            fields = [n for n, a, b in zip(("type", "value type", "flags", "timeout", "comment", "typeof"),
                                           _set_def(s), _set_def(ls)) if a != b]
            fc.sets_changed.append(
                Change("change", fam, "set", name, owner=who.set(fam, name),
                       reason=f"{', '.join(fields)} changed: re-created", old=ls, new=s)  # fmt: skip
            )
            recreated.append(name)
            _elements_added(fc, s, s.elements.values(), who)
        elif "dynamic" not in s.flags:
            keys = focus.get((fam, name))
            if keys is not None:  # two projections: only these keys can differ
                both = sorted(keys, key=_key_order)
                want_e = {k: s.elements[k] for k in both if k in s.elements}
                have_e = {k: ls.elements[k] for k in both if k in ls.elements}
            else:
                want_e, have_e = s.elements, ls.elements
            for key, e in want_e.items():
                le = have_e.get(key)
                if le is None:
                    _elements_added(fc, s, [e], who)
                elif (le.value, le.comment) != (e.value, e.comment):
                    why = f"value {le.value} → {e.value}" if le.value != e.value else f"comment {le.comment!r} → {e.comment!r}"
                    fc.elements_changed.append(
                        Change("change", fam, "element", name, key, who.element(fam, name, e), why, old=le, new=e)
                    )
            for key, le in have_e.items():
                if key not in want_e:
                    fc.elements_removed.append(
                        Change("remove", fam, "element", name, key, who.element(fam, name, le),
                               f"gone: {_elem_text(le)}", old=le)  # fmt: skip
                    )
    for name, ls in l.sets.items():
        if name not in d.sets:
            fc.sets_removed.append(Change("remove", fam, "set", name, owner=who.set(fam, name), reason="no longer used", old=ls))

    for name, c in d.chains.items():
        lc = l.chains.get(name)
        if lc is None:
            fc.chains_added.append(Change("add", fam, "chain", name, owner=who.chain(fam, name), reason="new chain", new=c))
            continue
        why = None
        if lc.base is not None and c.base is not None and chain_policy(lc) != chain_policy(c) \
                and (lc.base.type, lc.base.hook, lc.base.priority) == (c.base.type, c.base.hook, c.base.priority):
            why = f"policy {chain_policy(lc)} (not nftrec's): re-created with policy accept"
        elif lc.base != c.base:
            why = "hook/priority changed: re-created"
        elif lc.comment != c.comment:
            why = "comment changed: re-created"
        elif lc.rules != c.rules:
            why = f"rules differ ({len(lc.rules)} → {len(c.rules)} rules)"
        else:
            hit = [s for s in recreated if _refs_set(lc, s)]
            if hit:
                why = f"references re-created set {hit[0]}"
        if why:
            fc.chains_changed.append(Change("change", fam, "chain", name, owner=who.chain(fam, name), reason=why, old=lc, new=c))
    for name, lc in l.chains.items():
        if name not in d.chains:
            fc.chains_removed.append(
                Change("remove", fam, "chain", name, owner=who.chain(fam, name), reason="no longer referenced", old=lc)
            )
    for name, kind in table_others(l).items():
        fc.others_removed.append(Change("remove", fam, "object", name, reason=f"{kind} object not made by nftrec", old=kind))
    # A regular chain whose comment changed must be deleted and re-added, which needs every
    # reference to it gone first; that only happens across nftrec versions: re-create all.
    if any(c.reason.startswith("comment") and c.new.base is None for c in fc.chains_changed):
        fc.__init__(fam)
        fc.table = Change("change", fam, "table", d.name, reason="a chain comment changed: re-created", old=l, new=d)
        _all_of(fc, d, who)


# --- transaction ---------------------------------------------------------------------------


def transaction_for(changes: Changes, desired: Ruleset) -> Transaction:
    """The minimal transaction turning live into desired, in an order the kernel accepts."""
    tx = Transaction()
    for fam, fc in changes.families.items():
        if fc.table and fc.table.action == "remove":
            tx.delete_table(fam, fc.table.name)
            continue
        d = desired.tables[fam]
        T = d.name
        if fc.table and fc.table.action == "change":
            tx.delete_table(fam, T)
        if fc.table:
            tx.add_table(d)
        # 1. Create new chains and new sets: everything may reference them. A new chain
        # that gets rules in 5. is declared there only, not also as an empty shell here
        # (nft keeps every command's AST until the commit); 5. then writes each after
        # the chains it jumps to (`_rules_order`).
        written = [d.chains[c.name] for c in fc.chains_added + fc.chains_changed if d.chains[c.name].rules]
        order = _rules_order(written, {c.name for c in fc.chains_added})
        if order is not None:
            written = order
        for c in fc.chains_added:
            if order is None or not c.new.rules:
                tx.add(fam, T, _shell(c.new))
        for c in fc.sets_added:
            tx.add(fam, T, c.new)
        # 2. Drop references: flush changed chains and chains about to go.
        recreate_chain = [c for c in fc.chains_changed if c.reason.startswith(("hook", "comment", "policy"))]
        for c in fc.chains_changed:
            if c not in recreate_chain:
                tx.flush(fam, T, Chain(c.name))
        for c in fc.chains_removed:
            tx.flush(fam, T, Chain(c.name))
        # 3. Re-create base chains and sets whose definition cannot change in place.
        for c in recreate_chain:
            tx.delete(fam, T, Chain(c.name))
            tx.add(fam, T, _shell(c.new))
        for c in fc.sets_changed:
            tx.delete(fam, T, c.old)
            tx.add(fam, T, c.new)
        # 4. Elements: deletes before adds (a changed value is delete + add, the adds in 6.),
        # or sets that lose elements rewritten whole (`rewritten_sets`); additions to
        # `declarable` sets as one declaration per set (nft 1.0.6's `add`/`delete element`
        # fill its whole cache from the kernel).
        decl = {name: declarable(d.sets[name]) for name in {c.name for c in fc.elements_added + fc.elements_removed
                                                              + fc.elements_changed}}
        rewrite = rewritten_sets(fc, d, decl)
        if any((fam, name) in desired.partial for name in rewrite):
            rewrite = []  # a projection cut this set down: flushing it would drop others' elements
        for name in rewrite:
            tx.flush(fam, T, d.sets[name])
        for c in fc.elements_removed + fc.elements_changed:
            if c.name not in rewrite:
                tx.delete(fam, T, c.old, set=d.sets[c.name])
        # 5. Rules of new and rewritten chains (what they reference exists now, or, for a
        # new chain, is declared earlier in this step: `_rules_order`),
        # each chain's through its declaration (`chain_rules_cmd`: no nft cache fill, as
        # `add rule` does); nft then resolves a rule's `@set` only among the sets this
        # transaction declares, so the existing ones they use are re-declared (the same
        # definition: a no-op for the kernel) first.
        declared = {c.name for c in fc.sets_added + fc.sets_changed}
        used = {m for ch in written for r in ch.rules for m in _SET_REF.findall(r.body)}
        for name in sorted(used - declared):
            if name in d.sets:
                tx.raw(set_cmd("add", fam, T, d.sets[name]))
        for ch in written:
            tx.raw(chain_rules_cmd(fam, T, ch))
        # 6. Element additions, after the rules: binding a rule to a map walks every
        # element already in it (nf_tables_bind_set), so elements first cost rules x
        # elements per map; this way each element only checks the map's bindings.
        batched = {name: sorted(d.sets[name].elements.values(), key=lambda e: e.key) for name in rewrite}
        for c in fc.elements_changed + fc.elements_added:
            s = d.sets[c.name]
            if c.name in rewrite:
                continue
            if decl[c.name]:
                batched.setdefault(c.name, []).append(c.new)
            else:
                tx.add(fam, T, c.new, set=s)
        for name, elems in batched.items():
            if elems:
                tx.raw(set_elements_cmd(fam, T, d.sets[name], elems))
        # 7. Delete what nothing references any more: sets and maps first (a map element
        # may `goto` a chain being removed; the rules that used a set were flushed in 2.),
        # then stray stateful objects (their rules were flushed too), then chains.
        for c in fc.sets_removed:
            tx.delete(fam, T, c.old)
        for c in fc.others_removed:
            tx.raw(f"delete {OTHER_KINDS[c.old]} {fam} {check_name(T)} {check_name(c.name)}")
        for c in fc.chains_removed:
            tx.delete(fam, T, Chain(c.name))
    return tx



# Elements re-declared at most, per transaction, to avoid `delete element`: a rewrite
# costs per element, while the first `delete element` makes nft 1.0.6 fill its cache from
# the kernel (later ones in the same transaction are free). Conservative: a removed
# Service (cluster-ips + service-ips of a large cluster) keeps deleting.
REWRITE_BUDGET = 16384


def rewritten_sets(fc: FamilyChanges, desired: Table, declarable_: dict[str, bool]) -> list[str]:
    """The sets losing or changing elements to flush and re-declare whole instead of
    deleting elements (same packets: one atomic transaction): all of them, or none when
    an `add`/`delete element` is written anyway (a set not `declarable`) or they hold more
    than REWRITE_BUDGET elements. `declarable_`: by name, for every set with changes."""
    names = list(dict.fromkeys(c.name for c in fc.elements_removed + fc.elements_changed))
    if not all(declarable_.values()) or sum(len(desired.sets[n].elements) for n in names) > REWRITE_BUDGET:
        return []
    return names


_CHAIN_REF = re.compile(r"\b(?:jump|goto)\s+([^\s,{};]+)")  # a chain a rule body jumps to (also in a vmap)


def _rules_order(chains: list[Chain], new: set[str]) -> list[Chain] | None:
    """`chains` (those whose rules the transaction writes) reordered so that each comes
    after every chain of `new` that its rules `jump`/`goto`, otherwise in their order:
    the kernel resolves a jump when the rule is added, so a chain declared only with its
    rules must come first. None on a cycle (the kernel refuses loops anyway): the
    caller then declares every new chain empty first, as before."""
    by_name = {c.name: c for c in chains}
    done: set[str] = set()
    out: list[Chain] = []
    for root in chains:
        if root.name in done:
            continue
        path = {root.name}  # the chains on the walk's current path: a cycle if met again
        stack = [(root, iter(_jumps(root, new, by_name)))]
        while stack:
            chain, deps = stack[-1]
            dep = next((n for n in deps if n not in done), None)
            if dep is None:
                stack.pop()
                path.discard(chain.name)
                done.add(chain.name)
                out.append(chain)
            elif dep in path:
                return None
            else:
                path.add(dep)
                stack.append((by_name[dep], iter(_jumps(by_name[dep], new, by_name))))
    return out


def _jumps(chain: Chain, new: set[str], by_name: dict[str, Chain]) -> list[str]:
    """The chains of `new` written in this transaction that `chain`'s rules jump to."""
    return [n for r in chain.rules for n in _CHAIN_REF.findall(r.body) if n in new and n in by_name]


def _shell(c: Chain) -> Chain:
    return Chain(c.name, (), c.base, c.comment)

