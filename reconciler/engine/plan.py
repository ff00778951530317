"""A plan: the semantic diff between desired and live, grouped by Service, with the
transaction that would make the kernel equal the desired ruleset.

Pipeline position: desired + live → diff → **plan** (summary, JSON, saved file) → apply.
Terraform's shape: one line per Service with `+ ~ -`, then a count of operations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from reconciler import logs
from reconciler.engine.changes import Change, Changes, diff, transaction_for
from reconciler.intake import Service
from reconciler.compile import join_host_port
from reconciler.kernel import Transaction
from reconciler.compile import Ruleset, chain_id, chain_range, element_id, set_id

PLAN_JSON_VERSION = 1

# Endpoint targets inside DNAT rules, in both our text and nft's read-back form:
# `dnat to 10.0.0.1:80`, `dnat to [fd00::1]:80`, map entries `0 : 10.0.0.1 . 80`.
_DNAT_ONE = re.compile(r"dnat to (\[[0-9A-Fa-f:.]+\]|[0-9.]+):(\d+)")
_DNAT_MAP = re.compile(r"\d+ : ([0-9A-Fa-f:.]+) \. (\d+)")


@dataclass
class ServiceChange:
    action: str  # "+" new Service, "~" changed, "-" removed
    service: str  # "namespace/name"
    summary: str  # one line: what and why
    changes: list[Change] = field(default_factory=list)


@dataclass
class Plan:
    desired: Ruleset
    changes: Changes
    transaction: Transaction
    services: list[ServiceChange]  # sorted by Service
    shared: list[Change]  # changes to objects of no Service (tables, base chains, ...)
    # Service key -> (trafficDistribution, slices) whose topology hints nftrec derived
    # (compile.derived_topology_hints); shown whether or not the Service changed
    derived_hints: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return len(self.transaction) == 0


def _endpoints_by_owner(rs: Ruleset, owners: set[str]) -> dict[str, set[str]]:
    """`ip:port` targets of the DNAT rules in the chains each of `owners` owns in `rs`.

    One pass over the chains for all owners (a pass per owner is quadratic)."""
    from reconciler.engine.changes import owner_of_name

    out: dict[str, set[str]] = {o: set() for o in owners}
    for t in rs.tables.values():
        for name, chain in t.chains.items():
            eps = out.get(owner_of_name(name))
            if eps is None:
                continue
            for rule in chain.rules:
                body = rule.body
                # a substring test is cheaper than a regex scan, and most rules hold
                # neither pattern's literal part
                if "dnat to " in body:
                    for ip, port in _DNAT_ONE.findall(body):
                        eps.add(f"{ip}:{port}")
                if " : " in body:
                    for ip, port in _DNAT_MAP.findall(body):
                        eps.add(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
            rng = chain_range(chain)  # layout sharded: the chain's index range of a shared map
            if rng is not None and rng[0] in t.sets:
                elems = t.sets[rng[0]].elements
                for i in range(rng[1], rng[1] + rng[2]):
                    e = elems.get((str(i),))
                    if e is not None and e.value and " . " in e.value:
                        ip, port = e.value.split(" . ", 1)
                        eps.add(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    return out


def _live_ids(live: Ruleset) -> set[str]:
    ids: set[str] = set()
    for fam, t in live.tables.items():
        ids.update(chain_id(fam, n) for n in t.chains)
        for s in t.sets.values():
            ids.add(set_id(fam, s.name))
            keys = live.focus.get((fam, s.name))  # a projection's shared set: the changed Services' keys
            ids.update(element_id(fam, s.name, k) for k in (s.elements if keys is None else
                                                            (k for k in keys if k in s.elements)))
    return ids


def _describe_new(svc: Service | None, endpoints: int) -> str:
    if svc is None:
        return "new objects"
    fronts = [f"{join_host_port(ip, p.port)}/{p.protocol}" for ip in svc.cluster_ips for p in svc.ports]
    shown = ", ".join(fronts[:3]) + (f" (+{len(fronts) - 3} more)" if len(fronts) > 3 else "")
    target = f"{endpoints} endpoint{'s' if endpoints != 1 else ''}" if endpoints else "no endpoints (reject)"
    return f"{svc.type} {shown or 'headless'} -> {target}"


def _describe_change(changes: list[Change], old_eps: set[str], new_eps: set[str]) -> str:
    parts = []
    added, removed = sorted(new_eps - old_eps), sorted(old_eps - new_eps)
    if added or removed:
        parts.append("endpoints " + " ".join([f"+{e}" for e in added] + [f"-{e}" for e in removed]))
    by_set: dict[str, list[str]] = {}
    chains: list[str] = []
    for c in changes:
        sign = {"add": "+", "remove": "-", "change": "~"}[c.action]
        if (added or removed) and c.kind == "element" and c.name.startswith("endpoint-dnat-"):
            continue  # the shared endpoint maps (layout sharded): the endpoint delta says it
        if c.kind == "element":
            by_set.setdefault(c.name, []).append(sign)
        elif c.kind in ("chain", "set"):
            chains.append(f"{sign}{c.name.split('-', 1)[0]}")
    if chains and not (added or removed):
        parts.append("chains " + " ".join(sorted(set(chains))))
    for name in sorted(by_set):
        signs = by_set[name]
        counts = " ".join(f"{s}{signs.count(s)}" for s in "+-~" if signs.count(s))
        parts.append(f"{name} {counts}")
    return "; ".join(parts) or "rewritten"


def make_plan(desired: Ruleset, live: Ruleset, services: dict[str, Service] | None = None,
              derived_hints: dict[str, tuple[str, tuple[str, ...]]] | None = None) -> Plan:
    """Diff `desired` against `live` (canonical, from live.read_live) and explain it.
    `derived_hints` (compile.derived_topology_hints) is only reported."""
    changes = diff(desired, live)
    tx = transaction_for(changes, desired)
    services = services or {}
    grouped = changes.by_owner()
    shared = grouped.pop(None, [])
    live_ids = _live_ids(live) if grouped else set()
    # Indexes built once (per-owner scans of desired.owners and of every chain made a
    # plan with many changed Services quadratic).
    owned: dict[str, list[str]] = {}
    for oid, o in desired.owners.items():
        if o in grouped:
            owned.setdefault(o, []).append(oid)
    new_eps = _endpoints_by_owner(desired, set(grouped))
    old_eps = _endpoints_by_owner(live, set(grouped))
    # A re-created table rewrites every object in it; say that once per Service instead
    # of listing each of its objects as new.
    recreated = {fam for fam, fc in changes.families.items() if fc.table and fc.table.action == "change"}
    out: list[ServiceChange] = []
    for owner in sorted(grouped):
        group = grouped[owner]
        owned_in_desired = owned.get(owner, [])
        if not owned_in_desired:
            out.append(ServiceChange("-", owner, "removed", group))
        elif not any(oid in live_ids for oid in owned_in_desired):
            eps = len(new_eps[owner])
            out.append(ServiceChange("+", owner, _describe_new(services.get(owner), eps), group))
        elif recreated and all(c.family in recreated for c in group):
            fams = " and ".join(f"table {f}" for f in sorted({c.family for c in group}))
            delta = _describe_change([], old_eps[owner], new_eps[owner])
            summary = f"rewritten with {fams}" + (f"; {delta}" if delta != "rewritten" else "")
            out.append(ServiceChange("~", owner, summary, group))
        else:
            summary = _describe_change(group, old_eps[owner], new_eps[owner])
            out.append(ServiceChange("~", owner, summary, group))
    return Plan(desired, changes, tx, out, shared, dict(derived_hints or {}))


# --- output ------------------------------------------------------------------------------


NO_CHANGES = "No changes. The kernel matches the desired ruleset."


def format_text(plan: Plan, *, verbose: bool = False, color: bool = False, no_changes: str = NO_CHANGES) -> str:
    lines = []
    paint = {"+": "\033[32m", "~": "\033[33m", "-": "\033[31m"} if color else {}
    reset = "\033[0m" if color else ""
    for sc in plan.services:
        line = f"{sc.action} {sc.service}" + (f" {sc.summary}" if sc.action != "-" else "")
        if sc.action != "-" and sc.service in plan.derived_hints:
            line += f" (topology hints derived: {plan.derived_hints[sc.service][0]})"
        # names come from the model (validated) or a saved plan file (not): escaped either way
        lines.append(f"{paint.get(sc.action, '')}{logs.escape(line)}{reset}")
    for family in sorted({c.family for c in plan.shared}):
        # Objects of no Service: tables, base chains, static sets/maps and their elements.
        group = [c for c in plan.shared if c.family == family]
        table = next((c for c in group if c.kind == "table"), None)
        sign = {"add": "+", "remove": "-"}.get(table.action, "~") if table else "~"
        counts = " ".join(f"{s}{n}" for s, n in (
            ("+", sum(c.action == "add" for c in group)), ("~", sum(c.action == "change" for c in group)),
            ("-", sum(c.action == "remove" for c in group))) if n)
        names = sorted({c.name for c in group if c.kind != "table"})
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        why = f" {table.reason};" if table and table.action == "change" else ""
        text = logs.escape(f"{sign} table {family}{why} (shared objects {counts}: {shown})")
        lines.append(f"{paint.get(sign, '')}{text}{reset}")
    if plan.derived_hints:
        lines.append(logs.escape(derived_hints_note(plan.derived_hints)))
    if plan.empty:
        lines.append(no_changes)
    else:
        counts = {a: sum(1 for s in plan.services if s.action == a) for a in "+~-"}
        lines.append(
            f"Plan: {counts['+']} to add, {counts['~']} to change, {counts['-']} to remove; "
            f"{len(plan.transaction)} nft operation{'s' if len(plan.transaction) != 1 else ''}."
        )
    if verbose and not plan.empty:
        lines.append("")
        lines.append("Transaction:")
        lines.extend(f"  {logs.escape(str(op))}" for op in plan.transaction)
    return "\n".join(lines) + "\n"


def derived_hints_note(derived: dict[str, tuple[str, tuple[str, ...]]]) -> str:
    """One line: which Services got topology hints derived from trafficDistribution."""
    keys = sorted(derived)
    shown = ", ".join(f"{k} ({derived[k][0]}: {', '.join(derived[k][1])})" for k in keys[:3])
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    return (f"Note: topology hints derived from spec.trafficDistribution for EndpointSlices without hints: "
            f"{shown}{more}; set deriveTopologyHints: false in the node config to follow only explicit hints, "
            f"as kube-proxy does.")


def _change_json(c: Change) -> dict:
    return {"action": c.action, "family": c.family, "kind": c.kind, "name": c.name,
            "key": list(c.key) if c.key else None, "reason": c.reason}


def to_json(plan: Plan, **context) -> dict:
    """The documented `plan -o json` document (README, "Plan JSON")."""
    counts = {a: sum(1 for s in plan.services if s.action == a) for a in "+~-"}
    return {
        "formatVersion": PLAN_JSON_VERSION,
        **context,
        "changed": not plan.empty,
        "summary": {"add": counts["+"], "change": counts["~"], "remove": counts["-"],
                    "operations": len(plan.transaction)},
        "services": [
            {"action": s.action, "service": s.service, "summary": s.summary,
             "objects": [_change_json(c) for c in s.changes]}
            for s in plan.services
        ],
        "shared": [_change_json(c) for c in plan.shared],
        "derivedHints": [{"service": k, "trafficDistribution": td, "slices": list(names)}
                         for k, (td, names) in sorted(plan.derived_hints.items())],
        "transaction": list(plan.transaction),
    }
