"""`nftrec trace`: the command. It takes the desired ruleset (a `Desired`) or the live one
(read in the target's namespace), the node's addresses, and prints the evaluator's Trace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from reconciler.engine.trace import TraceError, UnknownExpression, trace_packet
from reconciler.engine.tracereport import Packet, format_text


def service_sources(inventory) -> dict[str, str]:
    out = {}
    for s in inventory.services:
        src = s.source
        out[s.key] = f"{src.file}:{src.line}" if src.line else src.file
    return out


def manifest_sources(directory: Path | None, node=None) -> dict[str, str]:
    """"ns/name" -> "file:line" of the Services in `directory` (none when None); a fleet
    root is read as `node`'s (a NodeConfig)."""
    if directory is None:
        return {}
    from reconciler.intake import identity_of, read_inventory

    return service_sources(read_inventory(directory, identity=None if node is None else identity_of(node)).inventory)


def applied_ruleset(target):
    """The ruleset the state store of `target` (a Target) recorded as applied last, for a
    trace given no DIR: nothing else is read. A CommandError says what to pass when none is."""
    from reconciler.engine.target import CommandError

    store = target.store()  # read only: a damaged file is reported (StateCorrupt), not moved aside
    status = store.status()
    entries = store.history()
    current = status.desired_digest or (entries[-1].digest if entries else None)
    entry = next((e for e in reversed(entries) if e.digest == current), None)
    if entry is None or status.cleaned_up_at:
        why = f"cleaned up at {status.cleaned_up_at}" if status.cleaned_up_at else "no applied ruleset"
        raise CommandError(f"{why} in {store.dir} (for {target.where}); pass the manifest "
                           f"directory: nftrec trace DIR --src IP --dst IP --dport N")
    return store.load_ruleset(entry)


def run_trace(packet: Packet, *, desired=None, live_target=None, applied_target=None, node=None,
              directory: Path | None = None, local_addresses=(), output: str = "text",
              out: TextIO | None = None) -> int:
    """`nftrec trace`: the desired ruleset (a `Desired`), the live one (`live_target`, a
    Target: read_live in its namespace), or the one its state recorded as applied
    (`applied_target`, with `node` its NodeConfig). Exit 0 with a verdict, 1 on an error."""
    from reconciler.engine.target import CommandError

    out = out or sys.stdout
    local = set(local_addresses)
    sources: dict[str, str] = {}
    if desired is not None:
        ruleset, kind = desired.ruleset, "desired"
        cfg = desired.config
        local |= set(cfg.node_ips) | {ip for _, ip in (cfg.host_addresses or ())}
        sources = service_sources(desired.inventory)
    elif applied_target is not None:
        ruleset, kind = applied_ruleset(applied_target), "applied"
        local |= set(node.node_ips)
        if applied_target.netns is not None:
            local |= _node_addresses(applied_target.netns)
    else:
        from reconciler.kernel import read_live

        kind = "live"
        nft = live_target.nft()
        try:
            ruleset = read_live(nft, live_target.table)
        finally:
            nft.close()
        if not ruleset.tables:
            raise CommandError(f"no table {live_target.table} in {live_target.where}: nothing to trace "
                               f"(apply first, or trace the desired ruleset without --live)")
        local |= _node_addresses(live_target.netns)
        sources = manifest_sources(directory, node)
    try:
        tr = trace_packet(ruleset, packet, local, ruleset_kind=kind, sources=sources)
    except (UnknownExpression, TraceError) as e:
        raise CommandError(str(e)) from None
    if output == "json":
        out.write(json.dumps(tr.to_json(), indent=2) + "\n")
    else:
        out.write(format_text(tr) + "\n")
    return 0


def _node_addresses(netns: str | None) -> set[str]:
    """The interface addresses of `netns`; none (with a warning) when they cannot be listed."""
    from reconciler.engine.desired import node_address_discovery

    try:
        return {ip for _, ip in node_address_discovery(netns)()}
    except Exception as e:  # noqa: BLE001 - the trace still works with fewer addresses
        from reconciler import logs

        logs.log.warning(f"could not list the node's addresses ({e}); only nodeport-ips count as local")
        return set()
