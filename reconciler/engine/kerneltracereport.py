"""What `nftrec trace --kernel` read: the lines of `nft monitor trace`, parsed into events,
grouped per packet, summed up (the rule that dropped, rejected or accepted it, the DNAT and
its endpoint, the Service of nftrec's chains) and shown as text or JSON.

The parser takes nft 0.9.8 to 1.1.x: `trace id ID FAMILY TABLE CHAIN` and then `packet: …`,
`rule … (verdict V)`, `policy V [meta mark …]` or `verdict V [meta mark …]`; any other line
is kept as it is, never guessed at. The kernel reuses trace ids, so a packet starts where
the tracing table's chain reports it (the first chain every traced packet passes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from reconciler.engine.trace import chain_service
from reconciler.engine.tracereport import join_endpoint

_HEADER = re.compile(r"^trace id ([0-9a-fA-F]+) (\S+) (\S+) (\S+)(?: (.*))?$")
_RULE = re.compile(r"^rule (.*?) ?\(verdict ([^()]*)\)\s*$")
_MARK = re.compile(r"\s*meta mark (?:== )?(0x[0-9a-fA-F]+)\s*$")
_DEVICE = re.compile(r'\b(iif|oif) (?:== )?"([^"]*)"')
_ADDRESS = re.compile(r"\b(ip6?) (saddr|daddr) (?:== )?([0-9a-fA-F.:]+)")
_PORT = re.compile(r"\b(tcp|udp|udplite|sctp|dccp) (sport|dport) (?:== )?(\d+)")
_DNAT_TO = re.compile(r"\bdnat (?:ip6? )?to (\[[0-9a-fA-F:.]+\]:\d+|[0-9.]+:\d+)(?:\s|$)")
# NAT statements (not `ct status dnat`, a match): nft's own, and iptables-nft's xt targets
_DNAT = re.compile(r'(?:^|\s)(?:dnat(?: ip6?| inet)? to\s|redirect(?:\s|$)|xt target "?DNAT\b|xt target "?REDIRECT\b)')
_SNAT = re.compile(r'(?:^|\s)(?:snat(?: ip6?| inet)? to\s|masquerade(?:\s|$)|xt target "?(?:SNAT|MASQUERADE)\b)')
TERMINAL = ("drop", "accept", "queue", "stolen")


@dataclass(frozen=True)
class Headers:
    """What nft shows of the packet where a base chain first sees it."""

    proto: str = ""
    src: str = ""
    sport: int = 0
    dst: str = ""
    dport: int = 0
    iif: str = ""
    oif: str = ""

    @classmethod
    def parse(cls, text: str) -> "Headers":
        dev = dict(_DEVICE.findall(text))
        addr = {k: v for _, k, v in _ADDRESS.findall(text)}
        ports = _PORT.findall(text)
        return cls(ports[0][0] if ports else "", addr.get("saddr", ""),
                   int(next((p for _, k, p in ports if k == "sport"), 0)), addr.get("daddr", ""),
                   int(next((p for _, k, p in ports if k == "dport"), 0)), dev.get("iif", ""), dev.get("oif", ""))

    def text(self) -> str:
        src = join_endpoint(self.src, self.sport) if self.sport else self.src
        dst = join_endpoint(self.dst, self.dport) if self.dport else self.dst
        devs = ", ".join(f"{k} {v}" for k, v in (("in", self.iif), ("out", self.oif)) if v)
        return f"{self.proto or 'packet'} {src} -> {dst}" + (f" ({devs})" if devs else "")

    def to_json(self) -> dict:
        return {"proto": self.proto or None, "src": self.src or None, "sport": self.sport or None,
                "dst": self.dst or None, "dport": self.dport or None, "iif": self.iif or None,
                "oif": self.oif or None}


@dataclass(frozen=True)
class Event:
    """One line of `nft monitor trace`. kind: packet | rule | policy | return | other."""

    trace_id: str
    family: str
    table: str
    chain: str
    kind: str
    rule: str = ""
    verdict: str = ""  # accept, drop, continue, return, jump X, goto X, queue, ...
    mark: str = ""
    headers: Headers | None = None
    raw: str = ""  # the text after the chain (kind other)

    @property
    def where(self) -> str:
        return f"{self.family} {self.table} {self.chain}"

    def to_json(self) -> dict:
        d = {"family": self.family, "table": self.table, "chain": self.chain, "kind": self.kind}
        if self.kind == "rule":
            d["rule"] = self.rule
        if self.verdict:
            d["verdict"] = self.verdict
        if self.headers is not None:
            d["packet"] = self.headers.to_json()
        if self.mark:
            d["mark"] = self.mark
        if self.kind == "other":
            d["text"] = self.raw
        return d


def parse_line(line: str) -> Event | None:
    """One line of `nft monitor trace`, or None for a line that is not a trace event."""
    m = _HEADER.match(line.rstrip("\r\n").rstrip())
    if m is None:
        return None
    tid, family, table, chain, rest = m.group(1).lower(), m.group(2), m.group(3), m.group(4), (m.group(5) or "")
    rest = rest.strip()
    if rest.startswith("packet:"):
        return Event(tid, family, table, chain, "packet", headers=Headers.parse(rest[7:]))
    if rest.startswith("rule ") or rest == "rule":
        r = _RULE.match(rest)
        if r is None:
            return Event(tid, family, table, chain, "rule", rule=rest[5:].strip())
        return Event(tid, family, table, chain, "rule", rule=r.group(1).strip(), verdict=r.group(2).strip())
    for word, kind in (("policy", "policy"), ("verdict", "return")):
        if rest.startswith(word + " "):
            body = rest[len(word) + 1:]
            mk = _MARK.search(body)
            if mk:
                body = body[:mk.start()]
            return Event(tid, family, table, chain, kind, verdict=body.strip(), mark=mk.group(1) if mk else "")
    return Event(tid, family, table, chain, "other", raw=rest)


@dataclass
class TracedPacket:
    trace_id: str
    events: list[Event] = field(default_factory=list)  # the tracing table's own left out
    first: Headers | None = None  # as the first chain saw it


class Grouper:
    """Events → packets, in the order they started. A packet starts with the tracing
    table's `packet:` line (`tracer`: that table's name) or with a trace id not seen yet."""

    def __init__(self, tracer: str):
        self.tracer = tracer
        self.packets: list[TracedPacket] = []
        self._current: dict[str, TracedPacket] = {}

    def add(self, ev: Event) -> bool:
        """Take one event; True when it started a packet."""
        own = ev.table == self.tracer
        pkt = self._current.get(ev.trace_id)
        started = pkt is None or (own and ev.kind == "packet")
        if started:
            pkt = TracedPacket(ev.trace_id)
            self.packets.append(pkt)
            self._current[ev.trace_id] = pkt
        if pkt.first is None and ev.headers is not None:
            pkt.first = ev.headers
        if not own:
            pkt.events.append(ev)
        return started

    def feed(self, lines) -> "Grouper":
        for line in lines:
            ev = parse_line(line)
            if ev is not None:
                self.add(ev)
        return self


@dataclass
class Fate:
    """A packet's summary: its verdict, the event that decided it, its DNAT."""

    verdict: str  # drop | reject | accept | queue | stolen | passed (no chain ended it)
    decided_by: Event | None
    accepted_by: list[Event]
    dnat: Event | None
    endpoint: str | None
    service: str | None
    nat: list[Event]  # masquerade / snat rules
    translated: str | None = None  # the destination conntrack gave it, without a NAT rule

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "decidedBy": self.decided_by.to_json() if self.decided_by else None,
                "acceptedBy": [e.to_json() for e in self.accepted_by],
                "dnat": ({"endpoint": self.endpoint, "by": self.dnat.to_json()} if self.dnat else None),
                "translatedTo": self.translated, "service": self.service, "snat": [e.to_json() for e in self.nat]}


def _words(rule: str) -> list[str]:
    return re.findall(r'"[^"]*"|\S+', rule)


def fate(pkt: TracedPacket, own_table: str) -> Fate:
    """What happened to `pkt`; `own_table`: nftrec's table name, whose chain names say
    the Service."""
    decided, accepted, nat = None, [], []
    dnat, endpoint, service = None, None, None
    verdict = "passed"
    for i, ev in enumerate(pkt.events):
        if ev.table == own_table and service is None and dnat is None:
            service = chain_service(ev.chain) or service
        words = _words(ev.rule) if ev.kind == "rule" else []
        if ev.kind == "rule" and dnat is None and ev.verdict == "accept" and _DNAT.search(ev.rule):
            dnat = ev
            if ev.table == own_table:
                service = chain_service(ev.chain) or service
            endpoint = _endpoint_after(pkt, i) or _literal_dnat(ev.rule)
            continue
        if ev.kind == "rule" and ev.verdict == "accept" and _SNAT.search(ev.rule):
            nat.append(ev)
            continue
        v = ev.verdict.split(" ", 1)[0] if ev.verdict else ""
        if ev.kind in ("rule", "policy") and v in TERMINAL:
            if v == "accept":
                if ev.kind == "rule":
                    accepted.append(ev)
                continue
            verdict = "reject" if v == "drop" and "reject" in words else v
            decided = ev
            break
    if decided is None and accepted:
        verdict, decided = "accept", accepted[-1]
    # no DNAT rule, yet a later chain saw another destination: a packet of a connection
    # NATed before (conntrack translates it; the NAT chains see only a connection's first)
    translated = _endpoint_after(pkt, -1) if dnat is None else None
    return Fate(verdict, decided, accepted, dnat, endpoint, service, nat, translated)


def _endpoint_after(pkt: TracedPacket, i: int) -> str | None:
    """ip:port of the packet as the next base chain after event `i` saw it, if changed."""
    before = pkt.first
    for ev in pkt.events[i + 1:]:
        h = ev.headers
        if h is not None and h.dst and (before is None or (h.dst, h.dport) != (before.dst, before.dport)):
            return join_endpoint(h.dst, h.dport) if h.dport else h.dst
    return None


def _literal_dnat(rule: str) -> str | None:
    m = _DNAT_TO.search(rule)
    return m.group(1) if m else None


def _event_text(ev: Event) -> str:
    if ev.kind == "packet":
        return f"{ev.where}: enters: {ev.headers.text()}"
    if ev.kind == "rule":
        return f"{ev.where}: rule {ev.rule}" + (f" -> {ev.verdict}" if ev.verdict else "")
    if ev.kind == "policy":
        return f"{ev.where}: policy {ev.verdict}"
    if ev.kind == "return":
        return f"{ev.where}: {ev.verdict or 'return'} (end of chain)"
    return f"{ev.where}: {ev.raw}"


def _decision(f: Fate) -> str:
    d = f.decided_by
    if d is None:
        return "passed every chain that saw it; none dropped it"
    how = {"drop": "DROPPED", "reject": "REJECTED", "accept": "ACCEPTED", "queue": "QUEUED to user space",
           "stolen": "taken over (stolen)"}.get(f.verdict, f.verdict.upper())
    if d.kind == "policy":
        return f"{how} by the policy of {d.where}"
    return f"{how} by {d.where} rule `{d.rule}`"


def format_packet(n: int, total: int, pkt: TracedPacket, f: Fate, services: dict[str, str]) -> list[str]:
    head = pkt.first.text() if pkt.first else "packet"
    lines = [f"packet {n} of {total} (trace id {pkt.trace_id}): {head}"]
    for ev in pkt.events:
        lines.append("  " + _event_text(ev))
        if ev is f.dnat:
            lines.append(f"      DNAT to {f.endpoint or 'an endpoint nft did not show'}"
                         + (f" (Service {f.service})" if f.service else ""))
    lines.append(f"verdict: {_decision(f)}")
    if f.dnat is not None:
        lines.append(f"  after DNAT to {f.endpoint or '?'} by {f.dnat.where} rule `{f.dnat.rule}`")
    elif f.translated:
        lines.append(f"  translated to {f.translated} by conntrack: a packet of a connection DNATed before "
                     f"(NAT rules see only a connection's first packet)")
    else:
        lines.append("  not DNATed")
    if f.verdict in ("drop", "reject") and f.accepted_by:
        last = f.accepted_by[-1]
        lines.append(f"  accepted earlier by {last.where} rule `{last.rule}`")
    lines += [f"  source NAT by {e.where} rule `{e.rule}`" for e in f.nat]
    if f.service:
        src = services.get(f.service)
        lines.append(f"service: {f.service}" + (f" ({src})" if src else ""))
    return lines


NOTES = ("traced by the kernel (meta nftrace): every table of the namespace, iptables-nft's included",
         "nft shows a rule only when it matched; rules the packet did not match are not listed",
         "the tracing table's own chain is not shown")


def format_text(packets: list[TracedPacket], fates: list[Fate], services: dict[str, str] | None = None,
                notes: tuple[str, ...] = NOTES) -> str:
    lines = []
    for n, (pkt, f) in enumerate(zip(packets, fates), 1):
        lines += format_packet(n, len(packets), pkt, f, services or {})
    lines += [f"note: {x}" for x in notes]
    return "\n".join(lines)


def to_json(packets: list[TracedPacket], fates: list[Fate], services: dict[str, str] | None = None,
            notes: tuple[str, ...] = NOTES) -> dict:
    return {"kernel": True, "packets": [
        {"traceId": p.trace_id, "packet": p.first.to_json() if p.first else None,
         "source": (services or {}).get(f.service) if f.service else None,
         "path": [e.to_json() for e in p.events], **f.to_json()} for p, f in zip(packets, fates)],
        "notes": list(notes)}
