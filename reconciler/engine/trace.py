"""The evaluator of `nftrec trace`: one new connection's first packet through nftrec's
table, without sending it. Base chains are found by hook and priority, so the walk follows
the Ruleset. Rules are read in `kernel.canonical`'s normal form, one grammar for the desired
and the live ruleset: exactly what the compiler emits (`Evaluator._rule`). Anything else
raises `UnknownExpression`: a trace never guesses.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from fractions import Fraction

from reconciler.compile import Ruleset, Table, chain_id, element_id
from reconciler.engine.tracereport import Outcome, Packet, Step, Trace, join_endpoint
from reconciler.intake import leading_zero_octet
from reconciler.kernel import canonical, rule_tokens

ORIGINS = ("pod", "node", "external")
PROTOCOLS = ("tcp", "udp", "sctp")
_OWNER_IN_NAME = re.compile(r"^(?:service|local|external|firewall|endpoint|affinity)-[A-Z0-9]{8}-([^/]+)/([^/]+)/")
_MAX_DEPTH = 64  # jump/goto nesting; nftrec's deepest path is 5


def chain_service(chain: str) -> str | None:
    """The Service (`ns/name`) a chain of nftrec's belongs to, read from its name
    (kube-proxy's `service-HASH-ns/name/proto/port` and kin), or None."""
    m = _OWNER_IN_NAME.match(chain)
    return f"{m.group(1)}/{m.group(2)}" if m else None


class UnknownExpression(Exception):
    """A rule the evaluator cannot interpret: reported, never guessed."""

    def __init__(self, family: str, chain: str, rule: str, at: str):
        self.family, self.chain, self.rule, self.at = family, chain, rule, at
        super().__init__(f"trace cannot interpret `{at}` in {family} chain {chain}: `{rule}`. "
                         f"The verdict would be a guess, so there is none; this rule was not "
                         f"written by nftrec's compiler, or the evaluator lags behind it")


class TraceError(Exception):
    """Bad trace input (addresses, ports, families)."""


@dataclass
class _State:
    src: str
    daddr: str
    dport: int
    proto: str
    origin: str
    mark: int = 0
    dnat: str | None = None  # "ip:port" after DNAT
    masquerade: bool = False
    verdict: str | None = None  # drop | reject | accept (terminal, from a rule)
    decided_by: Step | None = None
    probability: Fraction = Fraction(1)
    affinity: bool = False
    steps: list[Step] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)  # Services whose objects were touched
    branch: str = ""  # how this branch was chosen (numgen value)

    def fork(self) -> "_State":
        return replace(self, steps=list(self.steps), owners=list(self.owners))


def _tokens(text: str) -> list[str]:
    """kernel.rule_tokens, with each balanced `{ … }` group joined back into one token
    (`{ a, b }`, as the normal form prints it)."""
    out: list[str] = []
    depth = 0
    for t in rule_tokens(text):
        if depth:
            out[-1] += t if t == "," else " " + t
            depth += (t == "{") - (t == "}")
        else:
            out.append(t)
            depth = int(t == "{")
    if depth:
        raise ValueError("unbalanced braces")
    return out


def _group_items(tok: str) -> list[str]:
    inner = tok.strip()[1:-1].strip()
    return [x.strip() for x in inner.split(",") if x.strip()]


def _addr_match(value: str, candidates: list[str]) -> bool:
    a = ipaddress.ip_address(value)
    for c in candidates:
        try:
            if "-" in c and "/" not in c:
                lo, hi = (ipaddress.ip_address(x) for x in c.split("-", 1))
                if lo.version == a.version and lo <= a <= hi:
                    return True
            elif a in ipaddress.ip_network(c, strict=False):
                return True
        except (ValueError, TypeError):
            raise ValueError(c) from None
    return False


def _split_endpoint(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, port = text[1:].split("]:", 1)
    else:
        host, port = text.rsplit(":", 1)
    ipaddress.ip_address(host)
    return host, int(port)


class _Unknown(Exception):
    def __init__(self, at: str):
        self.at = at


class Evaluator:
    def __init__(self, ruleset: Ruleset, family: str, local_addresses: set[str]):
        self.family = family
        self.table: Table | None = canonical(ruleset).tables.get(family)
        self.owners = ruleset.owners
        self.local = {str(ipaddress.ip_address(a)) for a in local_addresses}

    # --- ownership ---

    def _chain_owner(self, chain: str) -> str | None:
        return self.owners.get(chain_id(self.family, chain)) or chain_service(chain)

    def _element_owner(self, set_name: str, key: tuple[str, ...], comment: str | None) -> str | None:
        o = self.owners.get(element_id(self.family, set_name, key))
        if o:
            return o
        if comment and "/" in comment:  # no-endpoint elements carry "ns/svc:port"
            return comment.split(":", 1)[0]
        return None

    def _is_local(self, ip: str) -> bool:
        a = ipaddress.ip_address(ip)
        return a.is_loopback or str(a) in self.local

    # --- hooks ---

    def base_chains(self, hook: str, types: tuple[str, ...] = ("filter", "nat")) -> list[str]:
        chains = [c for c in self.table.chains.values()
                  if c.base is not None and c.base.hook == hook and c.base.type in types]
        return [c.name for c in sorted(chains, key=lambda c: c.base.priority)]

    def run(self, packet: Packet) -> list[_State]:
        # kube-proxy's layout of hooks:
        #   from a pod or outside:  prerouting (filter -110, nat -100) ─► routing ─► input,
        #                           or forward ─► postrouting
        #   from the node:          output (filter -110, nat -100, filter 0) ─► postrouting
        #                           (─► input, when the destination is the node itself)
        st = _State(packet.src, packet.dst, packet.dport, packet.proto, packet.origin)
        if packet.origin == "node":
            plan = [("output", ("filter", "nat")), ("postrouting", ("filter", "nat"))]
        else:
            plan = [("prerouting", ("filter", "nat"))]
        states = [st]
        for hook, types in plan:
            states = [s2 for s in states for s2 in self._hook(s, hook, types)]
        done: list[_State] = []
        for s in states:
            if s.verdict in ("drop", "reject"):
                done.append(s)
                continue
            if packet.origin == "node":
                if self._is_local(s.daddr):  # looped back: input (NAT was decided in output)
                    done += self._hook(s, "input", ("filter",))
                else:
                    done.append(s)
            elif self._is_local(s.daddr):
                done += self._hook(s, "input", ("filter", "nat"))
            else:
                for s2 in self._hook(s, "forward", ("filter", "nat")):
                    done += self._hook(s2, "postrouting", ("filter", "nat")) if s2.verdict is None else [s2]
        return done

    def _hook(self, st: _State, hook: str, types: tuple[str, ...]) -> list[_State]:
        """Every base chain of `hook` in priority order. accept, dnat and masquerade end
        one base chain; drop and reject end the packet."""
        states = [st]
        for name in self.base_chains(hook, types):
            nxt = []
            for s in states:
                if s.verdict in ("drop", "reject"):
                    nxt.append(s)
                    continue
                for s2, v in self._chain(s, hook, name, 0):
                    if v in ("drop", "reject"):
                        s2.verdict = v
                    nxt.append(s2)
            states = nxt
        return states

    def _chain(self, st: _State, hook: str, name: str, depth: int) -> list[tuple[_State, str | None]]:
        """Evaluate `name`: [(state, verdict)], verdict None when the chain ran to its end
        (or `return`ed), else drop | reject | accept | nat. `goto` replaces this chain, so
        what the target returns is this chain's result; `jump` continues after it."""
        if depth > _MAX_DEPTH:
            raise UnknownExpression(self.family, name, "", "jump/goto nesting deeper than 64")
        chain = self.table.chains.get(name)
        if chain is None:
            raise UnknownExpression(self.family, name, "", f"jump/goto to missing chain {name}")
        owner = self._chain_owner(name)
        if owner and owner not in st.owners:
            st.owners.append(owner)
        results: list[tuple[_State, str | None]] = []
        pending = [(st, 0)]
        while pending:
            s, i = pending.pop(0)
            while i < len(chain.rules):
                rule = chain.rules[i]
                step = Step(hook, name, rule.body + (f' comment "{rule.comment}"' if rule.comment else ""), i)
                try:
                    branches = self._rule(s, rule.body, step)
                except _Unknown as e:
                    raise UnknownExpression(self.family, name, rule.body, e.at) from None
                except (ValueError, IndexError, KeyError) as e:
                    raise UnknownExpression(self.family, name, rule.body, f"malformed operand {e}") from None
                if branches is not None:
                    break
                i += 1
            else:
                results.append((s, None))  # ran to the end of the chain
                continue
            for b, (kind, arg) in branches:
                if kind == "next":
                    pending.append((b, i + 1))
                elif kind == "jump":
                    for b2, v in self._chain(b, hook, arg, depth + 1):
                        if v is None:
                            pending.append((b2, i + 1))
                        else:
                            results.append((b2, v))
                elif kind == "goto":
                    results += self._chain(b, hook, arg, depth + 1)
                elif kind == "return":
                    results.append((b, None))
                else:
                    results.append((b, kind))  # drop | reject | accept | nat
        return results

    # --- one rule ---

    def _rule(self, st: _State, body: str, step: Step):
        """None (no match) or [(state, (action, arg))]: action next | jump | goto |
        return | drop | reject | accept | nat; several entries for numgen."""
        toks = _tokens(body)
        i = 0
        fam = self.family

        def need(n: int) -> None:
            if i + n > len(toks):
                raise _Unknown(" ".join(toks[i:]) or body)

        def selector(j: int) -> tuple[object, int] | None:
            """A value selector at toks[j]: (value, next index) or None."""
            t = toks[j:j + 2]
            if len(t) == 2 and t[0] == fam and t[1] in ("saddr", "daddr"):
                value = st.src if t[1] == "saddr" else st.daddr
                if toks[j + 2:j + 3] == ["&"] and j + 3 < len(toks):
                    # `ip daddr & 0.0.0.63`: the sharded hairpin dispatch (compile/layout.py)
                    try:
                        a, mask = ipaddress.ip_address(value), ipaddress.ip_address(toks[j + 3])
                    except ValueError:
                        raise _Unknown(" ".join(toks[j:j + 4])) from None
                    if a.version != mask.version:
                        raise _Unknown(" ".join(toks[j:j + 4]))
                    return str(type(a)(int(a) & int(mask))), j + 4
                return value, j + 2
            if t == ["meta", "l4proto"]:
                return st.proto, j + 2
            if t == ["th", "dport"]:
                return str(st.dport), j + 2
            return None

        def constant(j: int) -> tuple[object, int] | None:
            """`numgen random mod 1 [offset K]` at toks[j], always K: the shared affinity
            set's endpoint id (compile/layout.affinity_key); only inside a concatenation."""
            if toks[j:j + 4] != ["numgen", "random", "mod", "1"]:
                return None
            if toks[j + 4:j + 5] == ["offset"]:
                return str(int(toks[j + 5])), j + 6
            return "0", j + 4

        while i < len(toks):
            t = toks[i]
            sel = selector(i)
            if sel is not None:
                values = [sel[0]]
                i = sel[1]
                while i < len(toks) and toks[i] == ".":
                    nxt = selector(i + 1) or constant(i + 1)
                    if nxt is None:
                        raise _Unknown(" ".join(toks[i:i + 3]))
                    values.append(nxt[0])
                    i = nxt[1]
                need(1)
                op = toks[i]
                if op == "vmap":
                    need(2)
                    verdict = self._lookup(st, toks[i + 1], values, want_value=True)
                    if verdict is None:
                        return None
                    self._note(st, step, f"{' . '.join(map(str, values))} -> {verdict}")
                    if verdict in ("drop", "accept"):
                        st.decided_by = step
                    return [(st, self._verdict(verdict))]
                negate = op == "!="
                if negate:
                    i += 1
                    need(1)
                operand = toks[i]
                i += 1
                if operand.startswith("@"):
                    found = self._lookup(st, operand, values, want_value=False)
                    if operand[1:].startswith("affinity-"):
                        st.affinity = True
                        hit = False  # a new client is in no affinity set yet
                    else:
                        hit = found is not None
                elif operand.startswith("{"):
                    if len(values) != 1:
                        raise _Unknown(operand)
                    hit = self._literal_match(values[0], _group_items(operand))
                else:
                    if len(values) != 1:
                        raise _Unknown(operand)
                    hit = self._literal_match(values[0], [operand])
                if hit == negate:
                    return None
                continue
            if t == "ct" and toks[i + 1:i + 3] == ["state", "new"]:
                i += 3
                continue
            if t == "ct" and toks[i + 1:i + 3] == ["status", "dnat"]:
                if st.dnat is None:
                    return None
                i += 3
                continue
            if t == "fib" and toks[i + 1:i + 4] in (["saddr", "type", "local"], ["daddr", "type", "local"]):
                addr = st.src if toks[i + 1] == "saddr" else st.daddr
                is_local = self._is_local(addr) or (toks[i + 1] == "saddr" and st.origin == "node")
                if not is_local:
                    return None
                i += 4
                continue
            if t == "meta" and toks[i + 1:i + 2] == ["mark"]:
                # `meta mark & 0x… != 0x…` (match) or `meta mark set meta mark |/^ 0x…` (statement)
                rest = toks[i + 2:i + 7]
                if rest[:1] == ["&"] and len(rest) >= 4 and rest[2] in ("!=", "=="):
                    val = st.mark & int(rest[1], 16)
                    want = int(rest[3], 16)
                    if (val != want) if rest[2] == "!=" else (val == want):
                        i += 6
                        continue
                    return None
                if rest[:3] == ["set", "meta", "mark"] and len(rest) >= 5 and rest[3] in ("|", "^"):
                    bits = int(rest[4], 16)
                    st.mark = st.mark | bits if rest[3] == "|" else st.mark ^ bits
                    i += 7
                    continue
                raise _Unknown(" ".join(toks[i:i + 7]))
            if t == "counter":
                i += 1
                while i + 1 < len(toks) and toks[i] in ("packets", "bytes"):
                    i += 2
                continue
            if t == "update" and i + 2 < len(toks) and toks[i + 1].startswith("@"):
                key = _group_items(toks[i + 2])
                # kube-proxy's `{ ip saddr }`, or the shared set's `{ ip saddr . <id> timeout Ns }`
                if not (key == [f"{fam} saddr"] or len(key) == 1 and re.fullmatch(
                        rf"{fam} saddr(?: \. numgen random mod 1(?: offset \d+)?)+ timeout \d+s", key[0])):
                    raise _Unknown(" ".join(toks[i:i + 3]))
                st.affinity = True
                st.steps.append(replace(step, note=f"records {st.src} in {toks[i + 1]}: its next "
                                                   f"connections go to the same endpoint"))
                i += 3
                continue
            if t in ("jump", "goto"):
                need(2)
                self._record(st, step)
                return [(st, (t, toks[i + 1]))]
            if t in ("drop", "accept", "return"):
                self._record(st, step)
                if t in ("drop",):
                    st.decided_by = step
                return [(st, (t, None))]
            if t == "reject":
                self._record(st, step)
                st.decided_by = step
                return [(st, ("reject", None))]
            if t == "numgen":
                need(5)
                if toks[i + 1:i + 3] != ["random", "mod"] or toks[i + 4] != "vmap":
                    raise _Unknown(" ".join(toks[i:i + 5]))
                n = int(toks[i + 3])
                table = self._numgen_table(toks[i + 5], n)
                out = []
                for k, verdict in table:
                    s2 = st.fork()
                    s2.probability = st.probability / n
                    s2.branch = f"numgen {k} of {n}"
                    self._note(s2, step, f"numgen = {k} (probability 1/{n}) -> {verdict}")
                    out.append((s2, self._verdict(verdict)))
                return out
            if t == "dnat":
                return self._dnat(st, toks[i + 1:], step)
            if t == "masquerade":
                rest = toks[i + 1:]
                if rest not in ([], ["fully-random"], ["random"], ["persistent"]):
                    raise _Unknown(" ".join(toks[i:]))
                st.masquerade = True
                self._record(st, step)
                return [(st, ("nat", None))]
            raise _Unknown(" ".join(toks[i:i + 3]))
        self._record(st, step)
        return [(st, ("next", None))]

    def _record(self, st: _State, step: Step) -> None:
        if not st.steps or replace(st.steps[-1], note="") != step:
            st.steps.append(step)

    def _note(self, st: _State, step: Step, note: str) -> _State:
        st.steps.append(replace(step, note=note))
        return st

    def _verdict(self, text: str) -> tuple[str, str | None]:
        words = text.split()
        if len(words) == 2 and words[0] in ("goto", "jump"):
            return words[0], words[1]
        if words in (["drop"], ["accept"], ["return"]):
            return words[0], None
        raise _Unknown(f"verdict {text}")

    def _numgen_table(self, group: str, n: int) -> list[tuple[int, str]]:
        """The `{ 0 : v, 1 : v }` of a numgen (v)map, or a named map `@m` keyed 0..N-1."""
        entries = []
        if group.startswith("@") and group[1:] in self.table.sets:
            for key, el in self.table.sets[group[1:]].elements.items():
                if len(key) != 1 or el.value is None:
                    raise _Unknown(f"numgen map {group} with key {' . '.join(key)}")
                entries.append((int(key[0]), el.value))
        elif group.startswith("{"):
            for item in _group_items(group):
                k, v = (x.strip() for x in item.split(":", 1))
                entries.append((int(k), v))
        else:
            raise _Unknown(group)
        if sorted(k for k, _ in entries) != list(range(n)):
            raise _Unknown(f"numgen mod {n} map without exactly keys 0..{n - 1}")
        return sorted(entries)

    def _dnat(self, st: _State, rest: list[str], step: Step):
        if rest[1:5] == ["addr", ".", "port", "to"]:  # the value is an address . port concatenation
            rest = rest[:1] + rest[4:]
        if rest[:1] == ["to"] and len(rest) == 2:
            targets = [(rest[1], Fraction(1), "")]
        elif rest[:2] == [self.family, "to"] and rest[2:5] == ["numgen", "random", "mod"] and \
                len(rest) == 8 and rest[6] == "map":
            n = int(rest[5])
            targets = []
            for k, v in self._numgen_table(rest[7], n):
                ip, port = (x.strip() for x in v.split(" . "))
                targets.append((join_endpoint(ip, int(port)), Fraction(1, n), f"numgen {k} of {n}"))
        else:
            raise _Unknown("dnat " + " ".join(rest))
        out = []
        for target, p, branch in targets:
            ip, port = _split_endpoint(target)
            s2 = st.fork() if len(targets) > 1 else st
            s2.probability = st.probability * p
            if branch:
                s2.branch = branch
            s2.dnat, s2.daddr, s2.dport = join_endpoint(ip, port), ip, port
            note = f"DNAT to {s2.dnat}" + (f" (probability {p})" if len(targets) > 1 else "")
            s2.steps.append(replace(step, note=note))
            out.append((s2, ("nat", None)))
        return out

    def _lookup(self, st: _State, ref: str, key: list, want_value: bool):
        """A named set/map lookup (`@name`) or an anonymous vmap (`{ k : v, … }`)."""
        key_t = tuple(str(k) for k in key)
        if ref.startswith("{"):
            for item in _group_items(ref):
                k, v = (x.strip() for x in item.split(":", 1))
                if tuple(x.strip() for x in k.split(" . ")) == key_t:
                    return v
            return None
        if not ref.startswith("@"):
            raise _Unknown(ref)
        s = self.table.sets.get(ref[1:])
        if s is None:
            raise _Unknown(f"missing set {ref}")
        for ekey, el in s.elements.items():
            if len(ekey) != len(key_t):
                raise _Unknown(f"{ref} keys have {len(ekey)} fields, the lookup {len(key_t)}")
            if all(self._field_match(a, b) for a, b in zip(key_t, ekey)):
                owner = self._element_owner(s.name, ekey, el.comment)
                if owner and owner not in st.owners:
                    st.owners.append(owner)
                return el.value if want_value else True
        return None

    @staticmethod
    def _field_match(value: str, element: str) -> bool:
        if value == element:
            return True
        try:
            a = ipaddress.ip_address(value)
        except ValueError:
            return False
        try:
            return a in ipaddress.ip_network(element, strict=False)
        except ValueError:
            return False

    @staticmethod
    def _literal_match(value: str, items: list[str]) -> bool:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return value in items
        try:
            return _addr_match(value, items)
        except ValueError as e:
            raise _Unknown(f"operand {e}") from None


def check_packet(packet: Packet) -> Packet:
    for a in (packet.src, packet.dst):
        if leading_zero_octet(a):  # the same refusal on every Python (ipaddress's begins with 3.9.5)
            raise TraceError(f"{a!r}: an IPv4 octet written with a leading zero (octal or decimal?); remove it")
    try:
        src, dst = ipaddress.ip_address(packet.src), ipaddress.ip_address(packet.dst)
    except ValueError as e:
        raise TraceError(str(e)) from None
    if src.version != dst.version:
        raise TraceError(f"--src {src} and --dst {dst} are of different IP families")
    if not 1 <= packet.dport <= 65535:
        raise TraceError(f"--dport {packet.dport} is not a port number (1-65535)")
    if packet.proto not in PROTOCOLS:
        raise TraceError(f"--proto {packet.proto!r}: one of {', '.join(PROTOCOLS)}")
    if packet.origin not in ORIGINS:
        raise TraceError(f"--from {packet.origin!r}: one of {', '.join(ORIGINS)}")
    return replace(packet, src=str(src), dst=str(dst))


def trace_packet(ruleset: Ruleset, packet: Packet, local_addresses=(), *,
                 ruleset_kind: str = "desired", sources: dict[str, str] | None = None) -> Trace:
    """What `ruleset` does to the first packet of a new connection. `local_addresses`:
    the node's own addresses (fib ... type local; input vs forward); the elements of
    `nodeport-ips` and loopback always count as local."""
    packet = check_packet(packet)
    family = packet.family
    local = set(local_addresses)
    table = ruleset.tables.get(family)
    notes = ["the packet opens a new connection (ct state new)",
             "only nftrec's own table is evaluated, not other tables on the node"]
    if table is not None and "nodeport-ips" in table.sets:
        local |= {k[0] for k in table.sets["nodeport-ips"].elements}
    if packet.origin == "node":
        local.add(packet.src)
    if table is None:
        notes.append(f"no {family} table: nftrec does nothing to this packet")
        local_dst = ipaddress.ip_address(packet.dst).is_loopback or packet.dst in local
        outcomes = [Outcome(Fraction(1), "local" if local_dst else "forward", None, False, False, [], None, None)]
        return Trace(packet, family, ruleset_kind, outcomes, notes, dict(sources or {}))
    ev = Evaluator(ruleset, family, local)
    outcomes = []
    for s in ev.run(packet):
        if s.verdict in ("drop", "reject"):
            verdict = s.verdict
        elif s.dnat:
            verdict = "dnat"
        else:
            verdict = "local" if ev._is_local(s.daddr) else "forward"
        outcomes.append(Outcome(s.probability, verdict, s.dnat if verdict == "dnat" else None,
                                s.masquerade and verdict not in ("drop", "reject"), s.affinity,
                                s.steps, s.decided_by, s.owners[0] if s.owners else None, s.branch))
    if any(o.affinity for o in outcomes):
        notes.append("ClientIP affinity: a client already in an endpoint's affinity set goes to that "
                     "endpoint; the probabilities are for a client seen for the first time")
    return Trace(packet, family, ruleset_kind, outcomes, notes, dict(sources or {}))
