"""Readiness probes outside the daemon: the probe state file, what `nftrec status` shows
of it, and the one-shot `plan --probe` / `apply --probe`. `nftrec watch` writes
`probes.json` beside status.json on every transition (the endpoints that are down, with
their last error); it names the daemon's pid so that status can tell when it is stale.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TextIO

from reconciler import logs
from reconciler.engine.state import StateStore, atomic_write, utc_now

PROBES_FILE = "probes.json"


def probe_state_path(store: StateStore) -> Path:
    return store.dir / PROBES_FILE


def write_probe_state(store: StateStore, *, probed: int, down: list[dict]) -> None:
    doc = {"writer": "nftrec watch", "pid": os.getpid(), "updatedAt": utc_now(), "probedEndpoints": probed,
           "down": sorted(down, key=lambda d: (d["service"], d["address"]))}
    atomic_write(probe_state_path(store), (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


def read_probe_state(store: StateStore) -> dict | None:
    """The probe state, with `running` (whether its writer still runs); None when absent
    or unreadable (status must not fail over it)."""
    try:
        doc = json.loads(probe_state_path(store).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("down"), list):
        return None
    pid = doc.get("pid")
    running = False
    if isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
            running = True
        except PermissionError:
            running = True
        except OSError:
            running = False
    doc["running"] = running
    return doc


def probe_status_json(doc: dict | None) -> dict:
    if doc is None:
        return {"probes": None}
    return {"probes": {"probedEndpoints": doc.get("probedEndpoints"), "updatedAt": doc.get("updatedAt"),
                       "daemonRunning": doc["running"], "down": doc["down"]}}


def probe_status_lines(doc: dict | None) -> list[str]:
    if doc is None:
        return []
    down = doc["down"]
    stale = "" if doc["running"] else " (nftrec watch is not running: this is its last word)"
    lines = [f"probes:    {doc.get('probedEndpoints', '?')} endpoint(s) probed, {len(down)} down, "
             f"as of {doc.get('updatedAt')}{stale}"]
    for d in down[:50]:
        lines.append(f"  down:    {d.get('service')} {d.get('address')} since {d.get('since')}: {d.get('lastError')}")
    if len(down) > 50:
        lines.append(f"  ... and {len(down) - 50} more (`nftrec status -o json` lists all)")
    return lines


# --- plan --probe / apply --probe ------------------------------------------------------------


def probe_desired(desired, netns: str | None, err: TextIO | None = None):
    """Probe every probed endpoint once (from `netns`); the Desired recompiled with the
    endpoints that failed taken out of readiness. One failure is enough here: there is no
    history to count failureThreshold over, and the operator asked for this moment's view."""
    from reconciler.compile import NftSyntaxError, compile_ruleset, probe_targets, with_probe_results
    from reconciler.engine.desired import Desired
    from reconciler.engine.target import CommandError
    from reconciler.kernel import probe_all

    targets = probe_targets(desired.inventory)
    if not targets:
        logs.log.info("--probe: no Service has a probe.nftrec.io/readiness annotation; nothing probed")
        return desired
    results = probe_all(netns, targets)
    down: dict[str, set[str]] = {}
    for t in targets:
        error = results.get(t.key)
        if error is not None:
            down.setdefault(t.service, set()).add(t.address)
            logs.log.warning(f"--probe: {t.service} endpoint {t.address}: {t.probe.handler} probe failed: {error}; "
                             f"treated as not ready",
                             extra={"fields": {"event": "probe", "service": t.service, "address": t.address,
                                               "ready": False, "error": error}})
    n_down = sum(len(v) for v in down.values())
    logs.log.info(f"--probe: probed {len(targets)} endpoint(s) once from {netns or 'this namespace'}: "
                  f"{len(targets) - n_down} passed, {n_down} failed and are treated as not ready",
                  extra={"fields": {"event": "probe", "probed": len(targets), "down": n_down}})
    if not n_down:
        return desired
    inventory = with_probe_results(desired.inventory, {k: frozenset(v) for k, v in down.items()})
    try:
        return Desired(inventory, desired.config, compile_ruleset(inventory, desired.config))
    except NftSyntaxError as e:
        raise CommandError(f"the probed inventory does not compile: {e}") from None
