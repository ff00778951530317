"""The `nftrec` command line (typer): thin wrappers that parse options and call the pipeline.

Each command imports the stages it needs inside its function, so `--help` or a no-op
`plan` never imports the compiler. Exit codes: 0 ok, 1 error, 2 "changes" / "drift" where
a command says so, 64 usage error, so a typo never reads as "changes present".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from reconciler.options import (CONFIG_OPT, EMPTY_OPT, FIELDS_OPT, FLEET_OPT, IGNORE_HOLD_OPT, IGNORE_ROLLOUT_OPT,
                                LABELS_OPT, NODE_OPT, PROBE_HELP, REMOVALS_OPT, STRICT_OPT, check_output, confirm_spec,
                                hold_until, node_identity, output_opt)

EXIT_OK, EXIT_ERROR, EXIT_CHANGES, EXIT_USAGE = 0, 1, 2, 64

# Click (vendored by typer) exits 2 on usage errors, which would collide with
# `plan --detailed-exitcode`'s "changes present"; make usage errors exit 64 (EX_USAGE).
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_UsageError.exit_code = EXIT_USAGE

app = typer.Typer(
    add_completion=True,  # typer's --install-completion / --show-completion (and see main())
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="kube-proxy's nftables mode without Kubernetes: Service and EndpointSlice YAML "
    "in a directory -> one atomic nftables transaction.",
)


class Globals:
    state_dir: Optional[Path] = None


def _version(value: bool) -> None:
    if value:
        from reconciler import __version__

        typer.echo(f"nftrec {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _global(
    state_dir: Optional[Path] = typer.Option(
        None, "--state-dir", help="State store directory (default: $NFTREC_STATE_DIR, "
        "./state in a checkout, else /var/lib/nftrec)."),
    log_format: str = typer.Option("text", "--log-format", help="text or json"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    if log_format not in ("text", "json"):
        raise typer.BadParameter("must be text or json", param_hint="--log-format")
    Globals.state_dir = state_dir
    from reconciler import logs

    logs.setup(log_format)


SOURCE_ARG = typer.Argument(".", help="Manifest directory (read recursively); - reads standard input; or an OCI "
                            "artifact (Flux's format), oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:HEX.")


@app.command()
def validate(
    directory: str = SOURCE_ARG,
    config: Optional[Path] = CONFIG_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    output: str = output_opt(),
    allow_empty: bool = EMPTY_OPT,
    node: Optional[str] = NODE_OPT,
    labels: Optional[str] = LABELS_OPT,
    fleet: Optional[Path] = FLEET_OPT,
) -> None:
    """Check manifests and the node config: schema and cross-document checks. No root,
    no nft, no kernel needed."""
    check_output(output)
    if fleet is not None:
        if node is not None or labels is not None:
            raise typer.BadParameter("--fleet validates every node of the inventory; drop --node/--labels")
        from reconciler.engine import run_validate_fleet

        raise typer.Exit(_guard(run_validate_fleet, fleet, _root(directory, config).root, config_path=config,
                                strict=strict, fields=fields, output=output, allow_empty=allow_empty))
    from reconciler.intake import run_validate

    identity = node_identity(node, labels)
    root = _root(directory, config).root
    raise typer.Exit(run_validate(root, config_path=config, strict=strict, fields=fields, output=output,
                                  allow_empty=allow_empty, identity=identity,
                                  cache_dir=_cache_dir() if root == Path(directory) else None))


@app.command()
def render(
    directory: str = SOURCE_ARG,
    config: Optional[Path] = CONFIG_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    node: Optional[str] = NODE_OPT,
    labels: Optional[str] = LABELS_OPT,
    manifests: bool = typer.Option(False, "--manifests", help="Print the node's effective manifests (a fleet "
                                   "repository's layers merged, variables substituted) instead of the ruleset."),
) -> None:
    """Print the whole desired ruleset as an `nft -f` script from scratch."""
    root = _root(directory, config).root
    desired = _desired(root, config, None, strict, fields, interfaces=False, compile=not manifests,
                       identity=node_identity(node, labels))
    if manifests:
        from reconciler.engine import write_manifests
        from reconciler.intake import identity_of, read_documents

        raise typer.Exit(write_manifests(read_documents(root, identity_of(desired.config)), sys.stdout) or 0)
    from reconciler.compile import render_header, render_script

    sys.stdout.write(render_header(desired.config) + render_script(desired.ruleset))


@app.command()
def diff(
    old: Optional[str] = typer.Argument(None, metavar="OLD", help="Manifest directory before the change (- reads "
                                        "stdin, oci://... an artifact); with --git: a revision, or OLD..NEW / OLD...NEW."),
    new: Optional[str] = typer.Argument(None, metavar="[NEW]", help="Manifest directory after the change "
                                        "(- reads stdin, oci://... an artifact); with --git: a revision."),
    git: Optional[Path] = typer.Option(None, "--git", metavar="DIR", help="Compare two git revisions of the "
                                       "manifest directory DIR (inside a clone), read from git, no checkout."),
    config: Optional[Path] = CONFIG_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print the exact nft transaction."),
    output: str = typer.Option("text", "-o", "--output", help="text, json or markdown (a pull-request comment)"),
    detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode",
                                           help="Exit 0 when nothing changes, 2 when something does."),
    fleet: Optional[Path] = FLEET_OPT,
) -> None:
    """Offline per-Service plan between two manifest trees or git revisions, for review:
    no root, no kernel; node IPs come from --config only."""
    if output not in ("text", "json", "markdown"):
        raise typer.BadParameter("must be text, json or markdown", param_hint="-o/--output")
    from reconciler.intake import GitError, parse_range

    merge_base = False
    if git is not None:
        if old is None:
            raise typer.BadParameter("with --git, give the revisions: OLD..NEW (e.g. origin/main..HEAD)")
        if new is None:
            try:
                rng = parse_range(old)
            except GitError as e:
                raise typer.BadParameter(str(e), param_hint="OLD") from None
            old, new, merge_base = rng.old, rng.new, rng.merge_base
        elif ".." in old or ".." in new:
            raise typer.BadParameter("give either OLD..NEW or two revisions, not both")
    elif old is None or new is None:
        raise typer.BadParameter("give two manifest directories, OLD and NEW (or --git DIR OLD..NEW)")
    elif old == "-" and new == "-":
        raise typer.BadParameter("only one side can be - (standard input)")
    from reconciler.engine import run_diff

    if git is None:
        old, new = (str(_root(side, config).root) if side != "-" else side for side in (old, new))
    kw = dict(git=git, merge_base=merge_base, config_path=config, strict=strict, fields=fields, output=output,
              detailed=detailed_exitcode, verbose=verbose)
    if fleet is not None:
        from reconciler.engine import run_diff_fleet

        raise typer.Exit(_guard(run_diff_fleet, old, new, fleet, **kw))
    raise typer.Exit(_guard(run_diff, old, new, **kw))


NETNS_OPT = typer.Option(None, "--netns", help="Act inside this named network namespace "
                         "(as `ip netns add` makes); the host namespace is never touched.")


def _check_netns(netns: Optional[str]) -> None:
    """A name as `ip netns add` makes it (under /run/netns), usable as a state directory,
    of a namespace that exists: checked before anything is created for it."""
    from reconciler.engine import namespace_dir
    from reconciler.kernel import require_netns

    if netns is None:
        return
    try:
        namespace_dir(Path("/"), netns)
    except ValueError as e:
        raise typer.BadParameter(f"{e}; give the name as `ip netns list` shows it",
                                 param_hint="--netns") from None
    try:
        require_netns(netns)
    except Exception as e:  # NftError: the one line that names it
        from reconciler import logs

        logs.log.error(str(e))
        raise typer.Exit(EXIT_ERROR) from None


def _state_root() -> Path:
    from reconciler.engine import default_state_dir

    return Globals.state_dir or default_state_dir()


def _cache_dir() -> Optional[Path]:
    from reconciler.engine import intake_cache_dir

    return intake_cache_dir(_state_root())


def _target(config: Optional[Path], netns: Optional[str], recover: bool = True):
    """Where a kernel command acts: namespace, table (from the node config), state dir.
    `recover`: first roll back a confirmed apply whose nftrec died in its window."""
    from reconciler import logs
    from reconciler.engine import Target, config_cache_dir
    from reconciler.intake import load_node_config

    _check_netns(netns)
    cfg, problems = load_node_config(str(config) if config else None, discover=False,
                                     cache_dir=config_cache_dir(_state_root()))
    errors = [p for p in problems if p.is_error]
    for p in errors:
        logs.problem(p)
    if errors:
        raise typer.Exit(EXIT_ERROR)
    target = Target(netns, cfg.table_name, _state_root())
    if recover:
        from reconciler.engine import recover_pending

        def recover() -> int:
            recover_pending(target)  # rolls back, and says so on stderr, when a window was left open
            return EXIT_OK

        if _guard(recover) != EXIT_OK:
            raise typer.Exit(EXIT_ERROR)
    return target


def _root(argument: str, config: Optional[Path], target=None):
    """The intake.ManifestSource of DIR, or of the artifact an oci:// reference names
    (engine/source.py; `target`: plan, apply)."""
    from reconciler.engine import is_source, open_source
    from reconciler.intake import ManifestSource

    if not is_source(argument):
        return ManifestSource(argument, Path(argument))
    source = _guard(open_source, argument, config, _state_root(), target)
    if not isinstance(source, ManifestSource):  # the error was said
        raise typer.Exit(EXIT_ERROR)
    return source


def _desired(directory: Path, config: Optional[Path], netns: Optional[str], strict: bool, fields: Optional[str],
             target=None, interfaces: bool = True, compile: bool = True, signed_by=None, allow_rollback: bool = False,
             source=None, refuse_empty: bool = False, identity=None):
    """The validated, compiled input; invalid input exits 1 (and, for apply, is recorded
    as a failed attempt: status then shows lastAttemptedRevision != lastAppliedRevision).
    compile=False: plan and apply compile it themselves, only what changed.
    `signed_by` (plan, apply: their Target): check the revision of `source` (a ManifestSource) under `verify`."""
    from reconciler import logs
    from reconciler.engine import InvalidInput, config_cache_dir, load_desired

    try:
        signed = None
        if signed_by is not None:
            from reconciler.engine import rollback_baseline

            signed = (rollback_baseline(signed_by.store()), allow_rollback)
        return load_desired(directory, config, strict=strict, fields=fields, netns=netns, interfaces=interfaces,
                            cache_dir=_cache_dir(), compile=compile, config_cache=config_cache_dir(_state_root()),
                            signed=signed, source=source, refuse_empty=refuse_empty, identity=identity)
    except InvalidInput as e:
        logs.log.error(str(e))
        if target is not None and e.record:
            _guard(_record_invalid, target, e)
        raise typer.Exit(EXIT_ERROR)


def _probed(desired, netns: Optional[str], probe: bool):
    """--probe: the desired ruleset with this moment's probe results."""
    if not probe:
        return desired
    from reconciler.engine import probe_desired

    code = []
    result = _guard(lambda: code.append(probe_desired(desired, netns)) or EXIT_OK)
    if result != EXIT_OK:
        raise typer.Exit(result)
    return code[0]


def _record_invalid(target, e) -> int:
    from reconciler.engine import record_invalid

    return record_invalid(target, e)


def _guard(fn, *args, **kwargs) -> int:
    """Run a command; a CommandError becomes one clear line on stderr and exit 1 (engine.guard)."""
    from reconciler.engine import guard

    return guard(fn, *args, **kwargs)


@app.command()
def plan(
    directory: str = SOURCE_ARG,
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print the exact nft transaction."),
    output: str = output_opt(),
    detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode",
                                           help="Exit 0 when nothing changes, 2 when something does."),
    out: Optional[Path] = typer.Option(None, "--out", help="Save the plan for `apply --plan FILE`."),
    refresh: bool = typer.Option(False, "--refresh", help="Always read the manifests and list the "
                                 "kernel's tables (skip the unchanged-input and unchanged-generation fast paths)."),
    probe: bool = typer.Option(False, "--probe", help=PROBE_HELP),
    allow_empty: bool = EMPTY_OPT,
    allow_removals: bool = REMOVALS_OPT,
) -> None:
    """Show what apply would change in the kernel, grouped by Service. A revision that removes more
    Services than removalGuard allows is shown, then refused (exit 1; no plan saved) unless --allow-removals."""
    check_output(output)
    from reconciler.engine import run_plan_noop

    target = _target(config, netns)
    source = _root(directory, config, target)
    if not refresh and out is None and not probe:  # unchanged input, config and kernel: no compile, no listing
        rc = _guard(run_plan_noop, target, source.root, config, strict=strict, fields=fields,
                    output=output)
        if rc is not None:
            raise typer.Exit(rc)
    from reconciler.engine import run_plan  # imported late: the fast path never needs it

    desired = _probed(_desired(source.root, config, netns, strict, fields, compile=probe, signed_by=target,
                               source=source, refuse_empty=not allow_empty), netns, probe)
    _rollout(target, desired, source.root, record=False)  # says so when apply would hold it
    raise typer.Exit(_guard(run_plan, desired, target, verbose=verbose, output=output, detailed=detailed_exitcode,
                            out=out, refresh=refresh, config=config, allow_removals=allow_removals))


@app.command()
def apply(
    directory: Optional[str] = typer.Argument(None, help="Manifest directory (default: .), or an OCI artifact: "
                                              "oci://HOST[:PORT]/REPO:TAG or @sha256:HEX."),
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="Apply a plan saved by `plan --out`; "
                                             "refused when stale or already applied."),
    rollback: bool = typer.Option(False, "--rollback", help="Re-apply the previous applied ruleset."),
    restore: bool = typer.Option(False, "--restore", help="Re-apply the last applied ruleset from the state "
                                 "directory alone (at boot, after `nft flush ruleset`): no source, network or node "
                                 "config read; only what differs; refused when that record is missing or damaged."),
    allow_rollback: bool = typer.Option(False, "--allow-rollback", help="With `verify`: apply a signed revision "
                                        "that does not descend from the last applied one, this once."),
    verify: str = typer.Option("touched", "--verify", help="After the transaction, read back what it wrote and "
                               "check that nobody else committed (touched), or list and compare the whole "
                               "table (full)."),
    probe: bool = typer.Option(False, "--probe", help=PROBE_HELP),
    confirm_timeout: Optional[str] = typer.Option(
        None, "--confirm-timeout", metavar="DURATION", help="Keep the new ruleset only if confirmed within "
        "DURATION (e.g. 60s): by every health check passing, else by `nftrec confirm`; otherwise the previous "
        "ruleset comes back in one transaction and apply exits 1."),
    health_cmd: Optional[List[str]] = typer.Option(
        None, "--health-cmd", metavar="CMD", help="With --confirm-timeout: a shell command run in the namespace "
        "(sh -c, as root); exit 0 passes. Repeatable."),
    health_url: Optional[List[str]] = typer.Option(
        None, "--health-url", metavar="URL", help="With --confirm-timeout: an HTTP GET from the namespace; "
        "2xx passes. Repeatable."),
    health_tcp: Optional[List[str]] = typer.Option(
        None, "--health-tcp", metavar="HOST:PORT", help="With --confirm-timeout: a TCP connect from the "
        "namespace, e.g. to a Service VIP. Repeatable."),
    allow_empty: bool = EMPTY_OPT,
    allow_removals: bool = REMOVALS_OPT,
    ignore_rollout: bool = IGNORE_ROLLOUT_OPT,
    ignore_hold: bool = IGNORE_HOLD_OPT,
) -> None:
    """Commit the desired ruleset as one atomic transaction, verify it, record state. Exit 3 (nothing
    applied) when a fleet's rollout or `nftrec hold` holds the revision."""
    from reconciler.engine import run_apply

    if verify not in ("touched", "full"):
        raise typer.BadParameter("must be touched or full", param_hint="--verify")
    if restore:
        _restore(netns, directory, config, plan_file, rollback, probe, confirm_timeout, health_cmd, health_url,
                 health_tcp, allow_empty, allow_removals, allow_rollback, ignore_rollout, ignore_hold)
    spec = confirm_spec(confirm_timeout, health_cmd or [], health_url or [], health_tcp or [])
    if sum(x is not None and x is not False for x in (directory, plan_file, rollback or None)) > 1:
        raise typer.BadParameter("give one of DIRECTORY, --plan FILE or --rollback")
    target = _target(config, netns)
    desired = None
    if plan_file is None and not rollback:
        source = _root(directory or ".", config, target)
        if not probe:
            from reconciler.engine import run_apply_noop

            rc = _guard(run_apply_noop, target, source.root, config, strict=strict, fields=fields)
            if rc is not None:
                raise typer.Exit(rc)
        desired = _probed(_desired(source.root, config, netns, strict, fields, target=target, compile=probe,
                                   signed_by=target, allow_rollback=allow_rollback, source=source,
                                   refuse_empty=not allow_empty), netns, probe)
        _rollout(target, desired, source.root, ignore_rollout=ignore_rollout, ignore_hold=ignore_hold)
    elif probe:
        raise typer.BadParameter("--probe needs a manifest directory (not --plan or --rollback)")
    node = _node_config(config) if plan_file is not None or rollback else None
    if rollback and node.verify is not None:  # nftrec's own history: no signature is checked again
        from reconciler import logs

        logs.log.info("verify: --rollback re-applies a ruleset from nftrec's own history (applied and verified "
                      "before); no revision is checked, and the rollback is allowed")
    raise typer.Exit(_guard(run_apply, target, desired=desired, plan_path=plan_file, rollback=rollback,
                            verify=verify, confirm=spec, node=node, allow_rollback=allow_rollback,
                            allow_removals=allow_removals))


def _restore(netns: Optional[str], *others) -> None:
    """`apply --restore`: nothing but --netns (and --verify, which it ignores: it always lists)."""
    if any(others):
        raise typer.BadParameter("--restore takes only --netns: it reads no manifests and no node config, and "
                                 "restores every table the state directory records")
    from reconciler.engine import run_restore

    _check_netns(netns)
    raise typer.Exit(_guard(run_restore, _state_root(), netns))


def _rollout(target, desired, root: Path, **kw) -> None:
    """A fleet's rollout and the local hold (engine/rollout.py): apply exits 3 when they hold the revision."""
    from reconciler.engine import EXIT_HELD, one_shot

    held = []
    if _guard(lambda: held.append(one_shot(target, desired, root, **kw)) or EXIT_OK) != EXIT_OK:
        raise typer.Exit(EXIT_ERROR)
    if held[0] is not None and kw.get("record", True):
        raise typer.Exit(EXIT_HELD)


def _node_config(config: Optional[Path]):
    """The node config without discovery (its `verify`, for a saved plan or a rollback)."""
    from reconciler.engine import config_cache_dir
    from reconciler.intake import load_node_config

    return load_node_config(str(config) if config else None, discover=False, cache_dir=config_cache_dir(_state_root()))[0]


@app.command()
def confirm(
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
) -> None:
    """Confirm an `apply --confirm-timeout` that is waiting, so its ruleset stays (exit 0);
    exit 1 when nothing waits or it was already rolled back."""
    from reconciler.engine import run_confirm

    raise typer.Exit(_guard(run_confirm, _target(config, netns, recover=False)))


@app.command()
def status(
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
    output: str = output_opt(),
    detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode",
                                           help="Exit 3, not 1, when the newest revision attempted was not "
                                                "applied, to tell it from an error of status itself."),
) -> None:
    """Last applied revision and time, whether the kernel drifted, whether the newest revision is applied.

    Exit codes: 0 in sync; 2 the kernel drifted from the last applied ruleset; 1 the newest revision
    attempted was not applied (invalid, refused by verify or the removal guard, rolled back, rejected
    by the kernel; 3 with --detailed-exitcode), or status itself failed. Drift wins over 1 and 3."""
    check_output(output)
    from reconciler.engine import run_status

    raise typer.Exit(_guard(run_status, _target(config, netns), output=output, detailed=detailed_exitcode))


@app.command()
def hold(
    until: Optional[str] = typer.Option(None, "--until", metavar="TIME", help="End the hold by itself at TIME: "
                                        "RFC 3339 (2026-12-06T22:00:00Z) or a duration from now (2h, 90m)."),
    reason: str = typer.Option("", "--reason", help="Why (one line, shown by status, /readyz and the logs)."),
    netns: Optional[str] = NETNS_OPT,
) -> None:
    """Hold new revisions on this node (a maintenance window): the applied one stays and is repaired;
    watch and apply take no new one until `nftrec release` or --until (apply --ignore-hold overrides)."""
    from reconciler.engine import run_hold

    at = hold_until(until)
    _check_netns(netns)
    raise typer.Exit(_guard(run_hold, _state_root(), netns, until=at, reason=reason))


@app.command()
def release(netns: Optional[str] = NETNS_OPT) -> None:
    """End `nftrec hold` on this node: watch takes the newest revision (its wave permitting)."""
    from reconciler.engine import run_release

    _check_netns(netns)
    raise typer.Exit(_guard(run_release, _state_root(), netns))


@app.command()
def cleanup(
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
    kube_proxy: bool = typer.Option(False, "--kube-proxy", help="Also delete kube-proxy's own "
                                    "`kube-proxy` tables (after migrating away from it)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be deleted."),
) -> None:
    """Delete nftrec's tables in both families (kube-proxy's CleanupLeftovers)."""
    from reconciler.engine import run_cleanup

    target = _target(config, netns)
    raise typer.Exit(_guard(lambda: EXIT_OK if run_cleanup(target, kube_proxy=kube_proxy, dry_run=dry_run)
                            else EXIT_ERROR))


@app.command()
def watch(
    directory: str = SOURCE_ARG,
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
    strict: bool = STRICT_OPT,
    fields: Optional[str] = FIELDS_OPT,
    metrics_address: str = typer.Option("127.0.0.1:9105", "--metrics-address",
                                        help="HOST:PORT for /metrics and /healthz (port 0: any free "
                                        "port); \"\" disables them."),
    debounce: float = typer.Option(0.2, "--debounce", min=0.0, max=60.0,
                                   help="Seconds of quiet after a file change before a sync."),
    allow_empty: bool = EMPTY_OPT,
) -> None:
    """The reconcile daemon: re-apply on every manifest change, repair drift every
    fullSyncPeriod; runs until SIGTERM/SIGINT (rules stay); SIGHUP re-reads the config."""
    from reconciler.daemon import run_watch

    if str(directory) == "-":
        raise typer.BadParameter("watch reads a directory, not standard input", param_hint="DIRECTORY")
    target = _target(config, netns)
    raise typer.Exit(_guard(run_watch, directory, config, target, strict=strict, fields=fields,
                            metrics_address=metrics_address, debounce=debounce, allow_empty=allow_empty))


@app.command()
def doctor(
    config: Optional[Path] = CONFIG_OPT,
    netns: Optional[str] = NETNS_OPT,
) -> None:
    """Check that nftrec can work here: kernel, nft, privileges, conflicting tables."""
    from reconciler.engine import run_doctor

    target = _target(config, netns)
    raise typer.Exit(run_doctor(netns, target.table))
