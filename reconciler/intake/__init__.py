"""Stage 1, intake: manifest files and the node config → validated model.

    files ─► load (YAML/JSON, with positions) ─► validate (JSON Schema, then Kubernetes'
    own rules) ─► inventory (model.Inventory)      node config ─► config (model.NodeConfig)

`inventory.read_inventory` is the read path; `cache` keeps its per-file results on disk
for one-shot runs (`store`: the cache format); `incremental` reads the same directory
again and again for `nftrec watch`, re-parsing only what changed; `digests` are the
no-op check's; `report` is the `validate` command; `sources` reads `-` (stdin), `git` one
revision of a repository (`nftrec diff --git`). Other stages use only these names.
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "config": ("DEFAULT_PATH", "discover_host_addresses", "discover_node_ips", "load_node_config", "parse_duration"),
    "digests": ("InputDigest", "config_digest", "input_digest"),
    "git": ("GitError", "merge_base", "parse_range", "resolve"),
    "healthchecks": ("parse_health_check", "split_host_port"),
    "incremental": ("Intake", "Snapshot"),
    "inventory": ("InventoryResult", "read_inventory", "read_revision"),
    "load": ("SUFFIXES",),
    "model": ("Endpoint", "EndpointPort", "EndpointSlice", "HealthCheck", "Inventory", "LoadBalancerIngress", "NodeConfig",
              "Probe", "Service", "ServiceCIDR", "ServicePort", "Source"),
    "probes": ("PROBE_ANNOTATION",),
    "problems": ("ERROR", "NOTICE", "WARNING", "Problem"),
    "report": ("run_validate",),
    "sources": ("STDIN", "display_root", "is_stdin"),
    "store": ("code_digest",),
})
