"""Stage 3, kernel: nftables and conntrack in one network namespace.

    interface    the seam the engine and daemon use (Interface, NftError), knftables-style
    transaction  the Transaction builder: nft commands run as one kernel transaction
    libnftables  the real kernel through ctypes (netns: the namespace thread; netlink:
                 tables and the generation id over raw netlink)
    fake         the whole Interface in memory, for unit tests
    ruletext     the rule tokenizer and the normal form of rule text
    live         the listing parsed back into a canonical Ruleset; the generation token
    conntrack    kube-proxy's UDP conntrack cleanup (pyroute2)
    health       the checks of a confirmed apply (command, HTTP GET, TCP connect)
    probes       readiness probes (tcpSocket, httpGet, grpc) on an asyncio loop
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "conntrack": ("cleanup_udp",),
    "fake": ("Fake",),
    "health": ("HealthChecker",),
    "interface": ("Interface", "NftError", "NotFound"),
    "libnftables": ("Libnftables",),
    "live": ("OTHER_KINDS", "canonical", "chain_policy", "fingerprint", "kernel_token", "parse_live", "read_live",
             "parse_duration", "read_live_objects", "read_runtime_keys", "table_flags", "table_others"),
    "netns": ("NamespaceThread",),
    "probes": ("ProbeLoop", "check_probe", "probe_all", "raise_fd_limit"),
    "ruletext": ("rule_tokens",),
    "transaction": ("Transaction",),
})
