"""One-shot runs (`nftrec plan`/`apply`): reuse from the last applied ruleset.

The last apply left its ruleset (the state's newest history entry) and a memo (the
state's compiled.json): a digest of what each Service was compiled from. A Service whose
digest is unchanged gets its objects back from that ruleset (`fragments_of`) instead of
being compiled again, and the diff looks only at the changed Services' objects."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import lru_cache
from operator import attrgetter

from reconciler.compile import layout
from reconciler.compile.assemble import assemble, patch
from reconciler.compile.projection import project
from reconciler.compile.ruleset import Chain, Ruleset, chain_id, set_id
from reconciler.compile.services import FamilyFragment, ServiceFragment, compile_service, slices_by_service
from reconciler.compile.skeleton import FAMILIES, compile_static, family_context
from reconciler.intake import Inventory, NodeConfig

MEMO_VERSION = 1


@lru_cache(maxsize=None)
def _compared(cls) -> attrgetter:
    return attrgetter(*[f.name for f in fields(cls) if f.compare])


def _plain(obj) -> tuple:
    """A model object's compared fields (its `source`, a file position, is left out: a
    Service moved within its file compiles to the same objects)."""
    return _compared(type(obj))(obj)


def service_input_digest(svc, slices) -> str:
    """What a Service's fragment is compiled from, besides the node config: the Service and
    its EndpointSlices (in order). repr of frozen dataclasses of strings, ints, tuples and
    None: deterministic across processes (no sets or dicts in the model)."""
    text = repr((_plain(svc), tuple(_plain(s) for s in slices)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def input_tokens(inventory: Inventory, services, by_svc: dict) -> dict[str, str]:
    """Service key -> a digest of the intake's content keys of the Service and its slices
    (`Inventory.origins`), for the Services whose objects all have one. Equal tokens mean
    byte-identical documents under the same code, hence an equal input digest: a Service
    whose token is the memo's takes its digest from there instead of hashing its objects
    again, so only the Services of changed files are digested."""
    origins = inventory.origins
    out: dict[str, str] = {}
    if not origins:
        return out
    for svc in services:
        parts = []
        for o in (svc, *by_svc.get(svc.key, ())):
            e = origins.get(id(o))
            if e is None or e[0] is not o:  # not read by the intake cache, or replaced since
                break
            parts.append(f"{e[1]}/{e[2]}/{e[3]}")
        else:
            out[svc.key] = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
    return out


def memo_key(config_digest: str, inventory: Inventory) -> str:
    """What every fragment depends on: the effective node config, --strict and the code
    (`intake.config_digest`), and the service CIDRs."""
    cidrs = tuple(_plain(c) for c in inventory.service_cidrs)
    return hashlib.sha256(f"{MEMO_VERSION}|{config_digest}|{cidrs!r}".encode()).hexdigest()


def fragments_of(rs: Ruleset, keys: set[str] | None = None) -> dict[str, ServiceFragment]:
    """The fragments of the Services `keys` (None: all) as they were before `assemble`
    placed them, read back from an assembled ruleset by owner: their chains (a pick
    chain's last rule back at offset 0, its values from the map's range), their own sets
    and their elements of the static sets. Exact only for a ruleset whose elements each
    came from one Service (the memo's "exact": no element shared)."""
    out: dict[str, ServiceFragment] = {}

    def ff_of(owner: str, fam: str) -> FamilyFragment | None:
        if keys is not None and owner not in keys:
            return None
        frag = out.get(owner)
        if frag is None:
            frag = out[owner] = ServiceFragment(owner)
        ff = frag.families.get(fam)
        if ff is None:
            ff = frag.families[fam] = FamilyFragment()
        return ff

    owners = rs.owners
    # the static sets holding elements of the Services asked for (element ids name their
    # set): only those are read, and only the Services' own chains and sets (by name:
    # a lazily read ruleset, engine/recorded.py, decodes nothing else)
    holding = None
    if keys is not None:
        holding = {}  # (family, set) -> the element ids of the Services asked for
        for oid, o in owners.items():
            if o in keys and oid.split(" ", 2)[1] == "element":
                fam, _, name, _ = oid.split(" ", 3)
                holding.setdefault((fam, name), []).append(oid)
    for fam, t in rs.tables.items():
        for name in t.chains:
            o = owners.get(chain_id(fam, name))
            ff = ff_of(o, fam) if o is not None else None
            if ff is None:
                continue
            c = t.chains[name]
            p = layout.pick_of(fam, c, t.sets)
            if p is not None:
                ff.picks.append(p)
                if c.rules[-1] != layout.pick_rule(p, 0):  # back to offset 0, as compiled
                    c = Chain(c.name, c.rules[:-1] + (layout.pick_rule(p, 0),), c.base, c.comment)
            ff.chains[name] = c
        for name in t.sets:
            o = owners.get(set_id(fam, name))
            if o is not None:
                ff = ff_of(o, fam)
                if ff is not None:
                    ff.sets[name] = t.sets[name]
            elif not layout.is_layout_map(name) and (holding is None or (fam, name) in holding):
                elements = t.sets[name].elements
                prefix = f"{fam} element {name} "
                found = _owned(elements, prefix, holding[(fam, name)]) if holding is not None else None
                for key, e in found if found is not None else elements.items():
                    o = owners.get(prefix + " . ".join(key))
                    ff = ff_of(o, fam) if o is not None else None
                    if ff is not None:
                        ff.elements[(name, key)] = e
    return out


def _owned(elements, prefix: str, oids: list) -> list | None:
    """(key, element) of the element ids `oids` of one set, looked up by key (a recorded
    set read lazily decodes just those, engine/recorded.py), in the set's key order as
    iterating it gives; None when an id does not lead back to one of its elements (the
    caller then reads them all)."""
    out = []
    for oid in oids:
        key = tuple(oid[len(prefix):].split(" . "))
        e = elements.get(key)
        if e is None or prefix + " . ".join(key) != oid:
            return None
        out.append((key, e))
    return sorted(out, key=lambda ke: ke[0])


@dataclass
class OneShot:
    """A one-shot compile: the whole desired ruleset, and what changed since `applied`."""

    ruleset: Ruleset
    static: Ruleset  # the skeleton (for `project`)
    memo: dict  # for the state's compiled.json ({} when not asked for)
    # Service keys whose objects may differ from `applied`'s; None: compare everything
    changed: set[str] | None = None
    # with `changed`: `applied` and `ruleset` cut down to the skeleton and the changed
    # Services' objects (compile.project): diffing them is diffing the whole rulesets
    applied_part: Ruleset | None = None
    desired_part: Ruleset | None = None
    recompiled: int = 0


def compile_oneshot(inventory: Inventory, config: NodeConfig, config_digest: str | None,
                    applied: Ruleset | None = None, memo: dict | None = None) -> OneShot:
    """compile.compile_ruleset(inventory, config, previous=applied), compiling only the
    Services whose input digest differs from `memo`'s (written with `applied`: the caller
    checks that they belong together) and patching their objects into `applied`, which
    then becomes the result. Without a usable memo, or where the patch cannot be exact,
    everything is compiled (compile_all), `applied` is left as it was and `changed` is None."""
    by_svc = slices_by_service(inventory.endpoint_slices)
    services = sorted(inventory.services, key=lambda s: (s.namespace, s.name))
    old = None
    if applied is not None and memo is not None and config_digest and \
            memo.get("key") == memo_key(config_digest, inventory) and memo.get("exact") is True \
            and isinstance(memo.get("services"), dict):
        old = memo["services"]
    if old is None:
        return compile_all(inventory, config, config_digest, lambda: layout.allocation_of(applied))
    memo_out = _memo(inventory, config_digest, services, by_svc, memo)
    digests = memo_out["services"]
    # the memo's copy of `applied`'s index ranges spares reading every chain of it
    before = _memo_allocation(memo)
    if before is None:
        before = layout.allocation_of(applied)
    contexts = {f: family_context(config, f) for f in FAMILIES}
    static = compile_static(config, inventory)
    changed = {k for k, d in digests.items() if old.get(k) != d} | (set(old) - set(digests))
    by_key = {svc.key: svc for svc in services}
    new_frags = [compile_service(by_key[k], by_svc.get(k, ()), config, contexts)
                 for k in sorted(changed) if k in by_key]
    try:
        old_frags = list(fragments_of(applied, changed).values())
    except (KeyError, ValueError):  # a range without its elements: not what we wrote
        old_frags = None
    if old_frags is not None:
        frags = old_frags + new_frags
        applied_part = project(applied, static, frags)  # before `applied` becomes the result
        alloc = patch(applied, before, old_frags, new_frags)
        if alloc is not None:
            memo_out["exact"] = True  # patch: no element shared, and `applied` was exact
            memo_out["allocation"] = _allocation_json(alloc)
            return OneShot(applied, static, memo_out, changed, applied_part, project(applied, static, frags),
                           recompiled=len(new_frags))
    return compile_all(inventory, config, config_digest, lambda: before, memo_out)


def compile_all(inventory: Inventory, config: NodeConfig, config_digest: str | None,
                previous: Callable[[], layout.Allocation], memo: dict | bool = True) -> OneShot:
    """Every Service compiled and assembled, keeping the index ranges `previous()` gives
    where they fit. `previous` is called only once the Services are compiled: a caller may
    list the kernel meanwhile. `memo`: build the compile memo for the state (True), take
    this one (compile_oneshot's, its digests made), or none (False: `plan` saves none)."""
    by_svc = slices_by_service(inventory.endpoint_slices)
    services = sorted(inventory.services, key=lambda s: (s.namespace, s.name))
    contexts = {f: family_context(config, f) for f in FAMILIES}
    fragments = [compile_service(svc, by_svc.get(svc.key, ()), config, contexts) for svc in services]
    static = compile_static(config, inventory)
    ruleset, alloc, shared = assemble(compile_static(config, inventory), fragments, previous())
    memo_out = {}
    if memo is not False:
        memo_out = memo if isinstance(memo, dict) else _memo(inventory, config_digest, services, by_svc)
        memo_out["exact"] = not shared
        memo_out["allocation"] = _allocation_json(alloc)
    return OneShot(ruleset, static, memo_out, recompiled=len(fragments))


def _memo(inventory: Inventory, config_digest: str | None, services: list, by_svc: dict,
          memo: dict | None = None) -> dict:
    """A new compile memo without its allocation: every Service's input digest, taken from
    `memo` where the Service's input token is the one it was written with."""
    tokens = input_tokens(inventory, services, by_svc)
    old = memo.get("services") if memo is not None else None
    same = memo.get("tokens") if memo is not None else None
    if not isinstance(old, dict) or not isinstance(same, dict):
        old, same = {}, {}
    digests = {}
    for svc in services:
        k = svc.key
        t = tokens.get(k)
        d = old.get(k) if t is not None and same.get(k) == t else None
        digests[k] = d if type(d) is str else service_input_digest(svc, by_svc.get(k, ()))
    return {"version": MEMO_VERSION, "key": memo_key(config_digest or "", inventory), "exact": False,
            "services": digests, "tokens": tokens}


def _allocation_json(alloc: dict) -> list:
    """The memo's form of an allocation: [family, chain, map, offset, N], sorted."""
    return sorted([fam, chain, m, k, n] for (fam, chain), (m, k, n) in alloc.items())


def _memo_allocation(memo: dict) -> dict | None:
    """The memo's allocation back as layout.allocation_of gives it; None when absent
    (a memo of an older nftrec) or malformed: the caller reads the ruleset's chains."""
    rows = memo.get("allocation")
    if not isinstance(rows, list):
        return None
    out = {}
    for row in rows:  # one per index range: plain type checks, no generator per row
        if type(row) is not list or len(row) != 5:
            return None
        fam, chain, m, k, n = row
        if not (type(fam) is str and type(chain) is str and type(m) is str and type(k) is int and type(n) is int):
            return None
        out[(fam, chain)] = (m, k, n)
    return out
