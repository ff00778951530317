"""Stage 3, kernel: nftables and conntrack in one network namespace.

    nft        libnftables through ctypes, knftables-style: one narrow Interface (run a
               transaction, list), a Transaction builder, a Fake for unit tests
    live       the kernel's listing parsed back into a canonical Ruleset; the generation
               token that tells whether anyone committed since we did
    conntrack  kube-proxy's UDP conntrack cleanup (pyroute2)
    health     the checks of a confirmed apply (command, HTTP GET, TCP connect) in the namespace
    probes     readiness probes (tcpSocket, httpGet, grpc) on an asyncio loop in the namespace
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "conntrack": ("cleanup_udp",),
    "health": ("HealthChecker",),
    "live": ("OTHER_KINDS", "canonical", "chain_policy", "fingerprint", "kernel_token", "parse_live", "read_live",
             "parse_duration", "read_live_objects", "read_runtime_keys", "table_flags", "table_others"),
    "probes": ("ProbeLoop", "check_probe", "probe_all", "raise_fd_limit"),
    "nft": ("Fake", "Interface", "Libnftables", "NamespaceThread", "NftError", "NotFound", "Transaction"),
})
