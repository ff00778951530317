"""Putting Services' fragments into a ruleset: `assemble` merges every fragment into the
static skeleton and places the index ranges of the sharded layout; `patch` takes some
Services' old fragments out of an assembled ruleset and puts their new ones in, giving
what `assemble` gives for the same fragments, or None where it might not (the caller then
assembles). Both write through one `_Writer`, and both allocate with `layout.allocate`."""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.compile import layout
from reconciler.compile.parse import CompileError
from reconciler.compile.ruleset import NamedSet, Ruleset, chain_id, element_id, set_id


class _Writer:
    """A ruleset being assembled or patched. With `copy`, a set is copied before its first
    change, so a ruleset sharing the set (the previous one, a projection) stays as it was;
    the tables' chain and set mappings are changed in place."""

    def __init__(self, rs: Ruleset, copy: bool) -> None:
        self.rs = rs
        self.copy = copy
        self.copied: set[tuple[str, str]] = set()
        self.hairpin: set[tuple[str, str]] = set()  # hairpin shards whose elements changed
        self.shared: set[str] = set()  # ids of the elements a second fragment also produced

    def set(self, fam: str, name: str) -> NamedSet:
        t = self.rs.tables[fam]
        s = t.sets.get(name)
        if s is None and layout.is_hairpin_shard(name):  # its first element: a shard exists while it holds one
            s = t.sets[name] = layout.empty_hairpin_shard(t, name)
            self.copied.add((fam, name))
        elif s is None:
            raise KeyError(name)
        elif self.copy and (fam, name) not in self.copied:
            # .copy(): a recorded set read lazily (engine/recorded.py) stays lazy
            s = t.sets[name] = s.with_elements(s.elements.copy())
            self.copied.add((fam, name))
        return s

    def put(self, fragment, picks: list, owners: dict) -> None:
        """Merge one Service's objects and record their owner; its picks are collected
        into `picks` and `owners` ((family, chain) -> Service key) for the allocation. An
        element another Service produced already keeps that owner (fragments are merged
        in Service-key order); a set or chain of two Services is an error."""
        owner = fragment.service_key
        out = self.rs.owners
        for family, ff in fragment.families.items():
            table = self.rs.tables[family]
            for name, s in ff.sets.items():
                if name in table.sets:
                    raise CompileError(f"set {name} produced by two Services ({owner})")
                table.sets[name] = s
                out[set_id(family, name)] = owner
            for name, c in ff.chains.items():
                if name in table.chains:
                    raise CompileError(f"chain {name} produced by two Services ({owner})")
                table.chains[name] = c
                out[chain_id(family, name)] = owner
            for (set_name, key), e in ff.elements.items():
                eid = element_id(family, set_name, key)
                target = table.sets.get(set_name)
                if target is not None and key in target.elements:
                    self.shared.add(eid)
                    continue
                if layout.is_hairpin_shard(set_name):
                    self.hairpin.add((family, set_name))
                self.set(family, set_name).add(e)
                out[eid] = owner
            for p in ff.picks:
                picks.append(p)
                owners[(p.family, p.chain)] = owner

    def take_out(self, fragment, alloc: layout.Allocation) -> set[tuple[str, str]]:
        """Remove one Service's objects, its index ranges (`alloc`) included; returns the
        maps those were in."""
        owners = self.rs.owners
        maps = set()
        for fam, ff in fragment.families.items():
            t = self.rs.tables[fam]
            for name in ff.sets:
                t.sets.pop(name, None)
                owners.pop(set_id(fam, name), None)
            for name in ff.chains:
                t.chains.pop(name, None)
                owners.pop(chain_id(fam, name), None)
            for set_name, key in ff.elements:
                self.set(fam, set_name).elements.pop(key, None)
                owners.pop(element_id(fam, set_name, key), None)
                if layout.is_hairpin_shard(set_name):
                    self.hairpin.add((fam, set_name))
            for p in ff.picks:
                m, k, n = alloc[(fam, p.chain)]
                elems = self.set(fam, m).elements
                for i in range(k, k + n):
                    elems.pop((str(i),), None)
                    owners.pop(element_id(fam, m, (str(i),)), None)
                maps.add((fam, m))
        return maps

    def settle_hairpin(self) -> None:
        """The hairpin shards whose elements changed exist exactly when they hold one."""
        for fam in {fam for fam, _ in self.hairpin}:
            layout.settle_hairpin_shards(self.rs.tables[fam], sorted(n for f, n in self.hairpin if f == fam),
                                         copy_vmap=self.copy)


def assemble(static: Ruleset, fragments: Iterable, previous: layout.Allocation | None = None
             ) -> tuple[Ruleset, layout.Allocation, frozenset]:
    """static part + union of fragments (merged in Service-key order), then the index
    ranges of the sharded layout placed, keeping `previous`'s where they fit (None: from
    scratch), and the hairpin shards no fragment filled dropped. `static` is changed in
    place. Returns it, the allocation made, and the ids of the elements that more than
    one Service produces (each owned by the first)."""
    w = _Writer(static, copy=False)
    picks: list[layout.Pick] = []
    owners: dict[tuple[str, str], str] = {}
    for frag in sorted(fragments, key=lambda f: f.service_key):
        w.put(frag, picks, owners)
    for t in static.tables.values():
        layout.prune_hairpin(t)
    alloc = layout.place(static, picks, owners, previous or {}) if picks else {}
    check_references(static.tables.values())
    return static, alloc, frozenset(w.shared)


def patch(rs: Ruleset, alloc: layout.Allocation, old: list, new: list, shared: frozenset = frozenset()
          ) -> layout.Allocation | None:
    """Change `rs` (assembled, with index ranges `alloc`) in place: the fragments `old`
    out, `new` in, ranges allocated as `assemble` would with `alloc` as the previous
    allocation. Returns the new allocation, or None, with `rs` untouched, where `assemble`
    might give another ruleset (`_fits`). `shared`: ids of elements two Services produce."""
    offsets = _fits(rs, alloc, old, new, shared)
    if offsets is None:
        return None
    w = _Writer(rs, copy=True)
    maps: set[tuple[str, str]] = set()
    for frag in old:
        maps |= w.take_out(frag, alloc)
    gone = {(fam, p.chain) for frag in old for fam, ff in frag.families.items() for p in ff.picks}
    alloc = {c: r for c, r in alloc.items() if c not in gone}
    picks: list[layout.Pick] = []
    owners: dict[tuple[str, str], str] = {}
    for frag in sorted(new, key=lambda f: f.service_key):
        w.put(frag, picks, owners)
    for fam, m in {(p.family, p.map) for p in picks}:
        if m in rs.tables[fam].sets:
            w.set(fam, m)
        else:  # after the sets there are (assemble declares the maps before the Services' own)
            rs.tables[fam].sets[m] = layout.map_for(fam, m)
    alloc.update(layout.write_picks(rs, picks, offsets, owners))
    for fam, m in maps:  # assemble declares only the maps some pick uses
        if not rs.tables[fam].sets[m].elements:
            del rs.tables[fam].sets[m]
    w.settle_hairpin()
    for frag in new:
        for family, ff in frag.families.items():
            table = rs.tables[family]
            check_references([table], [table.chains[n] for n in ff.chains], ff.elements, ff.picks)
    return alloc


def _fits(rs: Ruleset, alloc: layout.Allocation, old: list, new: list, shared: frozenset) -> dict | None:
    """The offsets of the new picks, when patching gives what assemble gives: every old
    element owned by its fragment and by no other one, no new object already held by
    another Service (or by two new ones), no map to compact."""
    owners = rs.owners
    gone: set[str] = set()
    freed: set[tuple[str, str]] = set()
    for frag in old:
        key = frag.service_key
        for fam, ff in frag.families.items():
            if fam not in rs.tables:
                return None
            gone.update(set_id(fam, n) for n in ff.sets)
            gone.update(chain_id(fam, n) for n in ff.chains)
            for set_name, k in ff.elements:
                eid = element_id(fam, set_name, k)
                if eid in shared or owners.get(eid) != key:
                    return None  # shared: the next Service in key order owns it; assemble decides
                gone.add(eid)
            for p in ff.picks:
                r = alloc.get((fam, p.chain))
                if r is None or r[0] != p.map or r[2] != len(p.values):
                    return None
                freed.add((fam, p.chain))
    seen: set[str] = set()
    picks = []
    for frag in new:
        for fam, ff in frag.families.items():
            t = rs.tables.get(fam)
            if t is None:
                return None
            ids = [(set_id(fam, n), n in t.sets) for n in ff.sets]
            ids += [(chain_id(fam, n), n in t.chains) for n in ff.chains]
            for set_name, k in ff.elements:
                s = t.sets.get(set_name)
                if s is None and not layout.is_hairpin_shard(set_name):
                    return None
                ids.append((element_id(fam, set_name, k), s is not None and k in s.elements))
            for oid, exists in ids:
                if oid in seen or (exists and oid not in gone):
                    return None
                seen.add(oid)
            picks += ff.picks
    if not picks:
        return {}
    return layout.allocate(picks, alloc, {c: r for c, r in alloc.items() if c not in freed})


def check_references(tables, chains=None, elements=None, picks=()) -> None:
    """Every jump/goto target and every @set in a rule, and every goto in an element,
    must exist: catches compiler bugs before nft does (a dangling goto fails the whole
    transaction). Without `chains`, every chain and element of `tables` is checked;
    with them (one table), those chains, the elements `elements` ((set, key) pairs)
    and the values of the picks `picks`."""
    for table in tables:
        for chain in table.chains.values() if chains is None else chains:
            for rule in chain.rules:
                words = rule.body.replace("{", " ").replace("}", " ").split()
                for i, w in enumerate(words[:-1]):
                    if w in ("goto", "jump") and words[i + 1] not in table.chains:
                        raise CompileError(f"{table.family} chain {chain.name}: "
                                           f"{w} to missing chain {words[i + 1]}")
                for w in words:
                    if w.startswith("@") and w[1:] not in table.sets:
                        raise CompileError(f"{table.family} chain {chain.name}: missing set {w}")
        if elements is None:
            values = ((s.name, e.value) for s in table.sets.values() for e in s.elements.values())
        else:
            values = [(name, e.value) for name, key in elements
                      if (e := table.sets[name].elements.get(key)) is not None]
            values += [(p.map, v) for p in picks for v in p.values]
        for name, v in values:
            if v and v.startswith("goto ") and v[5:] not in table.chains:
                raise CompileError(f"{table.family} {name}: goto missing chain {v[5:]}")
