"""Command-line option values parsed into the pipeline's types (the commands' shared parsers).

Each raises typer.BadParameter with the option's name, so a bad value is a usage error
(exit 64) that names what to write instead.
"""

from __future__ import annotations

from typing import List, Optional

import typer

CONFIG_OPT = typer.Option(None, "--config", help="Node config (default /etc/nftrec/config.yaml "
                          "when it exists, else defaults).")
STRICT_OPT = typer.Option(False, "--strict", help="Warnings and unknown kinds are errors too.")
EMPTY_OPT = typer.Option(False, "--allow-empty", help="Accept a revision with no Service at all (it removes every "
                         "Service; allowEmpty: true in the node config for a node that runs none).")
REMOVALS_OPT = typer.Option(False, "--allow-removals", help="Let through, this once, a revision that removes more "
                            "of the applied Services than removalGuard (node config, default 50%) allows.")

PROBE_HELP = ("Run every probe.nftrec.io/readiness probe once (from --netns) and treat endpoints that "
              "fail it as not ready; without it, one-shot commands never probe.")

FLEET_OPT = typer.Option(None, "--fleet", metavar="INVENTORY", help="Every node of this NodeInventory (names and "
                         "labels) on a fleet root: each problem or plan once, with the nodes it concerns.")


def output_opt() -> typer.Option:
    return typer.Option("text", "-o", "--output", help="text or json")


def check_output(output: str) -> None:
    if output not in ("text", "json"):
        raise typer.BadParameter("must be text or json", param_hint="-o/--output")


def field_validation(value: Optional[str]) -> Optional[str]:
    """--field-validation, as kubectl spells its values (any case): strict, warn or ignore."""
    from reconciler.intake import FIELD_VALIDATION

    if value is None:
        return None
    if value.lower() not in FIELD_VALIDATION:
        raise typer.BadParameter(f"{value!r} is not strict, warn or ignore", param_hint="--field-validation")
    return value.lower()


FIELDS_OPT = typer.Option(None, "--field-validation", callback=field_validation, metavar="strict|warn|ignore",
                          help="Unknown fields: errors (strict), warnings (warn) or not reported (ignore); "
                          "default: the node config's fieldValidation, else strict.")


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


def kernel_trace_options(live: bool, timeout: str, count: int) -> float:
    """trace --kernel's usage errors; the --timeout in seconds."""
    from reconciler.intake import parse_duration

    if live:
        raise typer.BadParameter("give --kernel or --live, not both (--kernel traces the kernel's every table)")
    try:
        seconds = parse_duration(timeout)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise typer.BadParameter(f"{timeout!r} is not a duration between 1ms and 1h (e.g. 10s)", param_hint="--timeout")
    if not 1 <= count <= 1000:
        raise typer.BadParameter(f"{count} is not between 1 and 1000", param_hint="--count")
    return seconds


IGNORE_ROLLOUT_OPT = typer.Option(False, "--ignore-rollout", help="On a fleet root: apply the revision now, whatever "
                                  "fleet.yaml's rollout says (its wave not open yet, paused, halted).")
IGNORE_HOLD_OPT = typer.Option(False, "--ignore-hold", help="Apply even while `nftrec hold` holds this node.")


def hold_until(until: Optional[str]) -> Optional[float]:
    """hold's --until: an RFC 3339 time or a duration from now, as Unix seconds; None: no end."""
    from reconciler import clock
    from reconciler.engine import parse_until

    if until is None:
        return None
    try:
        return parse_until(until, clock.now())
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--until") from None
