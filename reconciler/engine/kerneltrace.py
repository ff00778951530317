"""`nftrec trace --kernel`: a real packet, traced by the kernel through every table of the
namespace. A short-lived table of nftrec's (kernel.tracetable) sets `meta nftrace` on the
packets to trace; `nft monitor trace`, a child process, reports each chain, rule and verdict
they pass for a bounded time; kerneltracereport parses and shows it. The tracing table is
removed on exit, on Ctrl-C, SIGTERM or SIGHUP, and on error; a killed run's is removed by
the next `trace --kernel`, `apply` or `cleanup` (kernel.sweep_trace_tables).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from reconciler import logs
from reconciler.engine.kerneltracereport import Grouper, fate, format_text, parse_line, to_json
from reconciler.engine.target import CommandError, Target
from reconciler.engine.trace import TraceError, check_packet
from reconciler.engine.tracecommand import manifest_sources
from reconciler.engine.tracereport import Packet, join_endpoint
from reconciler.kernel import (NftError, exit_reason, run_nft_child, start_trace_monitor, stop_child,
                               sweep_trace_tables, trace_table_name, trace_table_script)

EXIT_OK, EXIT_NONE, EXIT_INTERRUPTED = 0, 1, 130
SETTLE = 0.3  # seconds without a new line after which the packets seen are complete
SETTLE_MAX = 1.5  # seconds after the last packet counted, at most, for its events to come


class _Stopped(Exception):
    """SIGTERM or SIGHUP during the trace: clean up as for Ctrl-C."""


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP end the trace as Ctrl-C does (the finally blocks run); only
    the main thread can set handlers, elsewhere they stay as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise _Stopped(signal.Signals(signum).name)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_held():
    """SIGINT, SIGTERM and SIGHUP wait while the monitor starts or the tracing table is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _collect(monitor, grouper: Grouper, deadline: float, count: int, where: str) -> None:
    """Read the monitor's lines into `grouper` until `count` packets were seen and their
    events stopped coming (SETTLE quiet, at most SETTLE_MAX), or until `deadline` with none.
    The monitor ending first is an error with its reason."""
    sel = selectors.DefaultSelector()
    sel.register(monitor.stdout, selectors.EVENT_READ)
    buf = b""
    last_line = counted_at = None
    try:
        while True:
            now = time.monotonic()
            if counted_at is not None:
                wait = min(last_line + SETTLE, counted_at + SETTLE_MAX) - now
            elif grouper.packets:
                wait = max(deadline, last_line + SETTLE) - now
            else:
                wait = deadline - now
            if wait <= 0:
                return
            if not sel.select(timeout=wait):
                continue
            chunk = os.read(monitor.stdout.fileno(), 1 << 16)
            if not chunk:
                if grouper.packets:
                    return
                monitor.wait()
                err = monitor.stderr.read().decode(errors="replace").strip()
                raise CommandError(f"`nft monitor trace` {where} ended before any packet came: "
                                   f"{exit_reason(monitor.returncode)}" + (f"; {err}" if err else ""), lines=True)
            buf += chunk
            *done, buf = buf.split(b"\n")
            for raw in done:
                ev = parse_line(raw.decode(errors="replace"))
                if ev is None:
                    continue
                last_line = time.monotonic()
                grouper.add(ev)  # packets past `count` are read, never shown
                if len(grouper.packets) >= count and counted_at is None:
                    counted_at = last_line
    finally:
        sel.close()


def _stop(monitor, nft, netns: str | None, family: str, name: str, where: str) -> bool:
    """End the monitor and delete the tracing table, signals held meanwhile. False (and
    logged, whatever else went wrong) when the table could not be deleted and is there
    (`nft`: an Interface of the namespace, whose table list is a raw netlink dump)."""
    with _signals_held():
        if monitor is not None:
            stop_child(monitor)
        try:
            run_nft_child(netns, f"delete table {family} {name}\n")
        except NftError as e:
            if "No such file or directory" not in e.text and (family, name) in nft.list_tables():
                logs.log.error(f"could not remove the tracing table {family} {name} in {where}: {e.text.strip()}; "
                               f"remove it with `nft delete table {family} {name}` (the next apply or cleanup "
                               f"removes it too)", extra={"lines": True})
                return False
    return True


def run_kernel_trace(packet: Packet, target: Target, *, timeout: float = 10.0, count: int = 1,
                     output: str = "text", directory: Path | None = None, node=None, out: TextIO | None = None) -> int:
    """`nftrec trace --kernel`: 0 once `count` packets were traced (whatever their fate),
    1 when none came within `timeout` seconds or on an error, 130 when interrupted.
    `directory`: the manifests, only to name a Service's file:line (a fleet root read as
    `node`'s, the node config)."""
    out = out or sys.stdout
    try:
        packet = check_packet(packet)
    except TraceError as e:
        raise CommandError(str(e)) from None
    nft = target.nft()
    try:
        return _trace(packet, target, nft, timeout, count, output, directory, node, out)
    finally:
        nft.close()


def _trace(packet: Packet, target: Target, nft, timeout: float, count: int, output: str,
           directory: Path | None, node, out: TextIO) -> int:
    sweep_trace_tables(nft, target.netns)
    family, name = packet.family, trace_table_name()
    what = f"{packet.proto} {packet.src} -> {join_endpoint(packet.dst, packet.dport)}"
    grouper = Grouper(name)
    monitor = None
    interrupted = None
    try:
        with _signals_interrupt():
            try:
                run_nft_child(target.netns, trace_table_script(family, name, packet.src, packet.dst,
                                                               packet.proto, packet.dport))
                with _signals_held():  # a Ctrl-C while the child starts would lose its handle (and its thread)
                    monitor = start_trace_monitor(target.netns, timeout + SETTLE_MAX + 5)
                logs.log.info(f"tracing {what} in {target.where} for up to {timeout:g}s "
                              f"(table {family} {name}): send the packet now")
                _collect(monitor, grouper, time.monotonic() + timeout, count, target.where)
            except (KeyboardInterrupt, _Stopped) as e:
                interrupted = str(e) or "SIGINT"
            finally:
                removed = _stop(monitor, nft, target.netns, family, name, target.where)
    except NftError as e:
        raise CommandError(f"cannot trace in {target.where}: {e.text.strip()}", lines=True) from None
    if not removed:
        return EXIT_NONE
    if interrupted:
        logs.log.warning(f"trace interrupted ({interrupted}); the tracing table {family} {name} was removed")
        return EXIT_INTERRUPTED
    packets = grouper.packets[:count]
    if not packets:
        logs.log.error(f"no packet {what} came within {timeout:g}s in {target.where}; send one while the "
                       f"trace runs (retry the connection), or give a longer --timeout")
        return EXIT_NONE
    fates = [fate(p, target.table) for p in packets]
    services = manifest_sources(directory, node) if any(f.service for f in fates) else {}
    if output == "json":
        out.write(json.dumps(to_json(packets, fates, services), indent=2) + "\n")
    else:
        out.write(format_text(packets, fates, services) + "\n")
    return EXIT_OK
