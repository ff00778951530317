"""`nftrec watch`: the reconcile daemon, kube-proxy's sync loop without an API server.

    watcher.Watcher ─► debounce ─► runner.Runner ─► reconcile.Daemon.sync()
    addresses.AddressWatcher ──────────┤ (timer: fullSyncPeriod / syncPeriod after a failure)
    repair.EventWatcher ───────────────┘ (another process changed the table: a full sync)

Wires signals (SIGTERM/SIGINT stop, SIGHUP re-reads the config), the metrics server,
systemd's notifications (notify.py) and the namespace lock, held for the daemon's
lifetime (waited for at start when held).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from reconciler import logs
from reconciler.daemon.healthz import healthy, ready
from reconciler.daemon.notify import Notifier
from reconciler.daemon.probing import start_probes
from reconciler.daemon.reconcile import Daemon
from reconciler.heap import for_daemon, trim_heap
from reconciler.daemon.runner import Fatal, Runner
from reconciler.daemon.statewriter import StateWriter
from reconciler.daemon.watcher import DEBOUNCE, Watcher
from reconciler.engine import LockHeld
from reconciler.engine import CommandError, Target, is_source, recover_locked

LOCK_RETRY = 1.0  # seconds between attempts to take the namespace lock at start


def _address_watcher(daemon: Daemon, runner: Runner):
    """Subscribe to the namespace's address events; catch up with any change since the
    config was read (before the subscription), then let the watcher's thread go."""
    from reconciler.daemon.addresses import AddressWatcher

    def on_change(primary, pairs) -> None:
        if daemon.addresses_changed(primary, pairs):
            runner.run()

    try:
        aw = AddressWatcher(daemon.target.netns, on_change)
    except Exception as e:
        logs.log.warning(f"cannot subscribe to the node's address events ({e}); address changes are "
                         f"picked up by full syncs (fullSyncPeriod) only")
        return None
    try:
        on_change(*aw.snapshot())
    except Exception as e:
        logs.log.warning(f"cannot list the node's addresses: {e}")
    aw.start()
    return aw


def _event_watcher(daemon: Daemon, runner: Runner):
    """Subscribe to the namespace's nftables events: another process's change to the
    table asks for a repair (a full sync), held back while it keeps fighting us."""
    from reconciler.daemon.repair import EventWatcher, Repairs

    repairs = Repairs(daemon.target.table, cap=lambda: daemon.config.sync_period)

    def on_tamper(tamper) -> None:
        if repairs.report(tamper):
            runner.run()

    try:
        events = EventWatcher(daemon.target.netns, daemon.target.table, on_tamper, made=daemon.nft.made)
    except Exception as e:
        logs.log.warning(f"cannot subscribe to nftables events ({e}); another process's changes to table "
                         f"{daemon.target.table} are repaired by full syncs (fullSyncPeriod) only")
        return None
    daemon.repairs = repairs
    events.start()
    return events


def _with_source(health: tuple[bool, str], note: str | None) -> tuple[bool, str]:
    """/healthz with the source's failure said, not turned red by it (fetcher.health_note)."""
    return health if note is None else (health[0], f"{health[1]}; {note}")


def run_watch(directory: Path, config_path: Path | None, target: Target, *, strict: bool = False,
              fields: str | None = None, metrics_address: str = "127.0.0.1:9105", debounce: float = DEBOUNCE,
              allow_empty: bool = False) -> int:
    """The daemon: returns 0 after SIGTERM/SIGINT, 1 when it cannot start."""
    from reconciler.daemon.metrics import Metrics, MetricsError

    for_daemon()
    notifier = Notifier()  # systemd's Type=notify, before any child inherits $NOTIFY_SOCKET

    stop_requested = threading.Event()
    metrics = Metrics()
    fetcher = None
    if is_source(str(directory)):  # oci://: the fetcher publishes <store>/current, read as git-sync's link
        from reconciler.daemon.fetcher import Fetcher

        fetcher = Fetcher(str(directory), target, metrics)
        directory = fetcher.link
    daemon = Daemon(directory, config_path, target, strict=strict, fields=fields, metrics=metrics,
                    allow_empty=allow_empty)
    daemon.gate.oci = fetcher is not None  # the kind of source, for `verify`: from the command line
    server = lock = watcher = addresses = events = None
    runner: Runner | None = None

    def on_stop(signum, _frame):
        stop_requested.set()
        notifier.stopping()
        if runner is not None:
            runner.stop()

    def on_hup(_signum, _frame):
        daemon.reload_config = True
        notifier.reloading()
        if runner is not None:
            runner.run()

    old = {s: signal.signal(s, on_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    try:
        try:
            daemon.nft = target.nft()
        except CommandError as e:
            logs.log.error(str(e))
            return 1
        daemon.bind_netns()
        if not daemon.load_config():
            return 1
        cfg = daemon.config
        if metrics_address:
            try:
                server = metrics.serve(metrics_address, (lambda: healthy(daemon)) if fetcher is None else lambda: _with_source(
                    healthy(daemon), fetcher.health_note()), lambda: ready(daemon))
            except MetricsError as e:
                logs.log.error(f"{e}; give --metrics-address HOST:PORT, or \"\" to disable metrics")
                return 1
            logs.log.info(f"metrics on {server.url}/metrics, health on {server.url}/healthz and /readyz",
                          extra={"fields": {"event": "metrics", "metricsUrl": server.url, "metricsPort": server.port}})
        lock = target.lock()
        said = False
        while not stop_requested.is_set():
            try:
                lock.acquire()
                break
            except LockHeld as e:
                if not said:
                    logs.log.warning(f"{e}; waiting for it")
                    said = True
                stop_requested.wait(LOCK_RETRY)
        if stop_requested.is_set():
            return 0
        try:  # a confirmed apply (or watch) that died in its window: roll back first
            recover_locked(daemon.nft, target.store())
        except (CommandError, OSError) as e:
            logs.log.error(f"{e}; not starting")
            return 1
        daemon.writer = StateWriter(after_write=trim_heap)  # closed before the lock is released (finally)
        daemon.stopping = lambda: "nftrec watch was asked to stop" if stop_requested.is_set() else None
        fatal = []

        def sync() -> float | None:
            if fetcher is not None and not fetcher.ready():
                return 1.0  # nothing fetched yet: the kernel stays untouched (the link's swap triggers too)
            try:
                return daemon.sync()
            except Fatal:
                fatal.append(True)
                runner.stop()
                raise
            finally:  # a SIGHUP may have changed the periods
                c = daemon.config
                runner.set_intervals(c.min_sync_period, c.sync_period, c.full_sync_period)
                notifier.synced(daemon.last_success is not None, healthy(daemon)[1])

        runner = Runner(sync, cfg.min_sync_period, cfg.sync_period, cfg.full_sync_period)
        runner.tick = notifier.tick  # WATCHDOG=1 from the loop itself: a stuck sync stops it
        daemon.prober = start_probes(daemon, metrics, runner.run)  # readiness probes
        watcher = Watcher(directory, runner.run, debounce=debounce, activity=daemon.writer.active)
        daemon.on_root = watcher.follow
        daemon.changes = watcher.take_changes
        try:
            watcher.follow(str(Path(directory).resolve()))
        except OSError:
            pass
        watcher.start()
        if fetcher is not None:
            fetcher.config = lambda: daemon.config
            fetcher.applied = lambda: daemon.applied.inventory.revision if daemon.applied is not None else None
            fetcher.resigned = lambda: (daemon.take_again(), runner.run())
            fetcher.verifier = lambda: daemon.gate.verifier
            fetcher.refused = lambda verdict: (daemon.gate.refused_unfetched(verdict), runner.run())
            fetcher.start()
        daemon.rollout.start(runner.run)  # hold.json's changes, the status channel
        addresses = _address_watcher(daemon, runner)
        events = _event_watcher(daemon, runner)  # before the initial sync: no change goes unseen
        shown = directory if fetcher is None else f"{fetcher.ref} (every {cfg.oci.interval:g}s, into {fetcher.store})"
        logs.log.info(f"watching {shown} for table {target.table} in {target.where} (minSyncPeriod "
                      f"{cfg.min_sync_period:g}s, syncPeriod {cfg.sync_period:g}s, fullSyncPeriod "
                      f"{cfg.full_sync_period:g}s, debounce {debounce:g}s); pid {os.getpid()}",
                      extra={"fields": {"event": "start", "pid": os.getpid()}})
        runner.run()  # the initial (full) sync; nothing happens until a read succeeds
        if stop_requested.is_set():
            runner.stop()
        runner.loop()
        if fatal:
            return 1
        logs.log.info("stopping: the rules stay in place", extra={"fields": {"event": "stop"}})
        return 0
    finally:
        if fetcher is not None:
            fetcher.stop()
        daemon.rollout.stop()
        if addresses is not None:
            addresses.stop()
        if events is not None:
            events.stop()
        if watcher is not None:
            watcher.stop()
        if daemon.prober is not None:
            daemon.prober.close()
        if server is not None:
            server.close()
        if daemon.nft is not None:
            daemon.nft.close()
        if daemon.writer is not None:
            daemon.writer.close()  # the last revision recorded before the lock goes
        if lock is not None:
            lock.release()
        for s, h in old.items():
            signal.signal(s, h)
