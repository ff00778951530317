"""Stage 2, compile: model → the desired ruleset in kube-proxy's layout (SPEC §3).

    model.Inventory + NodeConfig ─► services (one fragment per Service, plus the static
    skeleton) ─► ruleset.Ruleset ─► render (an `nft -f` script, for `nftrec render`)

`ruleset` is the vocabulary every later stage speaks: tables, chains, rules, sets and
elements as plain data, each checked so that no input can inject nft syntax. `naming`
is kube-proxy's chain and set names; `serialize` turns a Ruleset into JSON and back (state,
saved plans); `incremental` recompiles only the Services that changed (`nftrec watch`);
`topology` is which hints kube-proxy follows, and the hints nftrec derives from
`trafficDistribution` where no EndpointSlice controller writes them; `layout` is the
default sharded endpoint maps (`layout: kube-proxy` keeps kube-proxy's anonymous maps);
`forked` compiles part of a one-shot command's Services in a forked child (both cores).
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "incremental": ("Compiled", "OneShot", "changed_services", "compile_incremental", "compile_oneshot", "project"),
    "layout": ("AFFINITY_SET", "HAIRPIN_VMAP", "LAYOUTS", "affinity_updates", "allocation_of", "chain_range",
               "hairpin_shard_of", "relocate"),
    "naming": ("join_host_port",),
    "nodeports": ("NodePortSelection", "describe_view_change", "node_address_view", "select_nodeport_ips"),
    "probes": ("ProbeTarget", "probe_targets", "with_probe_results"),
    "render": ("render_header", "render_script"),
    "ruleset": ("FAMILIES", "BaseHook", "Chain", "Element", "NamedSet", "NftSyntaxError", "Rule", "Ruleset",
                "Table", "chain_cmd", "chain_id", "chain_rules_cmd", "check_name", "element_cmd", "element_id", "set_elements_cmd", "declarable", "rule_cmd",
                "set_cmd", "set_id", "table_cmd"),
    "serialize": ("SerializeError", "canonical_json", "digest", "digest_bytes", "digest_form", "digest_parts", "digest_pieces", "digest_json", "element_to_json", "form_parts", "parts_digest", "ruleset_from_json", "ruleset_to_json"),
    "topology": ("derived_topology_hints",),
    "services": ("cluster_ip_for", "compile_ruleset", "compile_static", "endpoints_for_port", "ips_of_family",
                 "slices_by_service"),
})
