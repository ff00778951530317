"""The front half of the pipeline, shared by render, plan, apply and watch:
manifests + node config → validated model → desired ruleset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reconciler import logs, progress
from reconciler.intake import Inventory, NodeConfig
from reconciler.compile import NftSyntaxError, Ruleset


@dataclass(frozen=True)
class Desired:
    inventory: Inventory
    config: NodeConfig
    ruleset: Ruleset | None  # None: read with compile=False, compiled by plan/apply (apply.plan_desired)
    input_digest: str | None = None  # content digest of the manifest tree read
    config_digest: str | None = None  # intake.config_digest of `config` (after discovery)

    @property
    def revision(self) -> str:
        return self.inventory.revision


def _in_target(netns: str | None, fn):
    """`fn` as a function that runs in the namespace nftrec acts on, not the host's."""
    if netns is None:
        return fn

    def in_netns():
        from reconciler.kernel import Libnftables  # its worker thread lives in the namespace

        nft = Libnftables(netns)
        try:
            return nft.in_namespace(fn)
        finally:
            nft.close()

    return in_netns


def node_ip_discovery(netns: str | None):
    """Discover the node's primary IPs in the namespace nftrec acts on, not the host's."""
    from reconciler.intake import discover_node_ips

    return _in_target(netns, discover_node_ips)


def node_address_discovery(netns: str | None):
    """List the node's interface addresses (nodePortAddresses) in the target namespace."""
    from reconciler.intake import discover_host_addresses

    return _in_target(netns, discover_host_addresses)


def load_config(config_path: Path | None, netns: str | None, *, interfaces: bool = True,
                cache_dir: Path | None = None):
    """(the effective node config, problems): what compile sees, with node IPs and (unless
    `interfaces` is False: render) the interface addresses discovered in the target
    namespace. The no-op fast path digests exactly this. `cache_dir`: the node config's
    settings cache (intake.read_settings)."""
    from reconciler.intake import load_node_config

    return load_node_config(str(config_path) if config_path else None, discover_ips=node_ip_discovery(netns),
                            discover_addresses=node_address_discovery(netns) if interfaces else None,
                            cache_dir=cache_dir)


class InvalidInput(Exception):
    """The manifests or the node config have errors (each already logged)."""

    def __init__(self, revision: str, errors: int, directory: Path):
        self.revision, self.errors = revision, errors
        super().__init__(f"{errors} error(s) in the input of revision {revision or '-'}; nothing was "
                         f"changed. Run `nftrec validate {directory}` for the full report.")


def load_desired(directory: Path, config_path: Path | None, *, strict: bool = False,
                 netns: str | None = None, interfaces: bool = True, cache_dir: Path | None = None,
                 compile: bool = True) -> Desired:
    """Read, validate and compile, logging every problem. Raises InvalidInput when the
    input has errors: invalid input is never applied. interfaces=False (render): the
    node's interface addresses are not listed; nodeIPs stand in for them. `cache_dir`:
    the intake cache. compile=False (plan, apply): the ruleset is left None, for
    apply.plan_desired to compile against the last applied one (only what changed)."""
    from reconciler.compile import compile_ruleset
    from reconciler.intake import config_digest, read_inventory_cached

    config, config_problems = load_config(config_path, netns, interfaces=interfaces)
    result = read_inventory_cached(directory, cache_dir, strict=strict)
    problems = list(config_problems) + list(result.problems)
    for p in problems:
        logs.problem(p)
    errors = sum(p.severity == "error" for p in problems)
    if errors:
        raise InvalidInput(result.inventory.revision, errors, directory)
    if not compile:
        _warn_loopback(config)
        return Desired(result.inventory, config, None, result.digest, config_digest(config, strict=strict))
    try:
        with progress.step(f"compiling {len(result.inventory.services)} Services"):
            ruleset = compile_ruleset(result.inventory, config)
    except NftSyntaxError as e:  # defence in depth: validation should have refused it
        logs.log.error(f"{directory}: refusing input that would reach nft unsafely: {e}")
        raise InvalidInput(result.inventory.revision, 1, directory) from None
    _warn_loopback(config)
    return Desired(result.inventory, config, ruleset, result.digest, config_digest(config, strict=strict))


def _warn_loopback(config: NodeConfig) -> None:
    """kube-proxy logs loopback addresses inside nodePortAddresses and skips them."""
    from reconciler.compile import FAMILIES, select_nodeport_ips

    for family in FAMILIES:
        try:
            sel = select_nodeport_ips(config.node_port_addresses, config.node_ips,
                                      config.host_addresses if config.host_addresses is not None
                                      else tuple(("nodeIPs", ip) for ip in config.node_ips), family)
        except ValueError:
            return
        if sel.loopback:
            logs.log.warning(f"nodePortAddresses includes localhost ({', '.join(sel.loopback)}) but localhost "
                             f"NodePorts are not supported; skipped, as kube-proxy does")
