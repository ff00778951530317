"""Command-line option values parsed into the pipeline's types (the commands' shared parsers).

Each raises typer.BadParameter with the option's name, so a bad value is a usage error
(exit 64) that names what to write instead.
"""

from __future__ import annotations

from typing import List, Optional

import typer

FLEET_OPT = typer.Option(None, "--fleet", metavar="INVENTORY", help="Every node of this NodeInventory (names and "
                         "labels) on a fleet root: each problem or plan once, with the nodes it concerns.")


def field_validation(value: Optional[str]) -> Optional[str]:
    """--field-validation, as kubectl spells its values (any case): strict, warn or ignore."""
    from reconciler.intake import FIELD_VALIDATION

    if value is None:
        return None
    if value.lower() not in FIELD_VALIDATION:
        raise typer.BadParameter(f"{value!r} is not strict, warn or ignore", param_hint="--field-validation")
    return value.lower()


def confirm_spec(timeout: Optional[str], cmds: List[str], urls: List[str], tcps: List[str]):
    """apply's --confirm-timeout and checks, or None."""
    from reconciler.intake import parse_health_check

    checks = []
    for kind, values, flag in (("cmd", cmds, "--health-cmd"), ("url", urls, "--health-url"),
                               ("tcp", tcps, "--health-tcp")):
        for v in values:
            try:
                checks.append(parse_health_check(kind, v))
            except ValueError as e:
                raise typer.BadParameter(str(e), param_hint=flag) from None
    if timeout is None:
        if checks:
            raise typer.BadParameter("health checks need --confirm-timeout (how long they may take to pass)")
        return None
    from reconciler.engine import ConfirmSpec
    from reconciler.intake import parse_duration

    try:
        seconds = parse_duration(timeout)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86400:
        raise typer.BadParameter(f"{timeout!r} is not a duration between 1ms and 24h (e.g. 60s, 5m)",
                                 param_hint="--confirm-timeout")
    return ConfirmSpec(seconds, tuple(checks))


NODE_OPT = typer.Option(None, "--node", metavar="NAME", help="Read a fleet repository as node NAME (overrides "
                        "the node config's nodeName).")
LABELS_OPT = typer.Option(None, "--labels", metavar="K=V,...", help="Read a fleet repository with these node "
                          "labels (replace the node config's nodeLabels).")


def node_identity(node: Optional[str], labels: Optional[str]):
    """--node and --labels as a function of the node config (intake/nodeidentity.py), or None."""
    from reconciler.intake import identity_override

    try:
        return identity_override(node, labels)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
