"""Readiness probes in `nftrec watch`: the kubelet's prober workers, one asyncio task per
probed endpoint on one thread inside the node's namespace (kernel.ProbeLoop).

Probes only take readiness away, with the kubelet's failure/success thresholds; until its
first result an endpoint keeps its declared conditions, so a daemon restart never takes
every endpoint out at once. A transition recompiles only the Services it touches.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from reconciler.daemon.metrics import ProbeMetrics
from reconciler import logs
from reconciler.compile import ProbeTarget, probe_targets, with_probe_results
from reconciler.intake import Inventory

CONCURRENCY = 512  # probes in flight at once (each holds one socket)
PUBLISH_DELAY = 0.05  # seconds: transitions within this window are one state write and one sync


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class Tracker:
    """The kubelet's result counting for one endpoint: `up` is None until a threshold is
    first reached (the declared condition holds), then True or False."""

    success_threshold: int
    failure_threshold: int
    up: bool | None = None
    last: bool | None = None
    count: int = 0
    error: str = ""
    since: float | None = None  # wall clock of the last transition

    def observe(self, ok: bool, error: str | None, now: float) -> bool:
        """One probe result; True when `up` changed."""
        if ok == self.last:
            self.count += 1
        else:
            self.last, self.count = ok, 1
        if not ok:
            self.error = error or "failed"
        threshold = self.success_threshold if ok else self.failure_threshold
        if self.count >= threshold and self.up is not ok:
            self.up, self.since = ok, now
            return True
        return False


class ProbeManager:
    """See the module doc. `update`, `apply`, `close` are called from the daemon's threads;
    everything else runs on the probe loop's thread."""

    def __init__(self, netns: str | None, on_change: Callable[[], None], *, registry=None,
                 write_state: Callable[[int, list[dict]], None] | None = None, concurrency: int = CONCURRENCY,
                 jitter: bool = True):
        self.netns, self.on_change, self.write_state = netns, on_change, write_state
        self.concurrency, self.jitter = concurrency, jitter
        self.metrics = ProbeMetrics(registry) if registry is not None else None
        self._loop = None  # kernel.ProbeLoop, started with the first target
        self._lock = threading.Lock()
        self._down: dict[str, frozenset[str]] = {}
        self.generation = 0
        self._workers: dict[tuple[str, str], tuple[ProbeTarget, asyncio.Task, Tracker]] = {}
        self._sem: asyncio.Semaphore | None = None
        self._entries: dict[tuple[str, str], dict] = {}  # the down endpoints, as probes.json lists them
        self._dirty = self._scheduled = False

    # -- the daemon's side

    def update(self, inventory: Inventory) -> None:
        """The targets of a new good revision; unchanged endpoints keep their state."""
        targets = probe_targets(inventory)
        if self._loop is None:
            if not targets:
                return
            from reconciler.kernel import ProbeLoop, raise_fd_limit

            raise_fd_limit(4 * self.concurrency + 1024)
            self._loop = ProbeLoop(self.netns)
        self._loop.call(lambda: self._reconcile(targets))

    def apply(self, inventory: Inventory) -> tuple[int, Inventory]:
        """(generation, `inventory` with the down endpoints taken out of readiness)."""
        with self._lock:
            gen, down = self.generation, self._down
        return gen, with_probe_results(inventory, down)

    def down(self) -> dict[str, frozenset[str]]:
        with self._lock:
            return dict(self._down)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()

    # -- the loop's side

    def _reconcile(self, targets: list[ProbeTarget]) -> None:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.concurrency)
        new = {(t.service, t.address): t for t in targets}
        changed = False
        for k, (t, task, tr) in list(self._workers.items()):
            if k not in new or new[k].key != t.key:
                task.cancel()
                del self._workers[k]
                changed |= self._entries.pop(k, None) is not None
        for k, t in new.items():
            if k not in self._workers:
                tr = Tracker(t.probe.success_threshold, t.probe.failure_threshold)
                self._workers[k] = (t, asyncio.get_running_loop().create_task(self._work(t, tr)), tr)
        if self.metrics is not None:
            self.metrics.probed.set(len(self._workers))
        self._publish(changed)

    async def _work(self, t: ProbeTarget, tr: Tracker) -> None:
        from reconciler.kernel import check_probe

        loop = asyncio.get_running_loop()
        period = t.probe.period_seconds
        # the kubelet spreads its workers over the first period the same way
        await asyncio.sleep(t.probe.initial_delay_seconds + (random.random() * period if self.jitter else 0))
        next_at = loop.time()
        while True:
            async with self._sem:
                error = await check_probe(t)
            self._observe(t, tr, error)
            next_at += period
            now = loop.time()
            if next_at < now:  # overloaded: skip the missed periods rather than burst
                next_at = now
            await asyncio.sleep(next_at - now)

    def _observe(self, t: ProbeTarget, tr: Tracker, error: str | None) -> None:
        ok = error is None
        if self.metrics is not None:
            self.metrics.results.labels(t.service, "success" if ok else "failure").inc()
        before = tr.up
        if not tr.observe(ok, error, time.time()):
            return
        where = f"{t.probe.handler} {t.address}:{t.port}" if t.port else f"{t.probe.handler} {t.address}"
        if ok:
            # up after down is a transition of readiness (info); the first pass of a new
            # endpoint changes nothing (it kept its declared conditions) and is only debug,
            # or a restart with 10,000 endpoints would log 10,000 lines
            how = "is up again" if before is False else "passed its first probe(s)"
            (logs.log.info if before is False else logs.log.debug)(
                f"probe: {t.service} endpoint {t.address} {how} ({tr.count} success(es) in a row, {where}); "
                + ("back in service" if before is False else "it keeps its declared conditions"),
                extra={"fields": {"event": "probe", "service": t.service, "address": t.address, "ready": True}})
        else:
            logs.log.warning(f"probe: {t.service} endpoint {t.address} is down after {tr.count} failure(s) in a "
                             f"row ({where}): {tr.error}; treated as ready=false serving=false",
                             extra={"fields": {"event": "probe", "service": t.service, "address": t.address,
                                               "ready": False, "error": tr.error}})
        if self.metrics is not None:
            self.metrics.transitions.labels(t.service, "up" if ok else "down").inc()
        k = (t.service, t.address)
        if ok:
            if self._entries.pop(k, None) is not None:
                self._publish(True)
        else:
            self._entries[k] = {"service": t.service, "address": t.address, "port": t.port,
                                "handler": t.probe.handler, "since": _utc(tr.since), "lastError": tr.error}
            self._publish(True)

    def _publish(self, changed: bool) -> None:
        """Coalesce: a burst of transitions (a switch dies, 500 endpoints fail in one period)
        is one state write and one sync request, after PUBLISH_DELAY."""
        self._dirty |= changed
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(PUBLISH_DELAY, self._publish_now)

    def _publish_now(self) -> None:
        """Write the state file; when the down set changed, hand it to the daemon."""
        self._scheduled, changed, self._dirty = False, self._dirty, False
        down: dict[str, set[str]] = {}
        for (svc, addr) in self._entries:
            down.setdefault(svc, set()).add(addr)
        if self.write_state is not None:
            try:
                self.write_state(len(self._workers), list(self._entries.values()))
            except OSError as e:
                logs.log.error(f"cannot write the probe state (nftrec status shows it): {e}")
        if not changed:
            return
        frozen = {k: frozenset(v) for k, v in down.items()}
        with self._lock:
            before = self._down
            self._down = frozen
            self.generation += 1
        if self.metrics is not None:
            for svc in set(before) | set(frozen):
                self.metrics.down.labels(svc).set(len(frozen.get(svc, ())))
        self.on_change()


def start_probes(daemon, metrics, run: Callable[[], None]) -> ProbeManager:
    """The daemon's ProbeManager: its state goes to the daemon's state store."""
    from reconciler.engine import write_probe_state

    store = daemon.store
    return ProbeManager(daemon.target.netns, run, registry=metrics.registry if metrics is not None else None,
                        write_state=lambda probed, down: write_probe_state(store, probed=probed, down=down))
