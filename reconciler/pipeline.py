"""The front half of the pipeline, shared by render, plan, apply and watch:
manifests + node config → validated model → desired ruleset.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reconciler.model import Inventory, NodeConfig
from reconciler.ruleset import Ruleset


@dataclass(frozen=True)
class Desired:
    inventory: Inventory
    config: NodeConfig
    ruleset: Ruleset

    @property
    def revision(self) -> str:
        return self.inventory.revision


def node_ip_discovery(netns: str | None):
    """Discover the node's primary IPs in the namespace nftrec acts on, not the host's."""
    from reconciler.config import discover_node_ips

    if netns is None:
        return discover_node_ips

    def in_netns() -> tuple[str, ...]:
        from reconciler.nft import Libnftables  # its worker thread lives in the namespace

        nft = Libnftables(netns)
        try:
            return nft.in_namespace(discover_node_ips)
        finally:
            nft.close()

    return in_netns


def load_desired(directory: Path, config_path: Path | None, *, strict: bool = False,
                 netns: str | None = None, err: TextIO = sys.stderr) -> Desired | None:
    """Read, validate and compile. Prints every problem to `err`; returns None when
    the input is invalid (invalid input is never applied)."""
    from reconciler.compile import compile_ruleset
    from reconciler.config import load_node_config
    from reconciler.inventory import read_inventory

    config, config_problems = load_node_config(str(config_path) if config_path else None,
                                               discover_ips=node_ip_discovery(netns))
    result = read_inventory(directory, strict=strict)
    problems = list(config_problems) + list(result.problems)
    for p in problems:
        print(p.format_text(), file=err)
    if any(p.severity == "error" for p in problems):
        n = sum(p.severity == "error" for p in problems)
        print(f"nftrec: {n} error(s) in the input; nothing was changed. "
              f"Run `nftrec validate {directory}` for the full report.", file=err)
        return None
    return Desired(result.inventory, config, compile_ruleset(result.inventory, config))
