"""Stage 3, kernel: nftables and conntrack in one network namespace, behind the narrow
`Interface` the engine and daemon use (knftables-style: a Transaction, the real kernel
through libnftables, and a Fake).
"""

# interface (Interface, NftError), features (which spellings this nft accepts), transaction (Transaction), libnftables (the real kernel;
# netns: the namespace thread; netlink: tables and the generation id), fake (Fake),
# ruletext (the rule tokenizer and normal form), live (listing → canonical Ruleset; the
# generation token), isolated (a child process for what may crash or hang), conntrack (UDP
# cleanup), health (confirmed apply's checks), probes (readiness probes), tracetable
# (`trace --kernel`'s table and `nft monitor trace`, in child processes).

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "conntrack": ("cleanup_udp",),
    "fake": ("Fake",),
    "features": ("PROBE_TABLE", "Spellings", "kernel_refusals", "library_identity", "probe_spelling"),
    "health": ("HealthChecker",),
    "interface": ("Crashed", "Interface", "MayHaveCommitted", "NftError", "NotFound"),
    "isolated": ("Outcome", "in_child", "nft_binary", "program", "run", "run_nft", "start", "start_nft"),
    "libnftables": ("Libnftables", "SecondContext"),
    "live": ("OTHER_KINDS", "canonical", "chain_policy", "fingerprint", "kernel_token", "list_live", "parse_live", "read_live",
             "parse_duration", "read_live_objects", "read_runtime_keys", "table_flags", "table_others"),
    "netns": ("NamespaceThread", "require_netns"),
    "netlink": ("netlink_delete_table", "netns_cookie", "own_portids"),
    "probes": ("ProbeLoop", "check_probe", "probe_all", "raise_fd_limit"),
    "ruletext": ("rule_tokens",),
    "transaction": ("Transaction", "canonical_ops"),
    "tracetable": ("TRACE_TABLE_PREFIX", "exit_reason", "run_nft_child", "start_trace_monitor", "stop_child",
                   "sweep_trace_tables", "trace_table_name", "trace_table_script"),
})
