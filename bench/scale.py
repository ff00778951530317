#!/usr/bin/env python3
"""nftrec scale benchmark: compile/render/load/change/list at N Services x M endpoints,
for kube-proxy's layout (nftrec's current one) and alternative dnat layouts.

Usage (root; every nft operation happens in a throwaway network namespace):

    python bench/scale.py                       # 10000 x 5, all layouts
    python bench/scale.py --quick               # 1000 x 5
    python bench/scale.py --services 5000 --endpoints 3 --layouts kp,offset
    python bench/scale.py --verify              # packet-level check of every layout
    python bench/scale.py --json out.json       # also write the raw numbers

Layouts (all keep kube-proxy's packet semantics: uniform random choice among the N
endpoints of a Service port, DNAT to ip:port; only the per-Service dnat rule differs):

  kp       kube-proxy's current layout, what nftrec compiles today:
           `dnat ip addr . port to numgen random mod N map { 0 : ip . port , ... }`
           (one anonymous map per Service port).
  offset   one shared named map `endpoint-dnat` (typeof numgen random mod 1 :
           ip daddr . tcp dport); each Service port owns an index range [K, K+cap):
           `dnat ip addr . port to numgen random mod N offset K map @endpoint-dnat`.
  sharded  like offset, but SHARDS maps `endpoint-dnat-NN`, a Service port's map chosen by
           a hash of its chain name; index ranges are allocated per map.
  named    one named map per Service port: `... numgen random mod N map @dnat-<chain>`.
  vmap     kube-proxy's classic layout: per-endpoint chains `endpoint-…` with
           `dnat to ip:port`, the Service chain `numgen random mod N vmap { 0 : goto … }`
           (anonymous vmap per Service port).
  cascade  no sets at all: N rules `numgen random mod (N-i) 0 dnat to ep_i`, the last
           one unconditional (iptables' statistic-mode cascade; uniform overall).

Structure: the orchestrator (this process, host netns) synthesises the Inventory,
compiles and renders it, derives the layouts' scripts, then for each layout creates a
fresh netns and re-executes itself inside it (`ip netns exec NS python scale.py
--worker …`), which loads, changes and lists with the nft binary and with libnftables
in-process (ctypes), and prints JSON. The netns is deleted in a `finally`.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import hashlib
import ipaddress
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from reconciler.compile import naming  # noqa: E402
from reconciler.compile.services import compile_ruleset  # noqa: E402
from reconciler.intake.model import (  # noqa: E402
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Inventory,
    NodeConfig,
    Service,
    ServicePort,
)
from reconciler.compile.render import render_script  # noqa: E402
from reconciler.compile.ruleset import Chain, NamedSet, Rule, Ruleset, Table  # noqa: E402

NFT = shutil.which("nft") or "/usr/sbin/nft"
TABLE = "nftrec"
NS_PREFIX = "nftrec-bench-"
LAYOUTS = ("kp", "offset", "sharded", "named", "vmap", "cascade")
SHARED_MAP = "endpoint-dnat"
SHARDS = 64  # sharded layout: number of endpoint-dnat-NN maps (--shards)

# ---------------------------------------------------------------------------------------
# synthetic inventory
# ---------------------------------------------------------------------------------------

SVC_NET = ipaddress.ip_network("172.30.0.0/16")
EP_NET = ipaddress.ip_network("10.128.0.0/9")
NODE_NAME = "bench-node"


def synth_inventory(n: int, m: int, *, ep_base: ipaddress.IPv4Address | None = None,
                    nodeport_every: int = 10) -> Inventory:
    """N ClusterIP Services (every `nodeport_every`-th a NodePort), one TCP port 80 →
    8080, one EndpointSlice each with M ready endpoints (unique IPs)."""
    if n > 60000 or n * m > EP_NET.num_addresses - 2:
        raise SystemExit("too many services/endpoints for the synthetic address plan")
    base = int(ep_base or EP_NET.network_address) + 1
    services, slices = [], []
    for i in range(n):
        ns, name = f"ns{i // 1000}", f"svc{i}"
        nodeport = nodeport_every and i % nodeport_every == 0 and i // nodeport_every < 2700
        services.append(Service(
            namespace=ns, name=name, type="NodePort" if nodeport else "ClusterIP",
            cluster_ips=(str(SVC_NET.network_address + 10 + i),), ip_families=("IPv4",),
            ports=(ServicePort("", "TCP", 80, 8080,
                               node_port=30000 + i // nodeport_every if nodeport else 0),),
        ))
        eps = tuple(Endpoint(addresses=(str(ipaddress.ip_address(base + i * m + j)),),
                             node_name=NODE_NAME if (j == 0 and i % 20 == 0) else "other")
                    for j in range(m))
        slices.append(EndpointSlice(namespace=ns, name=f"{name}-abcde", service_name=name,
                                    address_type="IPv4", endpoints=eps,
                                    ports=(EndpointPort("", "TCP", 8080),)))
    return Inventory(services=tuple(services), endpoint_slices=tuple(slices),
                     revision="bench")


def bench_config(node_ip: str = "192.168.99.2") -> NodeConfig:
    return NodeConfig(node_name=NODE_NAME, node_ips=(node_ip,),
                      cluster_cidrs=("10.128.0.0/9",), service_cidrs=(str(SVC_NET),),
                      table_name=TABLE, layout="kube-proxy")  # the layouts below rewrite kp's rules


# ---------------------------------------------------------------------------------------
# layouts: rewrite the compiled kp-layout Ruleset's per-Service dnat rules
# ---------------------------------------------------------------------------------------

DNAT_MAP_RE = re.compile(
    r"^meta l4proto (?P<proto>\w+) dnat (?P<fam>ip6?) addr \. port to "
    r"numgen random mod (?P<n>\d+) map \{ (?P<elems>.*) \}$")


def parse_dnat(body: str):
    """kp dnat rule → (proto, family, [(ip, port), ...]) or None."""
    mt = DNAT_MAP_RE.match(body)
    if not mt:
        return None
    eps = []
    for item in mt["elems"].split(" , "):
        idx, _, val = item.partition(" : ")
        ip, _, port = val.partition(" . ")
        assert int(idx) == len(eps), body
        eps.append((ip, int(port)))
    assert len(eps) == int(mt["n"])
    return mt["proto"], mt["fam"], eps


def capacity(n: int) -> int:
    """Index slots reserved per Service port in the shared map: next power of two."""
    c = 1
    while c < n:
        c <<= 1
    return c


def typeof_map(name: str, fam: str) -> NamedSet:
    # render.set_cmd writes "type <type> : <value>"; TYPEOF is rewritten in fix_typeof().
    return NamedSet(name, "TYPEOF numgen random mod 1", f"{fam} daddr . tcp dport")


def fix_typeof(script: str) -> str:
    return script.replace("{ type TYPEOF numgen", "{ typeof numgen")


@dataclasses.dataclass
class LayoutInfo:
    """What a layout did to each rewritten Service-port chain (for the change scripts)."""

    chains: dict[str, dict]  # chain name → {"proto","fam","eps","offset","cap","map"}
    next_offset: int = 0
    shard_next: dict[str, int] = dataclasses.field(default_factory=dict)


def ep_chain_name(svc_chain: str, ip: str, port: int) -> str:
    # service-HASH-ns/svc/proto/port → endpoint chain of kube-proxy's classic layout.
    base = svc_chain.split("-", 1)[1]  # HASH-ns/svc/proto/pname
    rest = base.split("-", 1)[1]  # ns/svc/proto/pname
    return naming.ENDPOINT_PREFIX + naming.hash_and_truncate(f"{rest}__{ip}/{port}")


def dnat_rules(layout: str, chain: str, info: dict) -> list[Rule]:
    """The rules of one Service-port chain in `layout` (eps: [(ip, port)])."""
    proto, fam, eps = info["proto"], info["fam"], info["eps"]
    n = len(eps)
    if layout == "kp":
        elems = " , ".join(f"{i} : {ip} . {p}" for i, (ip, p) in enumerate(eps))
        return [Rule(f"meta l4proto {proto} dnat {fam} addr . port to "
                     f"numgen random mod {n} map {{ {elems} }}")]
    if layout == "offset":
        off = f" offset {info['offset']}" if info["offset"] else ""
        return [Rule(f"meta l4proto {proto} dnat {fam} addr . port to "
                     f"numgen random mod {n}{off} map @{SHARED_MAP}")]
    if layout == "sharded":
        off = f" offset {info['offset']}" if info["offset"] else ""
        return [Rule(f"meta l4proto {proto} dnat {fam} addr . port to "
                     f"numgen random mod {n}{off} map @{info['map']}")]
    if layout == "named":
        return [Rule(f"meta l4proto {proto} dnat {fam} addr . port to "
                     f"numgen random mod {n} map @{info['map']}")]
    if layout == "vmap":
        vm = " , ".join(f"{i} : goto {ep_chain_name(chain, ip, p)}"
                        for i, (ip, p) in enumerate(eps))
        return [Rule(f"numgen random mod {n} vmap {{ {vm} }}")]
    if layout == "cascade":
        rules = [Rule(f"numgen random mod {n - i} 0 meta l4proto {proto} dnat to {ip}:{p}")
                 for i, (ip, p) in enumerate(eps[:-1])]
        ip, p = eps[-1]
        rules.append(Rule(f"meta l4proto {proto} dnat to {ip}:{p}"))
        return rules
    raise ValueError(layout)


def map_elements(layout: str, info: dict) -> list[str]:
    """Element texts `key : value` this chain owns in its named map (offset/named)."""
    if layout in ("offset", "sharded"):
        return [f"{info['offset'] + i} : {ip} . {p}" for i, (ip, p) in enumerate(info["eps"])]
    if layout == "named":
        return [f"{i} : {ip} . {p}" for i, (ip, p) in enumerate(info["eps"])]
    return []


def make_layout(rs: Ruleset, layout: str) -> tuple[Ruleset, LayoutInfo]:
    """Copy of `rs` with every multi-endpoint dnat-map rule rewritten for `layout`."""
    out = Ruleset(owners=dict(rs.owners))
    li = LayoutInfo(chains={})
    for fam, t in rs.tables.items():
        nt = Table(t.family, t.name, t.comment, chains={}, sets=dict(t.sets))
        shared = None
        extra_sets: dict[str, NamedSet] = {}
        extra_chains: dict[str, Chain] = {}
        for cname, c in t.chains.items():
            parsed = next((parse_dnat(r.body) for r in c.rules if parse_dnat(r.body)), None)
            if parsed is None or layout == "kp":
                nt.chains[cname] = c
                if parsed is not None:
                    li.chains[cname] = {"proto": parsed[0], "fam": parsed[1],
                                        "eps": parsed[2], "table_fam": fam}
                continue
            assert len(c.rules) == 1, (cname, c.rules)
            proto, pfam, eps = parsed
            info = {"proto": proto, "fam": pfam, "eps": eps, "table_fam": fam}
            if layout == "offset":
                if shared is None:
                    shared = typeof_map(SHARED_MAP, pfam)
                    shared.comment = "endpoint ip . port by per-Service index range"
                    extra_sets[SHARED_MAP] = shared
                info["offset"], info["cap"] = li.next_offset, capacity(len(eps))
                li.next_offset += info["cap"]
                for txt in map_elements(layout, info):
                    k, _, v = txt.partition(" : ")
                    shared.elements[(k,)] = _elem((k,), v)
            elif layout == "sharded":
                shard = int.from_bytes(hashlib.sha256(cname.encode()).digest()[:4], "big") % SHARDS
                mname = f"{SHARED_MAP}-{shard:02x}"
                if mname not in extra_sets:
                    extra_sets[mname] = typeof_map(mname, pfam)
                info["map"] = mname
                info["offset"], info["cap"] = li.shard_next.get(mname, 0), capacity(len(eps))
                li.shard_next[mname] = info["offset"] + info["cap"]
                for txt in map_elements(layout, info):
                    k, _, v = txt.partition(" : ")
                    extra_sets[mname].elements[(k,)] = _elem((k,), v)
            elif layout == "named":
                mname = "dnat-" + cname
                info["map"] = mname
                nm = typeof_map(mname, pfam)
                for txt in map_elements(layout, info):
                    k, _, v = txt.partition(" : ")
                    nm.elements[(k,)] = _elem((k,), v)
                extra_sets[mname] = nm
            elif layout == "vmap":
                for ip, p in eps:
                    ec = ep_chain_name(cname, ip, p)
                    extra_chains[ec] = Chain(ec, (Rule(f"meta l4proto {proto} dnat to {ip}:{p}"),))
            li.chains[cname] = info
            nt.chains[cname] = Chain(cname, tuple(dnat_rules(layout, cname, info)), c.base, c.comment)
        nt.sets.update(extra_sets)
        nt.chains.update(extra_chains)
        out.tables[fam] = nt
    return out, li


def _elem(key, value):
    from reconciler.compile.ruleset import Element
    return Element(key, value)


def render_layout(rs: Ruleset) -> str:
    return fix_typeof(render_script(rs))


def pick_chain(li: LayoutInfo) -> str:
    """A Service-port chain from the middle of the table (deterministic)."""
    names = sorted(n for n, i in li.chains.items() if i["table_fam"] == "ip")
    return names[len(names) // 2]


def change_scripts(layout: str, chain: str, info: dict, next_offset: int,
                   new_ip: str | None = None) -> tuple[str, str]:
    """(forward, back) nft scripts for "add one endpoint to this Service port" and its
    undo. Only the Service's own objects are touched."""
    fam = info["table_fam"]
    obj = f"{fam} {TABLE}"
    ip, p = info["eps"][-1]
    new_ep = (new_ip or str(ipaddress.ip_address(ip) + 0x100000), p)  # a fresh address
    grown = dict(info, eps=info["eps"] + [new_ep])
    fwd, back = [], []

    def chain_rewrite(inf, buf):
        buf.append(f"flush chain {obj} {chain}")
        buf.extend(f"add rule {obj} {chain} {r.text}" for r in dnat_rules(layout, chain, inf))

    if layout == "offset":
        n = len(info["eps"])
        if n + 1 > info["cap"]:  # relocate (never in the bench: cap is a power of two)
            grown["offset"] = next_offset
        idx = grown["offset"] + n
        fwd.append(f"add element {obj} {SHARED_MAP} {{ {idx} : {new_ep[0]} . {new_ep[1]} }}")
        chain_rewrite(grown, fwd)
        chain_rewrite(info, back)
        back.append(f"delete element {obj} {SHARED_MAP} {{ {idx} }}")
    elif layout == "sharded":
        n = len(info["eps"])
        assert n + 1 <= info["cap"]
        idx = info["offset"] + n
        fwd.append(f"add element {obj} {info['map']} {{ {idx} : {new_ep[0]} . {new_ep[1]} }}")
        chain_rewrite(grown, fwd)
        chain_rewrite(info, back)
        back.append(f"delete element {obj} {info['map']} {{ {idx} }}")
    elif layout == "named":
        n = len(info["eps"])
        fwd.append(f"add element {obj} {info['map']} {{ {n} : {new_ep[0]} . {new_ep[1]} }}")
        chain_rewrite(grown, fwd)
        chain_rewrite(info, back)
        back.append(f"delete element {obj} {info['map']} {{ {n} }}")
    elif layout == "vmap":
        ec = ep_chain_name(chain, *new_ep)
        fwd.append(f"add chain {obj} {ec}")
        fwd.append(f"add rule {obj} {ec} meta l4proto {info['proto']} dnat to {new_ep[0]}:{new_ep[1]}")
        chain_rewrite(grown, fwd)
        chain_rewrite(info, back)
        back.append(f"delete chain {obj} {ec}")
    else:  # kp, cascade: the chain's rules carry the endpoints
        chain_rewrite(grown, fwd)
        chain_rewrite(info, back)
    return "\n".join(fwd) + "\n", "\n".join(back) + "\n"


# single element in a shared map, the smallest possible change (same for every layout)
def element_scripts() -> tuple[str, str]:
    return (f"add element ip {TABLE} cluster-ips {{ 172.31.255.1 }}\n",
            f"delete element ip {TABLE} cluster-ips {{ 172.31.255.1 }}\n")


# ---------------------------------------------------------------------------------------
# netns helpers
# ---------------------------------------------------------------------------------------


class NetNS:
    """`ip netns add` on enter, `ip netns del` on exit (always)."""

    def __init__(self, tag: str):
        self.name = f"{NS_PREFIX}{tag}-{os.getpid()}"

    def __enter__(self):
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=30)
        return self

    def __exit__(self, *exc):
        subprocess.run(["ip", "netns", "del", self.name], timeout=60, check=False)

    def run(self, argv, **kw):
        kw.setdefault("timeout", 60)
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], **kw)


# ---------------------------------------------------------------------------------------
# worker: runs inside the netns
# ---------------------------------------------------------------------------------------


def timed_run(argv, timeout, stdin=None, stdout=subprocess.DEVNULL):
    """Run argv, return (wall, user, sys, rc, stderr) with the child's own CPU times."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    try:
        _, err = p.communicate()
        # communicate() reaps the child; its rusage arrives in RUSAGE_CHILDREN.
    finally:
        timer.cancel()
    wall = time.perf_counter() - t0
    return wall, p.returncode, err.decode(errors="replace")[-2000:]


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def nft_file(path: str, timeout: float) -> dict:
    u0, s0 = child_cpu()
    wall, rc, err = timed_run([NFT, "-f", path], timeout)
    u1, s1 = child_cpu()
    return {"wall": wall, "user": u1 - u0, "sys": s1 - s0, "rc": rc,
            "err": err.strip()[:500] if rc else ""}


class Libnft:
    """Minimal ctypes binding of libnftables (nft 1.0.6 ABI)."""

    def __init__(self):
        lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        self.lib = lib

    def ctx(self, flags: int = 0):
        c = self.lib.nft_ctx_new(0)
        self.lib.nft_ctx_buffer_output(c)
        self.lib.nft_ctx_buffer_error(c)
        if flags:
            self.lib.nft_ctx_output_set_flags(c, flags)
        return c

    def run(self, c, text: str) -> tuple[float, int, str]:
        t0 = time.perf_counter()
        rc = self.lib.nft_run_cmd_from_buffer(c, text.encode())
        dt = time.perf_counter() - t0
        err = self.lib.nft_ctx_get_error_buffer(c) if rc else b""
        return dt, rc, (err or b"").decode(errors="replace")[:500]

    def free(self, c):
        self.lib.nft_ctx_free(c)


def netlink_recv_bytes(script_path: str, timeout: float) -> dict:
    """Bytes/messages nft reads from the kernel for one script (strace on recvmsg)."""
    if not shutil.which("strace"):
        return {}
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as tf:
        timed_run(["strace", "-f", "-qq", "-e", "trace=recvmsg,recvfrom", "-e", "abbrev=all",
                   "-s", "0", "-o", tf.name, NFT, "-f", script_path], timeout)
        total = calls = 0
        for line in open(tf.name):
            mt = re.search(r"= (\d+)$", line.strip())
            if mt:
                total += int(mt.group(1))
                calls += 1
    return {"recv_bytes": total, "recv_calls": calls}


def worker(args) -> None:
    d = Path(args.dir)
    res: dict = {"layout": args.layout}
    # (b) cold load
    res["load"] = nft_file(str(d / "full.nft"), args.load_timeout)
    if res["load"]["rc"]:
        print(json.dumps(res))
        return
    reps = args.reps
    lib = Libnft()
    for op in ("element", "change"):
        fwd, back = str(d / f"{op}.fwd.nft"), str(d / f"{op}.back.nft")
        r: dict = {}
        # (c) nft binary
        times = []
        for _ in range(reps):
            a = nft_file(fwd, 30)
            b = nft_file(back, 30)
            if a["rc"] or b["rc"]:
                r["error"] = a["err"] or b["err"]
                break
            times.append(a["wall"])
        r["nft_bin"] = _stats(times)
        r["nft_bin_cpu"] = {"user": a["user"], "sys": a["sys"]}
        r.update(netlink_recv_bytes(fwd, 30))
        nft_file(back, 30)
        # (d) libnftables in-process: a fresh context per call, and one reused context
        ftxt, btxt = Path(fwd).read_text(), Path(back).read_text()
        fresh, reused, reused_back = [], [], []
        for _ in range(reps):
            c = lib.ctx()
            dt, rc, err = lib.run(c, ftxt)
            lib.free(c)
            c = lib.ctx()
            dt2, rc2, err2 = lib.run(c, btxt)
            lib.free(c)
            if rc or rc2:
                r["lib_error"] = err or err2
                break
            fresh.append(dt)
        c = lib.ctx()
        for _ in range(reps):
            dt, rc, err = lib.run(c, ftxt)
            dt2, rc2, err2 = lib.run(c, btxt)
            if rc or rc2:
                r["lib_error"] = err or err2
                break
            reused.append(dt)
            reused_back.append(dt2)
        lib.free(c)
        r["lib_fresh"] = _stats(fresh)
        r["lib_reused"] = _stats(reused)
        r["lib_reused_back"] = _stats(reused_back)
        res[op] = r
    # cache probes: which command kinds make nft dump the table? (binary, recv bytes)
    if args.probes:
        probes = {}
        pchain = (d / "probe_chain").read_text().strip()
        for name, text in {
            "flush chain": f"flush chain ip {TABLE} {pchain}\n",
            "add chain (empty)": f"add chain ip {TABLE} bench-probe\n",
            "delete element": f"delete element ip {TABLE} cluster-ips {{ 172.31.255.2 }}\n",
            "add rule": f"add rule ip {TABLE} bench-probe counter\n",
        }.items():
            pf = d / "probe.nft"
            if name == "delete element":
                nft_file_text(f"add element ip {TABLE} cluster-ips {{ 172.31.255.2 }}\n", d)
            pf.write_text(text)
            t = nft_file(str(pf), 30)
            probes[name] = {"wall": t["wall"], "rc": t["rc"], **netlink_recv_bytes_dry(text, d)}
        # restore the probed chain
        (d / "probe.nft").write_text((d / "probe_restore").read_text())
        nft_file(str(d / "probe.nft"), 30)
        res["probes"] = probes
    # (e) listing
    for key, argv in (("list", [NFT, "list", "table", "ip", TABLE]),
                      ("list_json", [NFT, "-j", "list", "table", "ip", TABLE])):
        u0, s0 = child_cpu()
        wall, rc, err = timed_run(argv, args.list_timeout)
        u1, s1 = child_cpu()
        res[key] = {"wall": wall, "user": u1 - u0, "sys": s1 - s0, "rc": rc}
    print(json.dumps(res))


def nft_file_text(text: str, d: Path) -> dict:
    p = d / "tmp.nft"
    p.write_text(text)
    return nft_file(str(p), 30)


def netlink_recv_bytes_dry(text: str, d: Path) -> dict:
    """recv bytes for a script, measured with `nft -c` (check only: no commit)."""
    p = d / "probe_dry.nft"
    p.write_text(text)
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as tf:
        timed_run(["strace", "-f", "-qq", "-e", "trace=recvmsg", "-e", "abbrev=all",
                   "-s", "0", "-o", tf.name, NFT, "-c", "-f", str(p)], 30)
        total = sum(int(m.group(1)) for line in open(tf.name)
                    if (m := re.search(r"= (\d+)$", line.strip())))
    return {"recv_bytes_check": total}


def _stats(xs):
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


# ---------------------------------------------------------------------------------------
# orchestrator
# ---------------------------------------------------------------------------------------


def prepare(rs: Ruleset, layout: str, d: Path) -> dict:
    t0 = time.perf_counter()
    lrs, li = make_layout(rs, layout)
    script = render_layout(lrs)
    t_render = time.perf_counter() - t0
    (d / "full.nft").write_text(script)
    chain = pick_chain(li)
    fwd, back = change_scripts(layout, chain, li.chains[chain], li.next_offset)
    (d / "change.fwd.nft").write_text(fwd)
    (d / "change.back.nft").write_text(back)
    ef, eb = element_scripts()
    (d / "element.fwd.nft").write_text(ef)
    (d / "element.back.nft").write_text(eb)
    (d / "probe_chain").write_text(chain)
    (d / "probe_restore").write_text(back)
    ip = lrs.tables["ip"]
    return {
        "layout_render_s": t_render,
        "script_bytes": len(script),
        "script_lines": script.count("\n"),
        "chains": len(ip.chains),
        "rules": sum(len(c.rules) for c in ip.chains.values()),
        "named_sets": len(ip.sets),
        "anon_sets": sum(r.body.count("{ 0 : ") for c in ip.chains.values() for r in c.rules),
        "elements": sum(len(s.elements) for s in ip.sets.values()),
        "change_chain": chain,
        "change_fwd": fwd,
    }


def run_layout(layout: str, d: Path, args) -> dict:
    with NetNS(layout) as ns:
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--layout", layout,
                "--shards", str(args.shards),
                "--dir", str(d), "--reps", str(args.reps),
                "--load-timeout", str(args.load_timeout), "--list-timeout", str(args.list_timeout)]
        if args.probes:
            argv.append("--probes")
        try:
            p = ns.run(argv, timeout=args.load_timeout + 4 * args.list_timeout + 120,
                       capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"layout": layout, "error": "worker timed out"}
        if p.returncode:
            return {"layout": layout, "error": p.stderr[-2000:]}
        return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(x, unit="s"):
    if x is None:
        return "-"
    if unit == "ms":
        return f"{x * 1000:.1f}"
    return f"{x:.2f}"


def main_bench(args) -> int:
    n, m = (1000, 5) if args.quick else (args.services, args.endpoints)
    layouts = [lay.strip() for lay in args.layouts.split(",") if lay.strip()]
    for lay in layouts:
        if lay not in LAYOUTS:
            raise SystemExit(f"unknown layout {lay!r}; known: {', '.join(LAYOUTS)}")
    t0 = time.perf_counter()
    inv = synth_inventory(n, m)
    t_synth = time.perf_counter() - t0
    t0 = time.perf_counter()
    rs = compile_ruleset(inv, bench_config())
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    render_script(rs)
    t_render = time.perf_counter() - t0
    print(f"# nftrec scale bench: {n} Services x {m} endpoints "
          f"(nft {subprocess.run([NFT, '--version'], capture_output=True, text=True).stdout.split()[1]}, "
          f"kernel {os.uname().release}, {os.cpu_count()} CPUs)")
    print(f"synthesise {t_synth:.2f} s   compile {t_compile:.2f} s   render {t_render:.2f} s")
    results = {"services": n, "endpoints": m, "synth_s": t_synth, "compile_s": t_compile,
               "render_s": t_render, "layouts": {}}
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-bench-"))
    try:
        for lay in layouts:
            d = tmp / lay
            d.mkdir()
            meta = prepare(rs, lay, d)
            t0 = time.perf_counter()
            r = run_layout(lay, d, args)
            r["meta"] = meta
            r["total_s"] = time.perf_counter() - t0
            results["layouts"][lay] = r
            _print_layout(lay, r, results["layouts"].get("kp"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    _print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _print_layout(lay, r, kp):
    if "error" in r:
        print(f"[{lay}] ERROR: {r['error']}")
        return
    ld = r["load"]
    print(f"[{lay}] load {ld['wall']:.2f} s (user {ld['user']:.2f} sys {ld['sys']:.2f}) "
          f"rc={ld['rc']} {ld.get('err', '')}  ({r['total_s']:.0f} s in all)", flush=True)


def _print_table(results):
    kp = results["layouts"].get("kp", {}).get("load", {}).get("wall")
    hdr = ("| layout | chains | rules | named sets | anon sets | elements | cold load s "
           "(user/sys) | vs kp | 1-svc change: nft bin ms | libnft fresh ms | libnft reused ms "
           "| recv KiB | 1-element: nft bin ms | libnft fresh ms | list s | list -j s |")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for lay, r in results["layouts"].items():
        meta = r.get("meta", {})
        if "error" in r or r.get("load", {}).get("rc"):
            err = r.get("error") or r["load"].get("err")
            print(f"| {lay} | {meta.get('chains')} | ERROR {err[:200]!r} |")
            continue
        ld, ch, el = r["load"], r["change"], r["element"]
        ratio = f"{ld['wall'] / kp:.2f}" if kp else "-"

        def med(x):
            return fmt(x["median"], "ms") if x else "-"
        print(f"| {lay} | {meta['chains']} | {meta['rules']} | {meta['named_sets']} | "
              f"{meta['anon_sets']} | {meta['elements']} | {ld['wall']:.2f} "
              f"({ld['user']:.2f}/{ld['sys']:.2f}) | {ratio} | {med(ch['nft_bin'])} | "
              f"{med(ch['lib_fresh'])} | {med(ch['lib_reused'])} | "
              f"{ch.get('recv_bytes', 0) / 1024:.0f} | {med(el['nft_bin'])} | "
              f"{med(el['lib_fresh'])} | {r['list']['wall']:.2f} | {r['list_json']['wall']:.2f} |")
    for lay, r in results["layouts"].items():
        if "probes" in r:
            print(f"\n[{lay}] cache probes (nft binary; recv bytes measured with nft -c):")
            for name, p in r["probes"].items():
                print(f"  {name:20s} {p['wall'] * 1000:8.1f} ms  rc={p['rc']}  "
                      f"recv {p.get('recv_bytes_check', 0) / 1024:.0f} KiB")


# ---------------------------------------------------------------------------------------
# packet-semantics verification
# ---------------------------------------------------------------------------------------

VERIFY_SERVICES, VERIFY_EPS = 4, 5
CLIENT_IP, NODE_IP_C, NODE_IP_B, BACKEND_IP = "10.99.1.2", "10.99.1.1", "10.99.2.1", "10.99.2.2"
VERIFY_EP_BASE = ipaddress.ip_address("10.200.0.0")  # inside 10.128.0.0/9


def _sh(ns: NetNS, cmd: str):
    ns.run(["sh", "-c", cmd], check=True, timeout=20)


SERVER = r"""
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(128)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.getsockname()[0].encode() + b"\n"); c.close()
"""

CLIENT = r"""
import socket, sys, json
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = []
for _ in range(n):
    try:
        c = socket.create_connection((ip, port), timeout=2)
        out.append(c.recv(64).decode().strip()); c.close()
    except ConnectionRefusedError:
        out.append("REFUSED")
    except OSError as e:
        import errno
        out.append("TIMEOUT" if isinstance(e, TimeoutError) or "timed out" in str(e)
                   else errno.errorcode.get(e.errno, type(e).__name__))
print(json.dumps(out))
"""


def verify_layout(layout: str, tries: int) -> dict:
    inv = synth_inventory(VERIFY_SERVICES, VERIFY_EPS, ep_base=VERIFY_EP_BASE, nodeport_every=2)
    rs = compile_ruleset(inv, bench_config(node_ip=NODE_IP_C))
    lrs, li = make_layout(rs, layout)
    script = render_layout(lrs)
    tag = f"v{layout[:3]}"
    out: dict = {"layout": layout}
    with NetNS(tag + "c") as cl, NetNS(tag + "n") as node, NetNS(tag + "b") as be, \
            tempfile.TemporaryDirectory(prefix="nftrec-verify-") as td:
        a, b = f"nb{os.getpid() % 10000}{layout[:2]}a", f"nb{os.getpid() % 10000}{layout[:2]}b"
        subprocess.run(["ip", "link", "add", a, "netns", cl.name, "type", "veth", "peer",
                        "name", a + "p", "netns", node.name], check=True, timeout=20)
        subprocess.run(["ip", "link", "add", b, "netns", be.name, "type", "veth", "peer",
                        "name", b + "p", "netns", node.name], check=True, timeout=20)
        _sh(cl, f"ip link set lo up; ip link set {a} up; ip addr add {CLIENT_IP}/24 dev {a}; "
                f"ip route add default via {NODE_IP_C}")
        _sh(node, f"ip link set lo up; ip link set {a}p up; ip link set {b}p up; "
                  f"ip addr add {NODE_IP_C}/24 dev {a}p; ip addr add {NODE_IP_B}/24 dev {b}p; "
                  f"ip route add 10.128.0.0/9 via {BACKEND_IP}; ip route add default via {BACKEND_IP}; sysctl -qw net.ipv4.ip_forward=1")
        eps = [str(VERIFY_EP_BASE + 1 + i) for i in range(VERIFY_SERVICES * VERIFY_EPS)]
        _sh(be, f"ip link set lo up; ip link set {b} up; ip addr add {BACKEND_IP}/24 dev {b}; "
                f"ip route add default via {NODE_IP_B}; "
                + "; ".join(f"ip addr add {e}/32 dev lo" for e in eps))
        sf = Path(td) / "rules.nft"
        sf.write_text(script)
        r = node.run([NFT, "-f", str(sf)], capture_output=True, text=True, timeout=30)
        if r.returncode:
            return {**out, "error": r.stderr[-500:]}
        (Path(td) / "server.py").write_text(SERVER)
        (Path(td) / "client.py").write_text(CLIENT)
        srv = subprocess.Popen(["ip", "netns", "exec", be.name, sys.executable,
                                str(Path(td) / "server.py")], stdout=subprocess.PIPE)
        try:
            srv.stdout.readline()
            checks = {}
            svc = inv.services[1]  # ClusterIP; svc0 is a NodePort (nodeport_every=2)
            own = {str(VERIFY_EP_BASE + 1 + 1 * VERIFY_EPS + j) for j in range(VERIFY_EPS)}
            np_svc = inv.services[0]
            np_own = {str(VERIFY_EP_BASE + 1 + j) for j in range(VERIFY_EPS)}
            for what, ip, port, want in (
                    ("clusterip", svc.cluster_ips[0], 80, own),
                    ("nodeport", NODE_IP_C, np_svc.ports[0].node_port, np_own)):
                c = cl.run([sys.executable, str(Path(td) / "client.py"), ip, str(port),
                            str(tries)], capture_output=True, text=True, timeout=tries * 3 + 10)
                got = json.loads(c.stdout)
                counts = {k: got.count(k) for k in sorted(set(got))}
                checks[what] = {"counts": counts, "all_reached": set(got) == want,
                                "none_outside": set(got) <= want}
            # a bad port on a valid ClusterIP → reject; an unallocated ClusterIP → drop
            c = cl.run([sys.executable, str(Path(td) / "client.py"), svc.cluster_ips[0], "81",
                        "1"], capture_output=True, text=True, timeout=20)
            checks["bad_port"] = json.loads(c.stdout)
            c = cl.run([sys.executable, str(Path(td) / "client.py"), "172.30.200.1", "80", "1"],
                       capture_output=True, text=True, timeout=20)
            checks["unallocated"] = json.loads(c.stdout)
            # the one-Service change applied live, then the Service must reach 6 endpoints
            chain = next(cn for cn in sorted(li.chains) if li.chains[cn]["eps"][0][0] in own)
            info = li.chains[chain]
            extra = str(VERIFY_EP_BASE + 200)  # a real backend address, new to the Service
            _sh(be, f"ip addr add {extra}/32 dev lo")
            fwd, _ = change_scripts(layout, chain, info, li.next_offset, new_ip=extra)
            (Path(td) / "fwd.nft").write_text(fwd)
            r = node.run([NFT, "-f", str(Path(td) / "fwd.nft")], capture_output=True, text=True)
            checks["change_rc"] = r.returncode if not r.returncode else r.stderr[-300:]
            c = cl.run([sys.executable, str(Path(td) / "client.py"), svc.cluster_ips[0], "80",
                        str(tries + 10)], capture_output=True, text=True, timeout=tries * 3 + 40)
            got = json.loads(c.stdout)
            checks["after_change"] = {"counts": {k: got.count(k) for k in sorted(set(got))},
                                      "all_reached": set(got) == own | {extra},
                                      "none_outside": set(got) <= own | {extra}}
            out["checks"] = checks
            out["ok"] = (all(checks[k]["all_reached"] and checks[k]["none_outside"]
                             for k in ("clusterip", "nodeport", "after_change"))
                         and checks["bad_port"] == ["REFUSED"]
                         and checks["unallocated"] == ["TIMEOUT"] and checks["change_rc"] == 0)
        finally:
            srv.kill()
            srv.wait(timeout=10)
    return out


def main_verify(args) -> int:
    layouts = [lay.strip() for lay in args.layouts.split(",") if lay.strip()]
    ok = True
    for lay in layouts:
        r = verify_layout(lay, args.tries)
        ok &= bool(r.get("ok"))
        print(json.dumps(r))
    print("verify:", "all layouts OK" if ok else "FAILURES")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1000 x 5")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shards", type=int, default=64, help="maps of the sharded layout (default 64)")
    ap.add_argument("--probes", action="store_true", help="per-command cache probes")
    ap.add_argument("--load-timeout", type=float, default=120)
    ap.add_argument("--list-timeout", type=float, default=60)
    ap.add_argument("--json", help="write raw results here")
    ap.add_argument("--verify", action="store_true", help="packet-level semantics check")
    ap.add_argument("--tries", type=int, default=30)
    ap.add_argument("--emit", help="write the rendered script of --layouts (first) to this file")
    # internal
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--layout", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    globals()["SHARDS"] = args.shards
    if args.worker:
        worker(args)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    if args.emit:
        n, m = (1000, 5) if args.quick else (args.services, args.endpoints)
        rs = compile_ruleset(synth_inventory(n, m), bench_config())
        Path(args.emit).write_text(render_layout(make_layout(rs, args.layouts.split(",")[0])[0]))
        return 0
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # run finally blocks
    if args.verify:
        return main_verify(args)
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
