"""The front half of the pipeline, shared by render, plan, apply and watch:
manifests + node config → validated model → desired ruleset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reconciler import logs
from reconciler.intake import Inventory, NodeConfig
from reconciler.compile import NftSyntaxError, Ruleset


@dataclass(frozen=True)
class Desired:
    inventory: Inventory
    config: NodeConfig
    ruleset: Ruleset
    input_digest: str | None = None  # content digest of the manifest tree read
    config_digest: str | None = None  # intake.config_digest of `config` (after discovery)

    @property
    def revision(self) -> str:
        return self.inventory.revision


def node_ip_discovery(netns: str | None):
    """Discover the node's primary IPs in the namespace nftrec acts on, not the host's."""
    from reconciler.intake import discover_node_ips

    if netns is None:
        return discover_node_ips

    def in_netns() -> tuple[str, ...]:
        from reconciler.kernel import Libnftables  # its worker thread lives in the namespace

        nft = Libnftables(netns)
        try:
            return nft.in_namespace(discover_node_ips)
        finally:
            nft.close()

    return in_netns


class InvalidInput(Exception):
    """The manifests or the node config have errors (each already logged)."""

    def __init__(self, revision: str, errors: int, directory: Path):
        self.revision, self.errors = revision, errors
        super().__init__(f"{errors} error(s) in the input of revision {revision or '-'}; nothing was "
                         f"changed. Run `nftrec validate {directory}` for the full report.")


def load_desired(directory: Path, config_path: Path | None, *, strict: bool = False,
                 netns: str | None = None, cache_dir: Path | None = None) -> Desired:
    """Read, validate and compile, logging every problem. Raises InvalidInput when the
    input has errors: invalid input is never applied. `cache_dir`: the intake cache."""
    from reconciler.compile import compile_ruleset
    from reconciler.intake import config_digest, load_node_config
    from reconciler.intake import read_inventory_cached

    config, config_problems = load_node_config(str(config_path) if config_path else None,
                                               discover_ips=node_ip_discovery(netns))
    result = read_inventory_cached(directory, cache_dir, strict=strict)
    problems = list(config_problems) + list(result.problems)
    for p in problems:
        logs.problem(p)
    errors = sum(p.severity == "error" for p in problems)
    if errors:
        raise InvalidInput(result.inventory.revision, errors, directory)
    try:
        ruleset = compile_ruleset(result.inventory, config)
    except NftSyntaxError as e:  # defence in depth: validation should have refused it
        logs.log.error(f"{directory}: refusing input that would reach nft unsafely: {e}")
        raise InvalidInput(result.inventory.revision, 1, directory) from None
    return Desired(result.inventory, config, ruleset, result.digest, config_digest(config, strict=strict))
