"""Stage 1, intake: manifest files and the node config → validated model.

    files ─► load (YAML/JSON, with positions) ─► validate (JSON Schema, then Kubernetes'
    own rules) ─► inventory (model.Inventory)      node config ─► config (model.NodeConfig)

`incremental` reads the same directory again and again, re-parsing only what changed
(`nftrec watch`); `cache` keeps per-file results on disk for one-shot runs, keyed by
content (`digests`); `report` is the `validate` command; `sources` reads `-` (stdin),
`git` one revision of a repository (`nftrec diff --git`). Other stages use only these names.
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "cache": ("read_inventory_cached",),
    "config": ("DEFAULT_PATH", "discover_host_addresses", "discover_node_ips", "load_node_config", "parse_duration"),
    "digests": ("InputDigest", "code_digest", "config_digest", "input_digest"),
    "git": ("GitError", "merge_base", "parse_range", "read_revision", "resolve"),
    "healthchecks": ("parse_health_check", "split_host_port"),
    "incremental": ("Intake", "Snapshot"),
    "inventory": ("InventoryResult", "read_inventory"),
    "load": ("SUFFIXES",),
    "model": ("Endpoint", "EndpointPort", "EndpointSlice", "HealthCheck", "Inventory", "LoadBalancerIngress", "NodeConfig",
              "Probe", "Service", "ServiceCIDR", "ServicePort", "Source"),
    "probes": ("PROBE_ANNOTATION",),
    "problems": ("ERROR", "NOTICE", "WARNING", "Problem"),
    "report": ("run_validate",),
    "sources": ("STDIN", "display_root", "is_stdin"),
})
