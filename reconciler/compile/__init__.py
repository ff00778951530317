"""Stage 2, compile: model → the desired ruleset in kube-proxy's layout.

`skeleton` is the static part of both tables, `services` one Service's objects (its
fragment) and the whole ruleset, `topology` the endpoint selection, `assemble` puts the
fragments into the skeleton (`layout`: the sharded endpoint maps), `incremental` and
`oneshot` compile only the changed Services, `projection` cuts rulesets down to a change.
`ruleset` is the plain data every later stage speaks; `serialize` its JSON form and digest.
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "incremental": ("Compiled", "changed_services", "compile_incremental"),
    "oneshot": ("OneShot", "compile_all", "compile_oneshot"),
    "projection": ("project",),
    "layout": ("AFFINITY_SET", "HAIRPIN_VMAP", "LAYOUTS", "affinity_key", "affinity_set", "affinity_updates",
               "allocation_of", "chain_range", "dnat_pick", "hairpin_shard_of", "map_for", "pick_rule", "relocate",
               "vmap_pick"),
    "naming": ("join_host_port",),
    "nodeports": ("NodePortSelection", "describe_view_change", "node_address_view", "select_nodeport_ips"),
    "probes": ("ProbeTarget", "probe_targets", "with_probe_results"),
    "render": ("render_header", "render_script", "render_table"),
    "ruleset": ("FAMILIES", "BaseHook", "Chain", "Element", "NamedSet", "NftSyntaxError", "Rule", "Ruleset",
                "Table", "chain_cmd", "chain_id", "chain_rules_cmd", "check_name", "element_cmd", "element_id", "set_elements_cmd", "declarable", "rule_cmd",
                "set_cmd", "set_id", "table_cmd"),
    "serialize": ("SerializeError", "canonical_json", "digest", "digest_bytes", "digest_form", "digest_parts", "digest_pieces", "digest_json", "element_to_json", "form_parts", "parts_digest", "ruleset_from_json", "ruleset_to_json"),
    "topology": ("derived_topology_hints", "endpoints_for_port"),
    "skeleton": ("compile_static",),
    "services": ("cluster_ip_for", "compile_ruleset", "compile_service", "ips_of_family", "slices_by_service"),
})
