"""`nftrec fleet status REMOTE`: every node's latest status record (refs/nftrec/status/*
of the git remote, read with statusrecords.fetch_records), sorted per revision into
applied, held (wave, paused, local hold, halted), failed (with its error), offline (no
record for `offline_after`) and pending (no record about the revision yet), as text, JSON
or Markdown. `--wait WAVE` polls until every node of the wave applied the revision: the
gate between waves that CI runs (0 applied, 1 one failed, 2 timeout).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence, TextIO

from reconciler import clock, logs
from reconciler.engine.fleetreview import _natural, compress, nodes_label
from reconciler.engine.review import _cell
from reconciler.engine.target import CommandError, short_revision
from reconciler.intake import Record

EXIT_OK, EXIT_FAILED, EXIT_TIMEOUT = 0, 1, 2
FULL_SYNC_PERIOD = 3600.0  # the node config's default fullSyncPeriod: records are not older on a live node
POLL_INTERVAL = 2.0  # seconds between two reads of the remote while waiting
STATES = ("applied", "held", "failed", "offline", "pending")
FAILED = ("failed", "rolled-back", "invalid", "refused")  # refused too: the node will not take it by itself
MARKER = "<!-- nftrec-fleet-status -->"


@dataclass
class NodeState:
    """One node's place in the report of one revision."""

    record: Record
    state: str  # STATES
    detail: str = ""  # held: the reason; failed: the error's first line; pending/offline: what it runs
    kind: str = ""  # held: wave, paused, local-hold, halted


@dataclass
class Report:
    revision: str
    now: float
    offline_after: float
    nodes: list[NodeState] = field(default_factory=list)

    def of(self, state: str) -> list[NodeState]:
        return sorted((n for n in self.nodes if n.state == state), key=lambda n: _natural(n.record.node))


def same_revision(revision: str, wanted: str) -> bool:
    """`wanted` names `revision`: equal, or a prefix of at least 7 characters (a short commit)."""
    return bool(revision) and (revision == wanted or (len(wanted) >= 7 and revision.startswith(wanted)))


def newest_revision(records: Sequence[Record]) -> str | None:
    """The newest revision any node saw: one no record shows superseded (applied while
    another is attempted: a node holding or failing a newer one says which is newer), of
    the newest record. Record time alone would not do: a node still on the old revision
    pushes it again on each full sync."""
    recs = [r for r in records if r.attempted or r.applied]
    if not recs:
        return None
    superseded = {r.applied for r in recs if r.applied and r.attempted and r.applied != r.attempted}
    newest = max([r for r in recs if (r.attempted or r.applied) not in superseded] or recs, key=lambda r: r.time)
    return newest.attempted or newest.applied


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def _held_kind(record: Record) -> str:
    """wave, paused, local-hold or halted, from the record's outcome and its reason
    (rollout.decide's: "held: wave early opens at T", "paused: ...", "held locally: ...")."""
    text = record.error.lower()
    if record.outcome == "halted" or text.startswith("halted"):
        return "halted"
    if text.startswith("paused"):
        return "paused"
    if text.startswith("held locally") or "local hold" in text:
        return "local-hold"
    return "wave"


def classify(record: Record, revision: str) -> NodeState:
    """The node's state for `revision`, from its latest record alone (offline aside): a
    failure of it first, then having it applied (a node held locally after applying it
    still runs it), then holding it."""
    attempted = same_revision(record.attempted, revision)
    if attempted and record.outcome in FAILED:
        return NodeState(record, "failed", f"{record.outcome}: {_first_line(record.error)}".rstrip(": "))
    if same_revision(record.applied, revision) or (attempted and record.outcome == "applied"):
        return NodeState(record, "applied")
    if attempted and record.outcome in ("held", "halted"):
        return NodeState(record, "held", _first_line(record.error) or record.outcome, _held_kind(record))
    return NodeState(record, "pending", f"runs {short_revision(record.applied)}")


def build_report(records: Sequence[Record], revision: str, now: float, offline_after: float) -> Report:
    """Every node once: offline when its latest record is older than `offline_after`
    (with what that record said), else its state for `revision`."""
    report = Report(revision, now, offline_after)
    for r in records:
        st = classify(r, revision)
        if now - r.time > offline_after:
            st = NodeState(r, "offline", f"last seen {_iso(r.time)}: {st.state}"
                           + (f" ({st.detail})" if st.detail else ""))
        report.nodes.append(st)
    return report


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _groups(nodes: list[NodeState]) -> list[tuple[str, list[str]]]:
    """(detail, node names) per distinct detail, the earliest record's first: failed nodes
    with the same error, held nodes of one wave, share one line."""
    out: dict[str, list[NodeState]] = {}
    for n in sorted(nodes, key=lambda n: n.record.time):
        out.setdefault(n.detail, []).append(n)
    return [(d, [n.record.node for n in ns]) for d, ns in out.items()]


# --- output ----------------------------------------------------------------------------------


def to_json(report: Report) -> dict:
    doc: dict = {"formatVersion": 1, "revision": report.revision, "time": _iso(report.now),
                 "offlineAfterSeconds": report.offline_after, "nodes": len(report.nodes)}
    for state in STATES:
        nodes = report.of(state)
        doc[state] = {"count": len(nodes), "nodes": [
            {"node": n.record.node, "wave": n.record.wave, "outcome": n.record.outcome, "applied": n.record.applied,
             "attempted": n.record.attempted, "time": _iso(n.record.time),
             **({"reason": n.detail} if n.detail else {}), **({"kind": n.kind} if n.kind else {})}
            for n in nodes]}
    return doc


def format_text(report: Report) -> str:
    lines = [logs.escape(f"Revision {short_revision(report.revision)}: {len(report.nodes)} "
                         f"node{'s' if len(report.nodes) != 1 else ''} reporting")]
    for state in STATES:
        nodes = report.of(state)
        if not nodes:
            continue
        if state == "applied":
            lines.append(f"  applied  {len(nodes):>4}  {compress(n.record.node for n in nodes)}")
            continue
        lines.append(f"  {state:<7}  {len(nodes):>4}")
        lines += [f"      {nodes_label(names)}: {logs.escape(detail)}" for detail, names in _groups(nodes)]
    return "\n".join(lines) + "\n"


def format_markdown(report: Report) -> str:
    """A comment for a pull request or a chat: one table row per state and reason."""
    n = len(report.nodes)
    out = [MARKER, f"### nftrec fleet status `{_cell(short_revision(report.revision))}`", "",
           f"**{len(report.of('applied'))} of {n} node{'s' if n != 1 else ''} applied it.**", "",
           "| State | Nodes | Count | Reason |", "|---|---|--:|---|"]
    for state in STATES:
        nodes = report.of(state)
        if state == "applied" and nodes:
            out.append(f"| applied | {_cell(compress(x.record.node for x in nodes))} | {len(nodes)} | |")
            continue
        for detail, names in _groups(nodes):
            out.append(f"| {state} | {_cell(compress(names))} | {len(names)} | {_cell(detail)} |")
    return "\n".join(out) + "\n"


def write_report(report: Report, output: str, stream: TextIO) -> None:
    if output == "json":
        json.dump(to_json(report), stream, indent=2)
        stream.write("\n")
    elif output == "markdown":
        stream.write(format_markdown(report))
    else:
        stream.write(format_text(report))


# --- the wave gate ---------------------------------------------------------------------------


def wave_members(records: Sequence[Record], wave: str, inventory_waves: dict[str, str] | None) -> set[str]:
    """The nodes of `wave`: those whose latest record names it, and with an inventory every
    node the fleet's rollout puts in it (so a node that never pushed keeps the gate shut)."""
    members = {r.node for r in records if r.wave == wave}
    if inventory_waves:
        members |= {n for n, w in inventory_waves.items() if w == wave}
    return members


def gate(records: Sequence[Record], revision: str, members: set[str], seen_after: float | None = None
         ) -> tuple[int | None, str]:
    """(EXIT_OK when every member applied `revision`, EXIT_FAILED when one failed it,
    None while waiting; the line that says why: a node waited for whose latest record is
    older than `seen_after` is said to be offline)."""
    latest = {r.node: r for r in records}
    if not members:
        return None, "no node of the wave has reported yet"
    states = {n: classify(latest[n], revision) if n in latest else None for n in members}
    failed = sorted((n for n, s in states.items() if s is not None and s.state == "failed"), key=_natural)
    if failed:
        return EXIT_FAILED, "; ".join(f"{n} failed it ({states[n].detail})" for n in failed)
    waiting = sorted((n for n, s in states.items() if s is None or s.state != "applied"), key=_natural)
    if not waiting:
        return EXIT_OK, f"all {len(members)} node{'s' if len(members) != 1 else ''} applied it"
    done = len(members) - len(waiting)
    why = [f"{n} ({_why(states[n])}" + (f"; offline, last seen {_iso(latest[n].time)}" if n in latest and seen_after
                                        is not None and latest[n].time < seen_after else "") + ")"
           for n in waiting[:10]]
    more = f" and {len(waiting) - 10} more" if len(waiting) > 10 else ""
    return None, f"{done} of {len(members)} applied it; waiting for " + ", ".join(why) + more


def with_waves(records: Sequence[Record], rollout) -> list[Record]:
    """Records that name no wave (pushed before the node read a rollout, or by a node of a
    fleet without one) given the wave the fleet's rollout puts the node in, from the node
    name and labels it pushed."""
    from dataclasses import replace

    from reconciler.intake import Identity, wave_of

    if rollout is None:
        return list(records)
    return [r if r.wave else replace(r, wave=rollout.waves[wave_of(rollout, Identity(r.node, tuple(sorted(r.labels))))]
                                     .name) for r in records]


def _why(st: NodeState | None) -> str:
    if st is None:
        return "no record"
    if not st.detail or st.detail.startswith(("held", "paused", "halted")):
        return st.detail or st.state
    return f"{st.state}: {st.detail}"


def _inventory_waves(inventory: Path, rollout) -> dict[str, str]:
    """Node name -> wave name of every node of the NodeInventory, by the fleet's rollout."""
    from reconciler.engine.fleetreview import _inventory
    from reconciler.intake import wave_of

    return {n.name: rollout.waves[wave_of(rollout, n)].name for n in _inventory(inventory)}


def _rollout(fleet_dir: Path | None):
    """fleet.yaml's rollout of `fleet_dir` (None without --fleet, or with no rollout)."""
    from reconciler.intake import FLEET_FILE, parse_fleet

    if fleet_dir is None:
        return None
    path = Path(fleet_dir) / FLEET_FILE
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CommandError(f"{path}: {e.strerror}; --fleet names a fleet repository's directory "
                           "(the one holding fleet.yaml)") from None
    fleet, problems = parse_fleet(str(path), raw)
    for p in problems:
        logs.problem(p)
    if fleet is None:
        raise CommandError(f"{path}: not a usable fleet.yaml (see above); fix it or drop --fleet")
    return fleet.rollout


def offline_threshold(rollout, offline_after: float | None) -> float:
    """3 x max(interval, fullSyncPeriod): a node that pushes on every full sync (1h by
    default: the nodes' own configs are not known here) and at every wave is seen that often.
    `--offline-after` sets it directly."""
    if offline_after is not None:
        return offline_after
    return 3 * max(rollout.interval if rollout is not None else 0.0, FULL_SYNC_PERIOD)


def run_fleet_status(remote: str, *, revision: str | None = None, output: str = "text", wait: str | None = None,
                     timeout: float = 600.0, fleet_dir: Path | None = None, inventory: Path | None = None,
                     offline_after: float | None = None, ssh_key: str | None = None, stream: TextIO | None = None,
                     fetch: Callable | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """The report of `revision` (default: the newest one seen); with `wait`, the gate of
    that wave (module doc). `fetch` and `sleep`: tests, with reconciler.clock set."""
    from reconciler.engine.statusrecords import fetch_records

    stream = stream or sys.stdout
    fetch = fetch or fetch_records
    rollout = _rollout(fleet_dir)
    if inventory is not None and rollout is None:
        raise CommandError("--inventory needs --fleet DIR with a `rollout` in its fleet.yaml: the waves "
                           "of the inventory's nodes come from it")
    inv_waves = _inventory_waves(inventory, rollout) if inventory is not None else None
    if wait is not None and rollout is not None and wait not in {w.name for w in rollout.waves}:
        raise CommandError(f"wave {logs.escape(wait)!r} is not in the fleet's rollout; its waves: "
                           + ", ".join(w.name for w in rollout.waves))
    threshold = offline_threshold(rollout, offline_after)
    if wait is None:
        records, error = fetch(remote, ssh_key, timeout=timeout)
        records = with_waves(records, rollout)
        if error:
            raise CommandError(f"{remote}: cannot read the status records: {error}")
        rev = revision or newest_revision(records)
        if rev is None:
            raise CommandError(f"{remote}: no node has pushed a status record yet (refs/nftrec/status/*)")
        write_report(build_report(records, rev, clock.now(), threshold), output, stream)
        return EXIT_OK
    assert revision is not None  # the command line requires --revision with --wait
    deadline = clock.now() + timeout
    said, last = "", None
    while True:
        left = deadline - clock.now()
        records, error = fetch(remote, ssh_key, timeout=max(1.0, min(30.0, left)))
        records = with_waves(records, rollout)
        if error:
            line = f"{remote} unreachable: {error}; trying again until the timeout"
        else:
            last = records
            code, line = gate(records, revision, wave_members(records, wait, inv_waves), clock.now() - threshold)
            line = f"wave {wait}, revision {short_revision(revision)}: {line}"
            if code is not None:
                write_report(build_report(records, revision, clock.now(), threshold), output, stream)
                (logs.log.info if code == EXIT_OK else logs.log.error)(logs.escape(line))
                return code
        if line != said:
            logs.log.info(logs.escape(line))
            said = line
        left = deadline - clock.now()
        if left <= 0:
            if last is not None:  # what the wave looked like when the wait gave up
                write_report(build_report(last, revision, clock.now(), threshold), output, stream)
            logs.log.error(logs.escape(f"timed out after {timeout:g}s: {line}"))
            return EXIT_TIMEOUT
        sleep(min(POLL_INTERVAL, left))
