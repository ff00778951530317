"""Stage 1, intake: manifest files and the node config → validated model.

    files ─► load ─► validate ─► build (model.Inventory): inventory.read_inventory
    node config ─► config (model.NodeConfig)

`cache` and `incremental` plug into the read path (one-shot runs, `nftrec watch`).
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "cosign": ("CosignVerifier", "Refused"),
    "config": ("DEFAULT_PATH", "discover_host_addresses", "discover_node_ips", "load_node_config", "parse_duration"),
    "digests": ("InputDigest", "config_digest", "input_digest"),
    "git": ("GitError", "merge_base", "parse_range", "resolve_revision"),
    "fleet": ("FLEET_FILE", "REMOVE_ANNOTATION", "Fleet", "Identity", "Projection", "Selector", "parse_fleet", "project"),
    "fleetread": ("FleetWalk", "identity_of", "walk_fleet"),
    "gitobjects": ("Checkout", "find_checkout"),
    "rollout": ("Decision", "LocalHold", "Record", "Rollout", "Wave", "decide", "wave_of",
                "FAILED_OUTCOMES", "HALTED", "HELD", "LOCAL_HOLD", "OPEN", "OUTCOMES", "PAUSED", "bucket", "opens_at"),
    "revisiontime": ("RevisionTimeError", "revision_time"),
    "healthchecks": ("parse_health_check", "split_host_port"),
    "incremental": ("Intake", "Snapshot"),
    "kinds": ("DIRECTORY", "GIT", "OCI", "ManifestSource", "source_kind", "verifier_for"),
    "inventory": ("InventoryResult", "read_documents", "read_inventory", "read_revision", "read_verified"),
    "fleetview": ("read_git", "read_tree"),
    "nodeidentity": ("identity_override",),
    "nodeinventory": ("load_node_inventory",),
    "validate": ("no_services",),
    "load": ("SUFFIXES", "is_fleet_root", "read_fleet_bytes"),
    "model": ("Endpoint", "EndpointPort", "EndpointSlice", "HealthCheck", "Inventory", "LoadBalancerIngress", "NftSpelling", "NodeConfig",
              "OciSettings", "Probe", "Service", "ServiceCIDR", "ServicePort", "Source", "StatusSettings", "Verify"),
    "oci": ("Artifact", "Signature", "artifact_at", "close_registries", "current_digest", "named_digest", "open_store",
            "prune", "publish", "pull", "resolve", "source_artifact", "store_for"),
    "oci_reference": ("OCI_PREFIX", "SOURCE_ERROR_REASONS", "Reference", "SourceError", "is_oci", "parse_reference"),
    "probes": ("PROBE_ANNOTATION",),
    "problems": ("ERROR", "FIELD_VALIDATION", "NOTICE", "WARNING", "Problem", "count"),
    "report": ("run_validate",),
    "schema_files": ("leading_zero_octet",),
    "signatures": ("Baseline", "TrustError", "Verdict", "Verifier", "checkout_of"),
    "sources": ("STDIN", "display_root", "is_stdin"),
    "store": ("code_digest",),
})
