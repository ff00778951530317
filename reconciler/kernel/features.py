"""Which of the sharded layout's constructs the target's libnftables and kernel accept,
found by check transactions (`nft -c`: nothing changes) of the exact texts the compiler
writes, never by a version table; the answer is the compile's `NftSpelling`. Probed once
per namespace, library and kernel, and remembered in the state directory (`Spellings`),
so a no-op plan pays a stat, not a probe.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from reconciler import logs
from reconciler.compile import (AFFINITY_SET, Chain, Rule, Table, affinity_key, affinity_set, chain_cmd, dnat_pick,
                                map_for, pick_rule, rule_cmd, set_cmd, table_cmd, vmap_pick)
from reconciler.intake import NftSpelling
from reconciler.kernel.interface import Crashed, Interface, NftError
from reconciler.kernel.transaction import Transaction

PROBE_TABLE = "nftrec-probe"  # only ever in a dry run


def _probe(family: str) -> tuple[list[str], list[str]]:
    """The commands of each construct's check: (index maps, shared affinity set), each
    with a rule that uses it, as the compiler writes them (compile/layout.py)."""
    table = Table(family, PROBE_TABLE)
    # the verdicts go to a chain of their own: 5.10 refuses a chain that jumps to itself (ELOOP)
    head = [table_cmd("add", table), chain_cmd("add", family, PROBE_TABLE, Chain("probe")),
            chain_cmd("add", family, PROBE_TABLE, Chain("probe-to"))]

    def rule(body: str) -> str:
        return rule_cmd(family, PROBE_TABLE, "probe", Rule(body))

    dnat = dnat_pick(family, "probe/dnat", "tcp", ("192.0.2.1 . 80",) if family == "ip" else ("2001:db8::1 . 80",))
    vmap = vmap_pick(family, "probe/vmap", ("goto probe-to",))
    maps = head + [set_cmd("add", family, PROBE_TABLE, map_for(family, p.map)) for p in (dnat, vmap)]
    maps += [rule(pick_rule(p, 2).body) for p in (dnat, vmap)]
    key = affinity_key(family, "probe")
    affinity = head + [set_cmd("add", family, PROBE_TABLE, affinity_set(family, "")),
                       rule(f"update @{AFFINITY_SET} {{ {key} timeout 10800s }}"),
                       rule(f"{key} @{AFFINITY_SET} goto probe-to")]
    return maps, affinity


def probe_spelling(nft: Interface) -> NftSpelling:
    """The spellings `nft`'s library and kernel accept, by check transactions. Raises
    NftError when even the empty table is refused (no CAP_NET_ADMIN, say): that says
    nothing about the constructs."""
    maps, affinity = _probe("ip")
    baseline = Transaction()
    for c in maps[:3]:  # the table and its chains
        baseline.raw(c)
    nft.check(baseline)

    def accepts(cmds: list[str]) -> bool:
        why = _refusal(nft, cmds)
        if why is not None:
            logs.log.debug(f"nft refuses a construct, using another spelling: {why}")
        return why is None

    # nft 0.9.8 refuses `typeof numgen … : verdict`; it accepts `: ip daddr . tcp dport`,
    # but writes that map's integer keys in network byte order while numgen yields host
    # order, so no packet would find its endpoint: both maps go by the one check.
    return NftSpelling(index_maps=accepts(maps), shared_affinity=accepts(affinity))


def _sample(spelling: NftSpelling):
    """One Service of each kind nftrec compiles, both families, in the probe table: a
    LoadBalancer (every protocol, externalIPs, source ranges, Local policy, ClientIP
    affinity) with endpoints, and a ClusterIP without (its reject)."""
    from reconciler.intake import (Endpoint, EndpointPort, EndpointSlice, Inventory, LoadBalancerIngress, NodeConfig,
                                   Service, ServicePort)

    ports = (ServicePort("t", "TCP", 80, 8080, 30080), ServicePort("u", "UDP", 53, 53, 30053),
             ServicePort("s", "SCTP", 3868, 3868, 30868))
    web = Service("probe", "web", "LoadBalancer", ("198.18.0.1", "fd00:96::1"), ("IPv4", "IPv6"), ports,
                  external_ips=("198.18.1.1",), load_balancer_source_ranges=("198.18.2.0/24", "2001:db8::/64"),
                  load_balancer_ingress=(LoadBalancerIngress("198.18.3.1"),), external_traffic_policy="Local",
                  session_affinity="ClientIP", affinity_timeout_seconds=60)
    empty = Service("probe", "empty", "ClusterIP", ("198.18.0.2",), ("IPv4",), (ServicePort("t", "TCP", 81, 81),))
    eports = tuple(EndpointPort(p.name, p.protocol, p.port) for p in ports)
    slices = tuple(EndpointSlice("probe", f"web-{f}", "web", f, tuple(Endpoint((a,), node_name=n) for a, n in eps),
                                 eports)
                   for f, eps in (("IPv4", (("10.0.0.1", "probe"), ("10.0.0.2", "other"))),
                                  ("IPv6", (("fd00:10::1", "probe"),))))
    config = NodeConfig("probe", node_ips=("198.18.4.1", "2001:db8::1"), cluster_cidrs=("10.0.0.0/8",),
                        service_cidrs=("198.18.0.0/24",), table_name=PROBE_TABLE, spelling=spelling)
    return Inventory((web, empty), slices), config


def _refusal(nft: Interface, cmds: list[str]) -> str | None:
    """nft's error (one line) when a check transaction of `cmds` is refused, else None.
    Crashed (nft could not read the namespace) is no answer about the constructs: raised."""
    tx = Transaction()
    for c in cmds:
        tx.raw(c)
    try:
        nft.check(tx)
        return None
    except Crashed:
        raise
    except NftError as e:
        return " ".join(e.text.split())


def kernel_refusals(nft: Interface, spelling: NftSpelling) -> list[str]:
    """What the kernel (and library) behind `nft` refuses of what nftrec writes: a sample
    ruleset (_sample) as the compiler renders it for `spelling`, in one check transaction.
    [] when it passes (the usual case: one transaction); else each refused command with
    nft's error, every rule checked alone after the sets and chains it needs."""
    from reconciler.compile import compile_ruleset, render_table

    out = []
    for table in compile_ruleset(*_sample(spelling)).tables.values():
        cmds = render_table(table)[2:]  # no add/delete: the probe table is not there
        whole = _refusal(nft, cmds)
        if whole is None:
            continue
        head = [c for c in cmds if not c.startswith(("add rule ", "add element "))]
        why = _refusal(nft, head)
        rules = [] if why is not None else [f"`{c}`: {w}" for c in cmds if c.startswith("add rule ")
                                             for w in [_refusal(nft, head + [c])] if w is not None]
        out += rules or [f"the {table.family} table: {why or whole}"]
    return out


def library_identity() -> str:
    """Which libnftables this process has loaded: its path, size and mtime as mapped (a
    package upgrade changes them); no context is made."""
    from reconciler.kernel.libnftables import _load_lib

    _load_lib()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(None, 5)[-1]
            if "/libnftables.so" in path:
                st = os.stat(path)
                return f"{path}:{st.st_size}:{int(st.st_mtime)}"
    return "libnftables"


class Spellings:
    """NftSpelling per (library, kernel release, namespace cookie): in this process, and in
    `path` (JSON, data only; a damaged file is ignored) when given. Without a cookie (kernel
    before 5.14) a namespace has no lasting identity: the answer is kept in this process
    only."""

    _memo: dict[str, NftSpelling] = {}

    def __init__(self, path: Path | None):
        self.path = path

    @staticmethod
    def key(cookie: int | None) -> str | None:
        if cookie is None:
            return None
        return f"{library_identity()}|{os.uname().release}|{cookie}"

    def get(self, nft: Interface) -> NftSpelling:
        """The remembered answer for `nft`'s namespace, else a probe through `nft`."""
        cookie = nft.netns_cookie()
        spelling = self.lookup(cookie)
        if spelling is None:
            spelling = probe_spelling(nft)
            self.remember(cookie, spelling)
        return spelling

    def lookup(self, cookie: int | None) -> NftSpelling | None:
        """The answer remembered for the namespace of `cookie` (no nft context needed)."""
        key = self.key(cookie)
        if key is None:
            return None
        if key not in self._memo:
            doc = self._read()
            if doc.get("key") != key:
                return None
            self._memo[key] = NftSpelling(**doc["spelling"])
        return self._memo[key]

    def remember(self, cookie: int | None, spelling: NftSpelling) -> None:
        key = self.key(cookie)
        if key is not None:
            self._memo[key] = spelling
            self._write({"format": 1, "key": key, "spelling": asdict(spelling)})

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            doc = json.loads(self.path.read_bytes())
            fields = set(asdict(NftSpelling()))
            if (isinstance(doc, dict) and doc.get("format") == 1 and isinstance(doc.get("spelling"), dict)
                    and set(doc["spelling"]) == fields and all(isinstance(v, bool) for v in doc["spelling"].values())):
                return doc
        except (OSError, ValueError):
            pass
        return {}

    def _write(self, doc: dict) -> None:
        from reconciler.atomic import atomic_write

        if self.path is None:
            return
        try:
            atomic_write(self.path, json.dumps(doc, sort_keys=True).encode(), 0o600, durable=False)
        except OSError as e:
            logs.log.debug(f"nft spelling not remembered ({e})")
