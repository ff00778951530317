"""What `nftrec trace` found, and how it is shown: the packet, the path of rules each
outcome took, and the summary (endpoints with their probabilities, masquerade, Service),
as text or JSON.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from fractions import Fraction


def join_endpoint(ip: str, port: int) -> str:
    """`ip:port`, with an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass(frozen=True)
class Packet:
    src: str
    dst: str
    dport: int
    proto: str = "tcp"
    origin: str = "external"  # pod | node | external

    @property
    def family(self) -> str:
        return "ip" if ipaddress.ip_address(self.dst).version == 4 else "ip6"


@dataclass(frozen=True)
class Step:
    hook: str
    chain: str
    rule: str  # the rule text as interpreted ("" for "chain ends")
    index: int  # rule position in the chain (0-based); -1: the chain ended
    note: str = ""

    def to_json(self) -> dict:
        d = {"hook": self.hook, "chain": self.chain, "rule": self.rule, "index": self.index}
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class Outcome:
    probability: Fraction
    verdict: str  # dnat | drop | reject | local (delivered to the node, not DNATed) | forward
    endpoint: str | None
    masquerade: bool
    affinity: bool
    steps: list[Step]
    decided_by: Step | None
    service: str | None
    branch: str = ""

    def to_json(self) -> dict:
        return {
            "probability": str(self.probability), "probabilityValue": float(self.probability),
            "verdict": self.verdict, "endpoint": self.endpoint, "masquerade": self.masquerade,
            "affinity": self.affinity, "service": self.service, "branch": self.branch or None,
            "decidedBy": self.decided_by.to_json() if self.decided_by else None,
            "path": [s.to_json() for s in self.steps],
        }


@dataclass
class Trace:
    packet: Packet
    family: str
    ruleset_kind: str  # desired | live | applied (the state's last applied one)
    outcomes: list[Outcome]
    notes: list[str]
    services: dict[str, str] = field(default_factory=dict)  # "ns/name" -> "file:line"

    # --- summaries the tests and the text output use ---

    @property
    def endpoints(self) -> dict[str, Fraction]:
        out: dict[str, Fraction] = {}
        for o in self.outcomes:
            if o.verdict == "dnat":
                out[o.endpoint] = out.get(o.endpoint, Fraction(0)) + o.probability
        return out

    @property
    def verdicts(self) -> set[str]:
        return {o.verdict for o in self.outcomes}

    @property
    def masquerade(self) -> set[bool]:
        return {o.masquerade for o in self.outcomes}

    @property
    def service(self) -> str | None:
        return next((o.service for o in self.outcomes if o.service), None)

    def to_json(self) -> dict:
        p = self.packet
        return {
            "packet": {"src": p.src, "dst": p.dst, "dport": p.dport, "proto": p.proto, "from": p.origin},
            "family": self.family, "ruleset": self.ruleset_kind,
            "verdicts": sorted(self.verdicts),
            "endpoints": {ep: {"probability": str(pr), "probabilityValue": float(pr)}
                          for ep, pr in sorted(self.endpoints.items())},
            "masquerade": sorted(self.masquerade),
            "service": self.service,
            "source": self.services.get(self.service) if self.service else None,
            "outcomes": [o.to_json() for o in self.outcomes],
            "notes": self.notes,
        }


def _verdict_line(o: Outcome) -> str:
    if o.verdict == "dnat":
        text = f"DNAT to {o.endpoint}"
    elif o.verdict in ("drop", "reject"):
        text = o.verdict.upper()
        if o.decided_by:
            text += f" by {o.decided_by.chain} rule {o.decided_by.index + 1}: {o.decided_by.rule}"
    elif o.verdict == "local":
        text = "delivered to the node itself, not DNATed"
    else:
        text = "forwarded unchanged (not DNATed)"
    if o.verdict not in ("drop", "reject"):
        text += ", masqueraded" if o.masquerade else ", not masqueraded"
    return text


def format_text(tr: Trace) -> str:
    p = tr.packet
    lines = [f"packet {p.proto} {p.src} -> {join_endpoint(p.dst, p.dport)} from {p.origin} "
             f"({tr.family} table, {tr.ruleset_kind} ruleset)"]
    common = tr.outcomes[0].steps if tr.outcomes else []
    for o in tr.outcomes[1:]:
        n = 0
        while n < min(len(common), len(o.steps)) and common[n] == o.steps[n]:
            n += 1
        common = common[:n]

    def step_line(s: Step) -> str:
        where = f"{s.hook:<11} {s.chain}"
        rule = f"[{s.index + 1}] {s.rule}" if s.index >= 0 else "(end)"
        return f"  {where}  {rule}" + (f"\n      -> {s.note}" if s.note else "")

    lines += [step_line(s) for s in common]
    if len(tr.outcomes) > 1:
        for n, o in enumerate(tr.outcomes, 1):
            lines.append(f"  branch {n}/{len(tr.outcomes)} (probability {o.probability}): {_verdict_line(o)}")
            lines += ["  " + step_line(s) for s in o.steps[len(common):]]
    lines.append("verdict:")
    eps = tr.endpoints
    for ep, pr in sorted(eps.items()):
        masq = {o.masquerade for o in tr.outcomes if o.endpoint == ep}
        lines.append(f"  DNAT to {ep} with probability {pr}"
                     + (", masqueraded" if masq == {True} else ", not masqueraded" if masq == {False}
                        else ", masqueraded on some paths"))
    for o in tr.outcomes:
        if o.verdict != "dnat":
            lines.append(f"  {_verdict_line(o)}" + (f" (probability {o.probability})" if o.probability != 1 else ""))
    svc = tr.service
    if svc:
        lines.append(f"service: {svc}" + (f" ({tr.services[svc]})" if tr.services.get(svc) else ""))
    else:
        lines.append("service: none (no Service's rules or elements matched)")
    lines += [f"note: {n}" for n in tr.notes]
    return "\n".join(lines)
