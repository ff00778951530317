"""`nftrec trace`: one packet's path through the desired, live or (with --kernel) the
kernel's own ruleset, as a typer command that cli.py registers on commands.app beside the
others. It reuses commands.py's option and target helpers; engine/trace.py explains the
packet offline, engine/kerneltrace.py has the kernel trace it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from reconciler.commands import NETNS_OPT, _check_netns, _desired, _guard, _node_config, _root, _target
from reconciler.options import CONFIG_OPT, FIELDS_OPT, STRICT_OPT, check_output, kernel_trace_options, output_opt


def trace(
    directory: Optional[str] = typer.Argument(None, help="Manifest directory, - (stdin) or oci://...; without it, "
                                              "the ruleset last applied (as --netns's state recorded it)."),
    src: str = typer.Option(..., "--src", help="Source address of the packet."),
    dst: str = typer.Option(..., "--dst", help="Destination address (a ClusterIP, LB IP, node IP, ...)."),
    dport: int = typer.Option(..., "--dport", help="Destination port."),
    proto: str = typer.Option("tcp", "--proto", help="tcp, udp or sctp"),
    origin: str = typer.Option("pod", "--from", help="pod or external (arrives on an interface: "
                               "prerouting), node (sent by the node itself: output)."),
    live: bool = typer.Option(False, "--live", help="Trace the ruleset in the kernel (in --netns), not the "
                              "desired one; DIR then only names the manifests for file:line."),
    local_address: list[str] = typer.Option([], "--local-address", help="An address of the node (fib ... type "
                                            "local; delivered locally). nodeIPs and nodeport-ips always count."),
    kernel: bool = typer.Option(False, "--kernel", help="Trace a real packet with the kernel (meta nftrace) "
                                "through every table of --netns, iptables-nft's included: send it while the "
                                "trace waits. Exit 0 once traced, 1 when none came within --timeout."),
    timeout: str = typer.Option("10s", "--timeout", metavar="DURATION", help="With --kernel: how long to wait "
                                "for a matching packet."),
    count: int = typer.Option(1, "--count", help="With --kernel: how many packets to trace and show."),
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    output: str = output_opt(),
) -> None:
    """Explain one packet offline: the chains and rules it passes, the verdict (DNAT to which
    endpoints with what probability, masquerade, reject or drop) and the Service responsible.
    With --kernel, a real packet, traced by the kernel."""
    check_output(output)
    _check_netns(netns)
    from reconciler.engine import Packet, run_trace

    packet = Packet(src, dst, dport, proto.lower(), origin)
    if directory is None and not (live or kernel):
        raise typer.Exit(_guard(run_trace, packet, applied_target=_target(config, netns, recover=False),
                                node=_node_config(config), local_addresses=local_address, output=output))
    directory = _root(directory, config).root if directory is not None else None
    if kernel:
        seconds = kernel_trace_options(live, timeout, count)
        from reconciler.engine import run_kernel_trace

        raise typer.Exit(_guard(run_kernel_trace, packet, _target(config, netns), timeout=seconds, count=count,
                                output=output, directory=None if directory in (None, Path("-")) else directory,
                                node=_node_config(config) if directory not in (None, Path("-")) else None))
    if live:
        target = _target(config, netns)
        raise typer.Exit(_guard(run_trace, packet, live_target=target, local_addresses=local_address, node=_node_config(config),
                                directory=None if directory in (None, Path("-")) else directory, output=output))
    desired = _desired(directory, config, netns, strict, fields, interfaces=netns is not None)
    raise typer.Exit(_guard(run_trace, packet, desired=desired, local_addresses=local_address, output=output))
