"""`nftrec fleet ...`: commands about a whole fleet rather than this node, as a typer
sub-app that cli.py registers on commands.app. `fleet status REMOTE` reads the status
records the nodes push to git (engine/fleetstatus.py); `--wait WAVE` is CI's gate between
two waves: 0 every node of the wave applied the revision, 1 one failed it, 2 timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

fleet_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                        help="A fleet's rollout, read from the status records its nodes push to git.")


def _duration(value: Optional[str], flag: str) -> Optional[float]:
    from reconciler.intake import parse_duration

    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise typer.BadParameter(f"{value!r} is not a positive duration (e.g. 90s, 15m, 2h)", param_hint=flag)
    return seconds


@fleet_app.command("status")
def status(
    remote: str = typer.Argument(..., metavar="REMOTE", help="The git remote the nodes push their records to "
                                 "(the node config's status.remote); only refs/nftrec/status/* are fetched."),
    revision: Optional[str] = typer.Option(None, "--revision", metavar="R", help="Report this revision (a commit, "
                                           "at least 7 characters of it, or an OCI digest); default: the newest "
                                           "one any node reported."),
    output: str = typer.Option("text", "-o", "--output", help="text, json or markdown (a PR or chat message)"),
    wait: Optional[str] = typer.Option(None, "--wait", metavar="WAVE", help="Poll until every node of WAVE applied "
                                       "--revision (exit 0), one failed it (1) or --timeout passed (2)."),
    timeout: str = typer.Option("10m", "--timeout", metavar="D", help="How long --wait waits (and, for a report, "
                                "how long the fetch may take)."),
    fleet: Optional[Path] = typer.Option(None, "--fleet", metavar="DIR", help="The fleet repository's directory: "
                                         "its fleet.yaml's rollout gives the offline threshold, the wave names, "
                                         "and the wave of a node whose record names none (from its labels)."),
    inventory: Optional[Path] = typer.Option(None, "--inventory", metavar="FILE", help="A NodeInventory (with "
                                             "--fleet): --wait also waits for its nodes of WAVE that never pushed."),
    offline_after: Optional[str] = typer.Option(None, "--offline-after", metavar="D", help="A node with no record "
                                                "for D is offline (default: 3 x max(rollout interval, 1h))."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help="Private key for an ssh:// "
                                           "remote (default: git's own authentication)."),
) -> None:
    """Per revision, which nodes applied it, hold it (wave, paused, local hold, halted),
    failed it, are offline, or have not reported it yet."""
    from reconciler.engine import guard, run_fleet_status

    if output not in ("text", "json", "markdown"):
        raise typer.BadParameter("must be text, json or markdown", param_hint="-o/--output")
    if wait is not None and revision is None:
        raise typer.BadParameter("--wait needs --revision R: the newest revision the nodes reported may be "
                                 "the one before the change you wait for", param_hint="--revision")
    if inventory is not None and fleet is None:
        raise typer.BadParameter("--inventory needs --fleet DIR (the waves come from its rollout)",
                                 param_hint="--inventory")
    raise typer.Exit(guard(run_fleet_status, remote, revision=revision, output=output, wait=wait,
                           timeout=_duration(timeout, "--timeout"), fleet_dir=fleet, inventory=inventory,
                           offline_after=_duration(offline_after, "--offline-after"),
                           ssh_key=str(ssh_key) if ssh_key else None))
