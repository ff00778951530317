"""Data-plane topology (used by conftest.py): real packets between throwaway network namespaces.

One topology per test module (module-scoped fixture `topo`); tests only swap the
nftrec ruleset inside the node namespace (`topo.load(inventory, config)`). Nothing here
touches the host: every veth pair is created with both ends already inside our
namespaces, and every namespace and process is removed in teardown, even on failure.

                  clientA  198.51.100.2/25    fd00:a::2/64      (external, allowed)
                     |
                  n-ca 198.51.100.1/25 fd00:a::1/64  <- the node IP (NodePort address)
    clientB --- n-cb 198.51.100.129/25 fd00:b::1/64     clientB 198.51.100.130, fd00:b::2
    pod     --- n-pod 10.244.9.1/24 fd00:244:9::1/64    pod 10.244.9.2, fd00:244:9::2
                  |                                      (a source inside clusterCIDRs)
                  node (ip_forward=1, rp_filter=0, runs the nftrec tables)
                  |
                  n-be 10.244.1.1/24 fd00:244:1::1/64
                  |
                  backend: endpoints 10.244.1.10/.11/.12, fd00:244:1::10/::11/::12,
                           echo servers on TCP+UDP ports 8080 and 9090;
                           also the node's default gateway 10.244.1.254 / fd00:244:1::254
                           ("upstream"), which answers any packet still addressed to the
                           service CIDRs 10.96.0.0/16 / fd00:96::/112 or to the LB /
                           external IP ranges 203.0.113.0/24 / fd00:cafe::/64 (i.e. not
                           DNATed by the node) with ICMP admin-prohibited — so a missing node
                           rule shows up as "unreachable", distinct from both a reject
                           ("refused") and a drop ("timeout").

ClusterIPs live in 10.96.0.0/16 and fd00:96::/112, LoadBalancer IPs and externalIPs in
203.0.113.0/24 and fd00:cafe::/64; clients route everything via the node. Node name: node-a; nodeIPs
198.51.100.1 and fd00:a::1; clusterCIDRs 10.244.0.0/16 and fd00:244::/32.

TCP connects use IP_RECVERR (see probe.py): on veth pairs an ICMP error can arrive while
connect() still holds the socket lock, and would otherwise only surface after a SYN
retransmit; ICMP rate limiting is off in the node and backend namespaces.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


HERE = Path(__file__).resolve().parent
SERVER = HERE / "echo_server.py"
PROBE = HERE / "probe.py"

NODE_NAME = "node-a"
NODE_IP4, NODE_IP6 = "198.51.100.1", "fd00:a::1"
CLIENT_A4, CLIENT_A6 = "198.51.100.2", "fd00:a::2"
CLIENT_B4, CLIENT_B6 = "198.51.100.130", "fd00:b::2"
POD4, POD6 = "10.244.9.2", "fd00:244:9::2"
NODE_BE4, NODE_BE6 = "10.244.1.1", "fd00:244:1::1"  # node's address toward the backends
EP4 = ("10.244.1.10", "10.244.1.11", "10.244.1.12")
EP6 = ("fd00:244:1::10", "fd00:244:1::11", "fd00:244:1::12")
UPSTREAM4, UPSTREAM6 = "10.244.1.254", "fd00:244:1::254"
SERVER_PORTS = (8080, 9090)
NODE_LISTEN_PORT = 30090  # a local echo server on the node listens here
SERVICE_CIDR4, SERVICE_CIDR6 = "10.96.0.0/16", "fd00:96::/112"
EXTERNAL_RANGE4 = "203.0.113.0/24"  # LoadBalancer IPs and externalIPs
EXTERNAL_RANGE6 = "fd00:cafe::/64"
CLUSTER_CIDR4, CLUSTER_CIDR6 = "10.244.0.0/16", "fd00:244::/32"

CMD_TIMEOUT = 30  # seconds; no helper command may hang a run


def run(*args: str, check: bool = True, input: str | None = None,
        timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}: "
                             f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def nsx(ns: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return run("ip", "netns", "exec", ns, *args, **kw)


@dataclass(frozen=True)
class Reply:
    """One answer of the echo server: who answered, and whom it saw as the peer."""

    server_ip: str
    server_port: int
    peer_ip: str
    peer_port: int

    @classmethod
    def parse(cls, line: str) -> "Reply":
        local, peer = line.split()
        lip, lport = local.rsplit(":", 1)
        pip, pport = peer.rsplit(":", 1)
        return cls(lip, int(lport), pip, int(pport))


@dataclass
class Result:
    reply: Reply | None
    error: str | None  # refused | unreachable | timeout | reset | other:N

    def __repr__(self) -> str:
        return f"<{self.reply.server_ip}:{self.reply.server_port} saw {self.reply.peer_ip}>" \
            if self.reply else f"<{self.error}>"


@dataclass(frozen=True)
class Flow:
    """One conntrack entry: original and reply direction tuples."""

    proto: str
    orig_src: str
    orig_dst: str
    orig_dport: int
    reply_src: str  # the endpoint after DNAT
    reply_dst: str  # the address the endpoint answers to (the node's when masqueraded)
    reply_sport: int

    @classmethod
    def parse(cls, line: str) -> "Flow":
        fields: dict[str, list[str]] = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields.setdefault(k, []).append(v)
        return cls(line.split()[0], fields["src"][0], fields["dst"][0], int(fields["dport"][0]),
                   fields["src"][1], fields["dst"][1], int(fields["sport"][1]))


def nsx_args(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *args]


def _result(item: dict) -> Result:
    return Result(Reply.parse(item["reply"]), None) if "reply" in item else Result(None, item["error"])


class UdpSession:
    """probe.py --session as a child process (see Topology.udp_session)."""

    def __init__(self, args: list[str], timeout: float, traced_send=None):
        self.timeout = timeout
        self.traced_send = traced_send  # Topology's trace check around a fresh NAT decision
        self.fresh = traced_send is not None
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        first = self._line(10)
        self.local_ip, port = json.loads(first)["local"].rsplit(":", 1)
        self.local_port = int(port)

    def _line(self, budget: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], budget)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise AssertionError(f"UDP session client said nothing: {self.proc.stderr.read()}")
        return line

    def send(self, n: int = 1) -> list[Result]:
        if self.fresh:
            self.fresh = False
            return self.traced_send(lambda: self._send(n))
        return self._send(n)

    def expect_fresh(self) -> None:
        """The next datagram is a fresh NAT decision (the test deleted the socket's
        conntrack entry): trace it against the ruleset in force then."""
        self.fresh = self.traced_send is not None

    def _send(self, n: int) -> list[Result]:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return [_result(item) for item in json.loads(self._line(n * (self.timeout + 0.5) + 10))]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> "UdpSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Topology:
    prefix: str
    ns: dict[str, str]  # role -> namespace name
    servers: list[subprocess.Popen] = field(default_factory=list)
    last_script: str = ""
    # trace checks (trace_check.py): the Ruleset `load` compiled; `hand_loaded` after
    # `load_script` (not nftrec's output: not traced). Neither: the live table is traced.
    loaded_ruleset: object = None
    hand_loaded: bool = False
    trace_checks: int = 0  # probes compared with a trace (the module can tell it ran)
    _spelling: object = None  # spelling(), once probed

    @property
    def node(self) -> str:
        return self.ns["node"]

    # --- traffic ----------------------------------------------------------------------

    def probe(self, role: str, dst: str, port: int, *, proto: str = "tcp", count: int = 1,
              timeout: float = 1.0, src: str | None = None) -> list[Result]:
        """`count` fresh connections (TCP) / datagram exchanges (UDP) from namespace `role`."""
        args = [sys.executable, str(PROBE), "--proto", proto, "--dst", dst,
                "--port", str(port), "--count", str(count), "--timeout", str(timeout)]
        if src:
            args += ["--src", src]
        budget = count * (timeout + 0.5) + 10
        return self.traced(role, dst, port, proto,
                           lambda: [_result(item) for item in json.loads(nsx(self.ns[role], *args, timeout=budget).stdout)],
                           src=src)

    def traced(self, role: str, dst: str, port: int, proto: str, send, *, src: str | None = None) -> list[Result]:
        """`send()` (fresh NAT decisions from namespace `role`, as a list of Result), checked
        against nftrec's trace of the ruleset in force when it started (trace_check.py)."""
        before = self._traceable()
        results = send()
        self._check_trace(before, role, dst, port, proto, src, results)
        return results

    def _traceable(self):
        """(ruleset, kind) the next probe is traced against, or None."""
        if self.hand_loaded:
            return None
        if self.loaded_ruleset is not None:
            return self.loaded_ruleset, "desired"
        live = self._read_live()
        return (live, "live") if live is not None else None

    def _read_live(self):
        """nftrec's tables in the node namespace, read as `nftrec trace --live` reads them.
        One retry: an older release's libnftnl in the matrix's chroot, on the host's newer
        kernel, now and then exits on a table dump ("nf_tables kernel ABI is broken");
        nftrec reports that (Crashed) and lives, and so does the oracle, once."""
        from reconciler.kernel import Crashed, Libnftables, read_live

        for attempt in (1, 2):
            nft = Libnftables(self.node)
            try:
                rs = read_live(nft, "nftrec")
                break
            except Crashed:
                if attempt == 2:
                    raise
            finally:
                nft.close()
        return rs if rs.tables else None

    def node_addresses(self) -> set[str]:
        data = json.loads(nsx(self.node, "ip", "-j", "addr", "show").stdout)
        return {a["local"] for link in data for a in link.get("addr_info", [])}

    def _check_trace(self, before, role, dst, port, proto, src, results) -> None:
        """Trace the probe with nftrec's evaluator; fail when the wire disagrees."""
        import ipaddress

        from reconciler.engine.trace import trace_packet
        from reconciler.engine.tracereport import Packet, format_text
        from reconciler.kernel.live import fingerprint
        from trace_check import mismatches

        if before is None:
            return
        ruleset, kind = before
        if kind == "live":
            after = self._read_live()
            if after is None or fingerprint(after) != fingerprint(ruleset):
                return  # watch changed the ruleset during the probe: no single prediction
        fam6 = ":" in dst
        if role == "node":
            route = json.loads(nsx(self.node, "ip", "-j", "route", "get", dst).stdout)[0]
            src, origin = route.get("prefsrc", dst), "node"
        elif src is None:
            src = {"clientA": (CLIENT_A4, CLIENT_A6), "clientB": (CLIENT_B4, CLIENT_B6),
                   "pod": (POD4, POD6)}.get(role, (None, None))[fam6]
            if src is None:
                return  # the kernel picks the source: nothing exact to predict
            origin = "pod" if role == "pod" else "external"
        else:
            cidr = CLUSTER_CIDR6 if fam6 else CLUSTER_CIDR4
            origin = "pod" if ipaddress.ip_address(src) in ipaddress.ip_network(cidr) else "external"
        tr = trace_packet(ruleset, Packet(src, dst, port, proto, origin), self.node_addresses(),
                          ruleset_kind=kind)
        bad = mismatches(tr, results, src)
        self.trace_checks += 1
        if bad:
            raise AssertionError(f"nftrec trace disagrees with the wire for {proto} {src} -> {dst}:{port} "
                                 f"from {role}:\n  " + "\n  ".join(bad) + "\n--- trace ---\n" + format_text(tr))

    def probe_one(self, role: str, dst: str, port: int, **kw) -> Result:
        return self.probe(role, dst, port, count=1, **kw)[0]

    def udp_session(self, role: str, dst: str, port: int, timeout: float = 1.0) -> "UdpSession":
        """A UDP client in namespace `role` that keeps one socket (one source port) open:
        `send(n)` makes n exchanges on it. Close it (a context manager).
        Its first datagram is a fresh NAT decision, traced like a probe (the rest follow
        its conntrack entry, whatever the ruleset says by then); `expect_fresh()` marks the
        next one as fresh again (after the test deleted the socket's conntrack entry)."""
        def traced_send(send) -> list[Result]:
            before = self._traceable()  # the ruleset in force before the datagram leaves
            results = send()
            self._check_trace(before, role, dst, port, "udp", None, results[:1])
            return results

        return UdpSession(nsx_args(self.ns[role], sys.executable, str(PROBE), "--proto", "udp",
                                   "--dst", dst, "--port", str(port), "--timeout", str(timeout),
                                   "--session"), timeout, traced_send)

    # --- ruleset ----------------------------------------------------------------------

    def load_script(self, script: str, tables: tuple[str, ...] = (), *,
                    flush_conntrack: bool = True) -> None:
        """Run `script` with `nft -f` in the node namespace (after deleting `tables`, for
        hand-written scripts that do not replace their tables themselves); reset
        conntrack so that every test starts with fresh NAT decisions (unless
        `flush_conntrack=False`: a reload that keeps the existing flows)."""
        self.last_script = script
        self.hand_loaded, self.loaded_ruleset = True, None
        for table in tables:
            for family in ("ip", "ip6"):
                nsx(self.node, "nft", "delete", "table", family, table, check=False)
        proc = nsx(self.node, "nft", "-f", "-", input=script, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"nft -f of the rendered script failed in the node namespace:"
                                 f"\n{proc.stderr}\n--- script ---\n{script}")
        if flush_conntrack:
            self.flush_conntrack()

    def spelling(self):
        """The spellings the node namespace's nft accepts, probed as nftrec probes them
        (kernel/features.py): what `load` compiles with unless told otherwise."""
        if self._spelling is None:
            from reconciler.kernel import Libnftables, probe_spelling

            with Libnftables(self.node) as nft:
                self._spelling = probe_spelling(nft)
        return self._spelling

    def load(self, inventory, config, *, flush_conntrack: bool = True, spelling=None) -> str:
        """Compile + render with nftrec's own API, load it into the node namespace.
        `spelling` (an NftSpelling): force one; None: what this nft accepts (`spelling()`)."""
        from dataclasses import replace

        from reconciler.compile.services import compile_ruleset
        from reconciler.compile.render import render_script

        config = replace(config, spelling=spelling if spelling is not None else self.spelling())
        ruleset = compile_ruleset(inventory, config)
        script = render_script(ruleset)
        # no delete first: the rendered script itself replaces nftrec's tables, atomically
        self.load_script(script, flush_conntrack=flush_conntrack)
        self.hand_loaded, self.loaded_ruleset = False, ruleset  # traced by every probe
        return script

    def flush_conntrack(self) -> None:
        for family in ("ipv4", "ipv6"):
            if nsx(self.node, "conntrack", "-F", "-f", family, check=False).returncode != 0:
                # conntrack-tools before 1.4.7 (Debian 11) takes no family with -F, and
                # flushes the whole table
                nsx(self.node, "conntrack", "-F")
                return

    def conntrack(self, *filters: str, family: str = "ipv4") -> list[Flow]:
        """`conntrack -L` entries in the node namespace (the second witness).

        Several probes may share one entry: a client can reuse a source port, and then
        the new packets belong to the existing flow; so count distinct properties of
        the entries, not entries per probe."""
        proc = nsx(self.node, "conntrack", "-L", "-f", family, *filters, check=False)
        return [Flow.parse(ln) for ln in proc.stdout.splitlines() if "src=" in ln]

    def nft_list(self, family: str = "ip", table: str = "nftrec") -> str:
        return nsx(self.node, "nft", "list", "table", family, table).stdout


# --- building the topology ------------------------------------------------------------


def _veth(topo_ns: dict[str, str], a: str, a_if: str, b: str, b_if: str) -> None:
    """A veth pair born inside namespace `a` with its peer born inside `b`."""
    run("ip", "-n", topo_ns[a], "link", "add", a_if, "type", "veth",
        "peer", "name", b_if, "netns", topo_ns[b])
    for ns, ifname in ((a, a_if), (b, b_if)):
        run("ip", "-n", topo_ns[ns], "link", "set", ifname, "up")


def _addr(ns: str, ifname: str, *cidrs: str) -> None:
    for cidr in cidrs:
        extra = ("nodad",) if ":" in cidr else ()
        run("ip", "-n", ns, "addr", "add", cidr, "dev", ifname, *extra)


def _sysctl(ns: str, **values: str) -> None:
    for key, value in values.items():
        nsx(ns, "sysctl", "-qw", f"{key.replace('__', '.')}={value}")


SINK_RULESET = f"""
table inet dp-upstream {{
    chain prerouting {{
        type filter hook prerouting priority 0;
        ip daddr {{ {SERVICE_CIDR4}, {EXTERNAL_RANGE4} }} reject with icmp type admin-prohibited
        ip6 daddr {{ {SERVICE_CIDR6}, {EXTERNAL_RANGE6} }} reject with icmpv6 type admin-prohibited
    }}
}}
"""


def build(ns: dict[str, str]) -> None:
    for name in ns.values():
        run("ip", "netns", "add", name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        # no duplicate address detection anywhere (link-local addresses included), so
        # IPv6 works the moment a link is up
        _sysctl(name, net__ipv6__conf__all__accept_dad="0",
                net__ipv6__conf__default__accept_dad="0")

    _veth(ns, "node", "n-ca", "clientA", "ca0")
    _veth(ns, "node", "n-cb", "clientB", "cb0")
    _veth(ns, "node", "n-pod", "pod", "pod0")
    _veth(ns, "node", "n-be", "backend", "be0")

    node = ns["node"]
    _addr(node, "n-ca", f"{NODE_IP4}/25", f"{NODE_IP6}/64")
    _addr(node, "n-cb", "198.51.100.129/25", "fd00:b::1/64")
    _addr(node, "n-pod", "10.244.9.1/24", "fd00:244:9::1/64")
    _addr(node, "n-be", f"{NODE_BE4}/24", f"{NODE_BE6}/64")
    _addr(ns["clientA"], "ca0", f"{CLIENT_A4}/25", f"{CLIENT_A6}/64")
    _addr(ns["clientB"], "cb0", f"{CLIENT_B4}/25", f"{CLIENT_B6}/64")
    _addr(ns["pod"], "pod0", f"{POD4}/24", f"{POD6}/64")
    _addr(ns["backend"], "be0", *(f"{ip}/24" for ip in EP4 + (UPSTREAM4,)),
          *(f"{ip}/64" for ip in EP6 + (UPSTREAM6,)))

    for role, gw4, gw6 in (("clientA", NODE_IP4, NODE_IP6),
                           ("clientB", "198.51.100.129", "fd00:b::1"),
                           ("pod", "10.244.9.1", "fd00:244:9::1"),
                           ("backend", NODE_BE4, NODE_BE6),
                           ("node", UPSTREAM4, UPSTREAM6)):
        run("ip", "-n", ns[role], "route", "add", "default", "via", gw4)
        run("ip", "-n", ns[role], "-6", "route", "add", "default", "via", gw6)

    _sysctl(node, net__ipv4__ip_forward="1", net__ipv6__conf__all__forwarding="1",
            net__ipv4__conf__all__rp_filter="0", net__ipv4__conf__default__rp_filter="0",
            net__ipv4__icmp_ratelimit="0", net__ipv6__icmp__ratelimit="0")
    for ifname in ("n-ca", "n-cb", "n-pod", "n-be"):
        nsx(node, "sysctl", "-qw", f"net.ipv4.conf.{ifname}.rp_filter=0")
    _sysctl(ns["backend"], net__ipv4__icmp_ratelimit="0", net__ipv6__icmp__ratelimit="0")
    nsx(ns["backend"], "nft", "-f", "-", input=SINK_RULESET)


def start_server(ns: str, binds: tuple[str, ...],
                 ports: tuple[int, ...] = SERVER_PORTS) -> subprocess.Popen:
    """An echo server in `ns` on every (bind, port), TCP and UDP; returns once listening."""
    args = ["ip", "netns", "exec", ns, sys.executable, str(SERVER)]
    for ip in binds:
        args += ["--bind", ip]
    for port in ports:
        args += ["--port", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "READY":
        proc.kill()
        _, err = proc.communicate(timeout=5)
        raise AssertionError(f"echo server in {ns} did not start: {line!r} {err}")
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)


def teardown(ns: dict[str, str], servers: list[subprocess.Popen]) -> None:
    for proc in servers:
        _stop(proc)
    for name in ns.values():
        # any stray process still inside the namespace was started by us: end it by pid
        pids = run("ip", "netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        run("ip", "netns", "del", name, check=False)


def kernel_ready() -> str | None:
    if os.geteuid() != 0:
        return "data-plane tests need root (CI runs as root)"
    for tool in ("ip", "nft", "conntrack"):
        if shutil.which(tool) is None:
            return f"{tool} not found: install iproute2, nftables and conntrack"
    return None



def start_servers(ns: dict[str, str]) -> list[subprocess.Popen]:
    """The backend's echo server on every endpoint address, plus a process on the node
    itself owning NODE_LISTEN_PORT on the node IPs (to show that a NodePort without
    endpoints is rejected before it reaches a local socket)."""
    return [start_server(ns["backend"], EP4 + EP6),
            start_server(ns["node"], (NODE_IP4, NODE_IP6), (NODE_LISTEN_PORT,))]
