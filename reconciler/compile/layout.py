"""The `sharded` endpoint-selection layout (nftrec's default; `layout: kube-proxy` turns it
off). kube-proxy writes an anonymous map per Service port, and the kernel's cost of
anonymous sets is quadratic in their number (naming `__map%d` and every set lookup walk
the table's set list). Here the same uniform draw indexes a range of a shared map,
`numgen random mod 5 offset 40 map @endpoint-dnat-tcp-2a`; the same idea shards the
affinity sets, the firewall's source ranges and hairpin-connections (sections below)."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from reconciler.compile.ruleset import Chain, Element, NamedSet, Rule, Ruleset, chain_id, element_id, set_id

LAYOUTS = ("sharded", "kube-proxy")
DEFAULT_LAYOUT = "sharded"
# A LoadBalancer's source ranges as one `ip saddr R return` rule each and a final `drop`
# (kube-proxy: `ip saddr != { R1 , R2 } drop`, an anonymous set per Service port, which
# the kernel binds by walking the whole transaction); a rule is a linear test per new
# connection, so above this many ranges kube-proxy's set is kept.
FIREWALL_RULES_MAX = 16
AFFINITY_SET = "affinity-clients"
# kube-proxy's per-endpoint sets hold nft's default 65,535 clients each; the shared set
# holds every (client, endpoint) pair of the table, so it gets 64 times that.
AFFINITY_SET_SIZE = 64 * 65536
# A Service port's map is one of SHARDS, by a hash of its chain name, one set of shards
# per protocol (nft 1.0.6 refuses a udp rule on a tcp-typed map, and a `th dport` map
# for a rule added in a later transaction). 256, not 64: a map's cost at load is (rules
# bound to it) x (its elements + bindings) (nf_tables_bind_set, nft_add_set_elem), which
# grew faster than the Services with 64. Changing it moves every Service's range once.
SHARDS = 256
PROTOCOLS = ("tcp", "udp", "sctp")
DNAT_PREFIX = "endpoint-dnat-"
VMAP_PREFIX = "endpoint-vmap-"
# Offsets stay far below 2^32 (numgen + offset is a 32-bit register); a shard whose
# high-water mark passes this (leaked ranges of moved Services) is re-allocated from 0.
# A range is kept while its endpoints fit its capacity, so a change touches only the
# changed Service's elements and rule; offset 0 is written without `offset` (nft omits it).
COMPACT_AT = 1 << 24

# The tail of a Service chain's last rule in this layout, in our text and in nft's
# listing (`dnat ip addr . port to` lists as `dnat ip to`; the tail is the same).
_PICK_RE = re.compile(r"numgen random mod (\d+)(?: offset (\d+))? (v?map) "
                      r"@(endpoint-(?:dnat-(?:tcp|udp|sctp)|vmap)-[0-9a-f]{2})$")


@dataclass(frozen=True)
class Pick:
    """One chain's endpoint selection by index range: the chain's last rule is
    `<head>numgen random mod N [offset K] <map|vmap> @<map>`, values in index order."""

    family: str
    chain: str
    map: str
    head: str  # "meta l4proto tcp dnat ip addr . port to " | "" (vmap)
    values: tuple[str, ...]  # "10.0.0.1 . 8080" | "goto endpoint-…"

    @property
    def verb(self) -> str:
        return "vmap" if self.map.startswith(VMAP_PREFIX) else "map"


def capacity(n: int) -> int:
    """Indices reserved for n endpoints: the next power of two >= n."""
    return 1 << max(0, n - 1).bit_length()


def shard(chain: str) -> str:
    """Two hex digits: which of the SHARDS maps a Service port's chain uses."""
    return "%02x" % (int.from_bytes(hashlib.sha256(chain.encode()).digest()[:4], "big") % SHARDS)


def dnat_pick(family: str, chain: str, proto: str, values: tuple[str, ...]) -> Pick:
    if proto not in PROTOCOLS:
        raise ValueError(f"no endpoint map for protocol {proto!r}")
    return Pick(family, chain, f"{DNAT_PREFIX}{proto}-{shard(chain)}",
                f"meta l4proto {proto} dnat {family} addr . port to ", values)


def vmap_pick(family: str, chain: str, values: tuple[str, ...]) -> Pick:
    return Pick(family, chain, VMAP_PREFIX + shard(chain), "", values)


def pick_rule(p: Pick, offset: int) -> Rule:
    off = f" offset {offset}" if offset else ""
    return Rule(f"{p.head}numgen random mod {len(p.values)}{off} {p.verb} @{p.map}")


def map_for(family: str, name: str) -> NamedSet:
    if name.startswith(DNAT_PREFIX):
        proto = name[len(DNAT_PREFIX):].split("-")[0]
        return NamedSet(name, "numgen random mod 1", f"{family} daddr . {proto} dport", typeof=True,
                        comment="endpoint address . port by Service index range")
    return NamedSet(name, "numgen random mod 1", "verdict", typeof=True,
                    comment="endpoint chain by Service index range (ClientIP affinity)")


# ClientIP affinity keeps kube-proxy's per-endpoint chains and checks, but its dynamic set
# per endpoint (one named set each: the kernel finds a set by name with a walk of the
# table's set list, so N sets cost O(N^2) to load) becomes one shared set per table keyed
# by the client and a 64-bit id of kube-proxy's set name. nft 1.0.6 accepts no literal in
# the concatenation of a lookup, so each id half is `numgen random mod 1 offset K`.

def affinity_set(family: str, addr_type: str) -> NamedSet:
    """The shared affinity set of a table (the skeleton declares it; dynamic: only
    `update` fills it, each element with its Service's timeout)."""
    return NamedSet(AFFINITY_SET, f"{family} saddr . numgen random mod 1 . numgen random mod 1", typeof=True,
                    flags=("dynamic", "timeout"), size=AFFINITY_SET_SIZE,
                    comment="ClientIP affinity: client . endpoint id")


def affinity_key(family: str, kube_proxy_set: str) -> str:
    """`ip saddr . numgen random mod 1 offset A . numgen random mod 1 offset B`: the
    client and the first 64 bits of sha256(kube-proxy's affinity set name for this
    endpoint of this Service port), so every (Service port, endpoint) keeps its own
    entries as with kube-proxy's one set each. Offset 0 is omitted (as nft lists it)."""
    h = hashlib.sha256(kube_proxy_set.encode()).digest()
    halves = (int.from_bytes(h[:4], "big"), int.from_bytes(h[4:8], "big"))
    return f"{family} saddr . " + " . ".join(
        "numgen random mod 1" + (f" offset {k}" if k else "") for k in halves)


# The `update` an endpoint chain of an affinity Service port writes (affinity_key), in
# the compiler's text and in nft's listing alike (offset 0 omitted, timeout as written).
_AFFINITY_UPDATE_RE = re.compile(
    r"update @" + re.escape(AFFINITY_SET) + r" \{ ip6? saddr \. numgen random mod 1(?: offset (\d+))?"
    r" \. numgen random mod 1(?: offset (\d+))? timeout (\S+) \}")


def affinity_updates(chain: Chain) -> dict[tuple[int, int], str]:
    """{endpoint id (the two halves of affinity_key): timeout text} of the shared affinity
    set entries `chain` writes: one for an endpoint chain of a ClientIP affinity Service
    port in the sharded layout, none for any other chain."""
    out = {}
    for rule in chain.rules:
        if AFFINITY_SET in rule.body:
            m = _AFFINITY_UPDATE_RE.search(rule.body)
            if m is not None:
                out[(int(m.group(1) or 0), int(m.group(2) or 0))] = m.group(3)
    return out


# --- hairpin-connections, sharded -------------------------------------------------------
# kube-proxy's one set (a rule in `masquerading`) is split by the endpoint address's low
# bits: `ct status dnat ip daddr & 0.0.0.63 vmap @hairpin-shards` goes to `hairpin-XX`,
# whose one rule is kube-proxy's lookup in `hairpin-connections-XX`. One lookup per packet
# either way; a moved local endpoint rewrites one shard instead of the whole set.

# Shards of hairpin-connections: a power of two (the vmap key is the address masked to its
# low bits). Pod addresses of one node share their high bits (the node's pod CIDR), so the
# low bits spread its local endpoints evenly. Changing it moves every element once.
HAIRPIN_SHARDS = 64
HAIRPIN_VMAP = "hairpin-shards"
HAIRPIN_SET_PREFIX = "hairpin-connections-"
HAIRPIN_CHAIN_PREFIX = "hairpin-"


def _hairpin_mask(family: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return (ipaddress.IPv4Address if family == "ip" else ipaddress.IPv6Address)(HAIRPIN_SHARDS - 1)


def hairpin_shard(ip: str) -> str:
    """Two hex digits: the shard of a local endpoint address (its low bits, the value of
    the dispatch rule's `ip daddr & <mask>` for a packet to it)."""
    return "%02x" % (int(ipaddress.ip_address(ip)) & (HAIRPIN_SHARDS - 1))


def hairpin_set(ip: str) -> str:
    """The hairpin-connections shard holding the element of a local endpoint `ip`."""
    return HAIRPIN_SET_PREFIX + hairpin_shard(ip)


def hairpin_dispatch(family: str) -> str:
    """The `masquerading` chain's hairpin rule (kube-proxy: the set lookup itself)."""
    # `and`, as nftrec writes operators; nft lists it as `&` (kernel/ruletext.py)
    return f"ct status dnat {family} daddr and {_hairpin_mask(family)} vmap @{HAIRPIN_VMAP}"


@lru_cache(maxsize=8)
def _hairpin_parts(family: str) -> tuple[tuple[Element, ...], tuple[Chain, ...]]:
    """The skeleton's immutable parts (vmap elements, chains), built once: every watch
    sync compiles the static part, and these 128 objects are most of it."""
    addr = ipaddress.IPv4Address if family == "ip" else ipaddress.IPv6Address
    shards = ["%02x" % i for i in range(HAIRPIN_SHARDS)]
    elements = tuple(Element((str(addr(i)),), f"goto {HAIRPIN_CHAIN_PREFIX}{x}") for i, x in enumerate(shards))
    chains = tuple(Chain(HAIRPIN_CHAIN_PREFIX + x, (Rule(
        f"{family} saddr . {family} daddr . meta l4proto . th dport "
        f"@{HAIRPIN_SET_PREFIX}{x} masquerade fully-random"),)) for x in shards)
    return elements, chains


def _hairpin_shard_set(family: str, name: str) -> NamedSet:
    a = "ipv4_addr" if family == "ip" else "ipv6_addr"
    return NamedSet(name, f"{a} . {a} . inet_proto . inet_service", comment="service hairpin connections")


def hairpin_sets(family: str, addr_type: str) -> list[NamedSet]:
    """The static part's sets: every shard (empty) and the dispatch vmap (masked address
    → goto the shard's chain). assemble then keeps only the shards that got an element
    (`prune_hairpin`). New objects each call: a compile adds elements to them."""
    elements, _ = _hairpin_parts(family)
    sets = [_hairpin_shard_set(family, HAIRPIN_SET_PREFIX + "%02x" % i) for i in range(HAIRPIN_SHARDS)]
    sets.append(NamedSet(HAIRPIN_VMAP, addr_type, "verdict", comment="hairpin-connections shard by endpoint address",
                         elements={e.key: e for e in elements}))
    return sets


def hairpin_chains(family: str) -> list[Chain]:
    """The static part's shard chains, each with kube-proxy's rule on its shard."""
    return list(_hairpin_parts(family)[1])


def is_hairpin_shard(name: str) -> bool:
    """A `hairpin-connections-XX` set name."""
    return name.startswith(HAIRPIN_SET_PREFIX) and len(name) == len(HAIRPIN_SET_PREFIX) + 2


def hairpin_chain_of(shard_set: str) -> str:
    """The chain holding the rule on a shard set (`hairpin-connections-2a` → `hairpin-2a`)."""
    return HAIRPIN_CHAIN_PREFIX + shard_set[len(HAIRPIN_SET_PREFIX):]


def hairpin_shard_of(name: str) -> str | None:
    """The shard set a hairpin shard object belongs to: a shard set itself, a shard's
    chain (`hairpin-2a` → `hairpin-connections-2a`); None for any other name."""
    if is_hairpin_shard(name):
        return name
    if name.startswith(HAIRPIN_CHAIN_PREFIX) and len(name) == len(HAIRPIN_CHAIN_PREFIX) + 2:
        return HAIRPIN_SET_PREFIX + name[len(HAIRPIN_CHAIN_PREFIX):]
    return None


def hairpin_vmap_key(family: str, shard_set: str) -> tuple[str]:
    """The dispatch vmap's key for a shard set (`hairpin-connections-2a` → ("0.0.0.42",))."""
    return _hairpin_parts(family)[0][int(shard_set[len(HAIRPIN_SET_PREFIX):], 16)].key


# A shard exists (set, chain, vmap element) only while its set has an element: a small
# node has a few local endpoints, and 64 empty shards per family would be most of its
# table. A packet whose shard is absent
# misses the vmap, and a vmap miss is no match: the rule falls through exactly as the
# lookup in an empty set did (it is the last rule of `masquerading`).

def empty_hairpin_shard(table, shard_set: str) -> NamedSet:
    """A new empty shard set (the caller adds elements, then `settle_hairpin_shards`)."""
    return _hairpin_shard_set(table.family, shard_set)


def settle_hairpin_shards(table, shard_sets, copy_vmap: bool = True) -> None:
    """Make the shards `shard_sets` of `table` (changed in place) exist exactly when their
    set has an element: a set with elements gets its chain and vmap element, an empty or
    missing one loses set, chain and vmap element. `copy_vmap`: the vmap is copied before
    its first change (the table's sets may be shared with another ruleset)."""
    vmap = table.sets.get(HAIRPIN_VMAP)
    if vmap is None:
        return  # layout kube-proxy: one hairpin-connections set, always there
    parts = _hairpin_parts(table.family)
    copied = not copy_vmap
    for name in shard_sets:
        i = int(name[len(HAIRPIN_SET_PREFIX):], 16)
        element, chain = parts[0][i], parts[1][i]
        s = table.sets.get(name)
        live = s is not None and bool(s.elements)
        if live == (chain.name in table.chains) and live == (element.key in vmap.elements):
            continue
        if not copied:
            vmap = table.sets[HAIRPIN_VMAP] = vmap.with_elements(dict(vmap.elements))
            copied = True
        if live:
            table.chains[chain.name] = chain
            vmap.elements[element.key] = element
        else:
            table.sets.pop(name, None)
            table.chains.pop(chain.name, None)
            vmap.elements.pop(element.key, None)


def prune_hairpin(table) -> None:
    """Drop the shards no element went into (assemble, after every fragment is merged)."""
    settle_hairpin_shards(table, [n for n, s in table.sets.items() if not s.elements and is_hairpin_shard(n)],
                          copy_vmap=False)


def is_hairpin_skeleton(name: str) -> bool:
    """A chain or set name of the sharded hairpin skeleton (shards, their chains, the
    dispatch vmap): objects whose presence depends only on the hairpin elements (the
    shards') of Services."""
    return name == HAIRPIN_VMAP or name.startswith(HAIRPIN_SET_PREFIX) or (
        name.startswith(HAIRPIN_CHAIN_PREFIX) and len(name) == len(HAIRPIN_CHAIN_PREFIX) + 2)


def is_layout_map(name: str) -> bool:
    return name.startswith((DNAT_PREFIX, VMAP_PREFIX))


# --- reading an allocation back -------------------------------------------------------


def chain_range(chain: Chain) -> tuple[str, int, int] | None:
    """(map, offset, N) of a chain whose last rule selects by index range, else None."""
    if not chain.rules:
        return None
    m = _PICK_RE.search(chain.rules[-1].body)
    if m is None:
        return None
    return m.group(4), int(m.group(2) or 0), int(m.group(1))


Allocation = dict  # (family, chain) -> (map, offset, N)


def allocation_of(rs: Ruleset | None) -> Allocation:
    """The index ranges in use in `rs` (desired or live)."""
    out: Allocation = {}
    if rs is None:
        return out
    for fam, t in rs.tables.items():
        for name, c in t.chains.items():
            if "/" not in name:
                continue
            r = chain_range(c)
            if r is not None:
                out[(fam, name)] = r
    return out


# --- allocating -------------------------------------------------------------------------


def allocate(picks: list[Pick], previous: Allocation, reserved: Allocation | None = None
             ) -> dict[tuple[str, str], int] | None:
    """Offsets for `picks`: a previous range in the same map is kept while N fits its
    capacity and it overlaps no range kept before it (the `reserved` ranges of other
    chains first, then chains in name order); the rest go to the map's high-water mark,
    in name order. A map that would pass COMPACT_AT is allocated again from 0, or, when
    it holds reserved ranges (they cannot move), the answer is None."""
    by_map: dict[tuple[str, str], list[Pick]] = {}
    for p in picks:
        by_map.setdefault((p.family, p.map), []).append(p)
    taken: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for (fam, _chain), (m, k, n) in (reserved or {}).items():
        if (fam, m) in by_map:
            taken.setdefault((fam, m), []).append((k, k + capacity(n)))
    out: dict[tuple[str, str], int] = {}
    for (fam, m), group in by_map.items():
        group.sort(key=lambda p: p.chain)
        kept = list(taken.get((fam, m), ()))
        rest: list[Pick] = []
        for p in group:
            prev = previous.get((fam, p.chain))
            if prev is not None and prev[0] == p.map and len(p.values) <= capacity(prev[2]):
                lo, hi = prev[1], prev[1] + capacity(prev[2])
                if all(hi <= a or b <= lo for a, b in kept):
                    kept.append((lo, hi))
                    out[(fam, p.chain)] = lo
                    continue
            rest.append(p)
        hwm = max((b for _a, b in kept), default=0)
        if hwm + sum(capacity(len(p.values)) for p in rest) > COMPACT_AT:
            if (fam, m) in taken:
                return None
            hwm, rest = 0, group  # compaction: every range of this map moves once
        for p in rest:
            out[(fam, p.chain)] = hwm
            hwm += capacity(len(p.values))
    return out


def place(rs: Ruleset, picks: list[Pick], owners: dict[tuple[str, str], str],
          previous: Allocation) -> Allocation:
    """Allocate the picks' ranges and write them into `rs` (in place), declaring the maps
    used (only those, in name order). Returns the allocation made."""
    offsets = allocate(picks, previous)
    for fam, name in sorted({(p.family, p.map) for p in picks}):
        t = rs.tables[fam]
        if name not in t.sets:
            t.sets[name] = map_for(fam, name)
    for fam in {p.family for p in picks}:
        # Declared before the Services' own (affinity) sets: the kernel finds a set by
        # walking the table's set list in creation order, once per element message.
        t = rs.tables[fam]
        owned = [n for n in t.sets if set_id(fam, n) in rs.owners]
        if owned:
            t.sets = {**{n: s for n, s in t.sets.items() if set_id(fam, n) not in rs.owners},
                      **{n: t.sets[n] for n in owned}}
    return write_picks(rs, picks, offsets, owners)


def write_picks(rs: Ruleset, picks: list[Pick], offsets: dict, owners: dict[tuple[str, str], str]) -> Allocation:
    """Each pick's chain gets its offset in its last rule and its map the elements, owned
    by the chain's Service (`owners`: (family, chain) -> Service key). The maps exist and
    may be changed. Returns the allocation of the picks."""
    alloc: Allocation = {}
    out_owners = rs.owners
    for p in picks:  # the hot loop of a large compile: no dataclasses.replace
        k = offsets[(p.family, p.chain)]
        t = rs.tables[p.family]
        if k:
            c = t.chains[p.chain]
            t.chains[p.chain] = Chain(c.name, c.rules[:-1] + (pick_rule(p, k),), c.base, c.comment)
        elems = t.sets[p.map].elements
        owner = owners.get((p.family, p.chain))
        prefix = element_id(p.family, p.map, ("",))  # + the index: element_id of a one-part key
        for i, v in enumerate(p.values):
            idx = str(k + i)
            elems[(idx,)] = Element((idx,), v)
            if owner:
                out_owners[prefix + idx] = owner
        alloc[(p.family, p.chain)] = (p.map, k, len(p.values))
    return alloc


def pick_of(family: str, chain: Chain, sets) -> Pick | None:
    """The pick of a placed Service chain: its index range with the values its map
    (`sets[map]`) holds there; None for a chain that selects no range."""
    r = chain_range(chain) if "/" in chain.name else None
    if r is None:
        return None
    m, k, n = r
    elems = sets[m].elements
    body = chain.rules[-1].body
    return Pick(family, chain.name, m, body[: body.index("numgen random mod ")],
                tuple(elems[(str(k + i),)].value for i in range(n)))


def picks_of(rs: Ruleset) -> list[Pick]:
    """The picks of a placed ruleset (its chains' index ranges and their elements)."""
    return [p for fam, t in rs.tables.items() for c in t.chains.values()
            if (p := pick_of(fam, c, t.sets)) is not None]


def relocate(rs: Ruleset, previous: Ruleset | None) -> Ruleset:
    """`rs` with its index ranges re-allocated to keep `previous`'s (the live ruleset, or
    the last applied one) where they still fit: the same packets, and a diff against
    `previous` that touches only the Services that changed. Returns `rs` itself when
    nothing moves; never modifies `rs`."""
    picks = picks_of(rs)
    if not picks:
        return rs
    current = allocation_of(rs)
    prev = allocation_of(previous)
    offsets = allocate(picks, prev)
    if all(offsets[(p.family, p.chain)] == current[(p.family, p.chain)][1] for p in picks):
        return rs
    out = Ruleset(owners=dict(rs.owners))
    owners: dict[tuple[str, str], str] = {}
    for fam, t in rs.tables.items():
        sets = {}
        for name, s in t.sets.items():
            if is_layout_map(name):
                for key in s.elements:
                    out.owners.pop(element_id(fam, name, key), None)
                s = replace(s, elements={})
            sets[name] = s
        out.tables[fam] = replace(t, chains=dict(t.chains), sets=sets)
    for p in picks:
        o = rs.owners.get(chain_id(p.family, p.chain))
        if o:
            owners[(p.family, p.chain)] = o
        # back to offset 0 text; place() writes the new offset
        c = out.tables[p.family].chains[p.chain]
        out.tables[p.family].chains[p.chain] = replace(c, rules=c.rules[:-1] + (pick_rule(p, 0),))
    place(out, picks, owners, prev)
    return out
