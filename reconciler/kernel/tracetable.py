"""The short-lived table of `nftrec trace --kernel`: `nftrec-trace-<pid>`, chains at the
earliest priority of prerouting and output that set `meta nftrace` on the packets to trace,
and the removal of such tables that a killed run left behind (its pid no longer runs).

Everything here runs the `nft` binary in a child process inside the namespace, never the
in-process libnftables: nft fills its cache with every table for some commands, and an nft
older than the tool that made a foreign table can crash reading it; in a child, that crash
is an error with its reason. Tables are found over raw netlink (Interface.list_tables),
which reads only their names.
"""

from __future__ import annotations

import os
import signal
import subprocess

from reconciler import logs
from reconciler.kernel.interface import Interface, NftError, error_for
from reconciler.kernel.isolated import Outcome, nft_binary, run_nft, start

TRACE_TABLE_PREFIX = "nftrec-trace-"
# The lowest priority nft takes on every version (INT_MIN + 1): before raw (-300),
# conntrack's defragmentation (-400) and any neighbour's chain, so every chain that sees
# the packet reports it.
TRACE_PRIORITY = -2147483647
CHILD_TIMEOUT = 20.0  # seconds for one `nft -f` of the tracing table
_OUTPUT_SHOWN = 400  # characters of a failing child's output kept in its error
CRASH_HINT = ("; nft crashes so when it reads a table that a newer nft made in the namespace: "
              "use that nft, or remove that table")


def exit_reason(returncode: int) -> str:
    """How a child ended, in words (isolated.Outcome.reason): `exit 1`, `nft crashed
    (SIGSEGV)`; 128 + N is signal N, as timeout(1) and shells report it."""
    sig = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
    return Outcome("nft", None if sig else returncode, sig).reason()


def run_nft_child(netns: str | None, script: str, *, timeout: float = CHILD_TIMEOUT) -> str:
    """Run an `nft -f -` script in a child process in `netns` (isolated.run_nft), with a
    time bound; its output, or an NftError that says how the child ended (nft's error, a
    crash by signal, the timeout)."""
    where = f"in netns {netns}" if netns else "in the host namespace"
    done = run_nft(netns, ["-f", "-"], timeout=timeout, stdin=script.encode())
    if done.ok:
        return done.stdout.decode(errors="replace")
    text = (done.stderr or done.stdout).decode(errors="replace").strip()
    if done.returncode is not None and 0 < done.returncode < 128:
        raise error_for(text or f"`nft -f -` {where} exited {done.returncode}", script)
    if len(text) > _OUTPUT_SHOWN:
        text = "..." + text[-_OUTPUT_SHOWN:]
    hint = CRASH_HINT if done.crashed else ""
    raise NftError(f"`nft -f -` {where}: {done.reason()}" + (f": {text}" if text else "") + hint, script)


def start_trace_monitor(netns: str | None, seconds: float) -> subprocess.Popen:
    """`nft monitor trace` in a child process in `netns` (text on its stdout, one line per
    event, flushed per event), under `timeout`: ended after `seconds` even when nftrec is
    killed before it can end it."""
    nft = nft_binary() or "nft"
    argv = ["timeout", "-k", "2", f"{max(1, int(seconds + 0.999))}", nft, "monitor", "trace"]
    try:
        return start(netns, argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError as e:
        raise NftError(f"cannot run {e.filename or argv[0]}: install coreutils and nftables") from None


def stop_child(proc: subprocess.Popen) -> None:
    """End a child of this module (its whole session) and reap it."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def trace_table_name(pid: int | None = None) -> str:
    return f"{TRACE_TABLE_PREFIX}{os.getpid() if pid is None else pid}"


def trace_table_script(family: str, name: str, src: str, dst: str, proto: str, dport: int) -> str:
    """The tracing table: a packet from `src` to `dst`, `proto` port `dport`, entering
    (prerouting) or sent by the node (output), gets `meta nftrace set 1` before any other
    chain sees it. Values come checked (trace.check_packet): addresses, a protocol name."""
    match = f"{family} saddr {src} {family} daddr {dst} meta l4proto {proto} th dport {dport}"
    lines = [f"add table {family} {name}"]
    for hook in ("prerouting", "output"):
        lines.append(f"add chain {family} {name} {hook} {{ type filter hook {hook} priority {TRACE_PRIORITY}; "
                     f"policy accept; }}")
        lines.append(f"add rule {family} {name} {hook} {match} meta nftrace set 1")
    return "\n".join(lines) + "\n"


def trace_table_owner(name: str) -> int | None:
    """The pid in a tracing table's name, or None for any other table."""
    if not name.startswith(TRACE_TABLE_PREFIX):
        return None
    pid = name[len(TRACE_TABLE_PREFIX):]
    return int(pid) if pid.isdigit() and not pid.startswith("0") else None


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_trace_tables(tables: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The tracing tables among `tables` ((family, name)) whose run no longer runs. A pid
    is looked up in this process's pid namespace: a run in another one that shares the
    network namespace counts as gone."""
    out = []
    for family, name in tables:
        pid = trace_table_owner(name)
        if pid is not None and not _running(pid):
            out.append((family, name))
    return out


def sweep_trace_tables(nft: Interface, netns: str | None) -> list[tuple[str, str]]:
    """Remove the tracing tables a killed `nftrec trace --kernel` left in this namespace
    (a raw-netlink listing of table names, then one child `nft` per leftover); each is
    logged. A failure is logged, never raised: the caller's own work goes on."""
    removed = []
    for family, name in stale_trace_tables(nft.list_tables()):
        try:
            run_nft_child(netns, f"delete table {family} {name}\n")
        except NftError as e:
            if "No such file or directory" in e.text:
                continue  # another nftrec removed it meanwhile
            logs.log.warning(f"could not remove the tracing table {family} {name} that a `nftrec trace --kernel` "
                             f"left behind: {e.text.strip()}; remove it with `nft delete table {family} {name}`",
                             extra={"lines": True})
            continue
        removed.append((family, name))
        logs.log.warning(f"removed the tracing table {family} {name}, left behind by a `nftrec trace --kernel` "
                         f"(pid {trace_table_owner(name)}) that no longer runs")
    return removed
