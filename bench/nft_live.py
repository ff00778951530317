"""Benchmark (not a test): load N Services x 5 endpoints into an EXISTING namespace, then
time list_table / parse / diff / fingerprint / generation() and a one-Service change.

    ip netns add bench && PYTHONPATH=. python bench/nft_live.py 10000 bench; ip netns del bench
"""
import time, sys, ipaddress
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__file__), '..', 'tests'))
from _nft_samples import *
from reconciler.intake.model import Inventory, NodeConfig
from reconciler.compile.services import compile_ruleset
from reconciler.compile.render import render_script
from reconciler.kernel.nft import Libnftables, Transaction
from reconciler.kernel.live import read_live, canonical, fingerprint, parse_table
from reconciler.engine.changes import diff, transaction_for

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
S, E = [], []
for i in range(N):
    cip = str(ipaddress.ip_address("172.30.0.0") + 10 + i)
    S.append(svc(f"ns{i%50}", f"svc{i}", cips=(cip,), ports=[sp(80, name="http")]))
    base = ipaddress.ip_address("10.128.0.0") + i * 8
    E.append(sl(f"ns{i%50}", f"svc{i}", [ep(str(base + k)) for k in range(5)], [epp(8080, name="http")]))
inv = Inventory(services=tuple(S), endpoint_slices=tuple(E))
cfg = NodeConfig(node_name="edge-7", node_ips=("192.168.0.2",), cluster_cidrs=("10.0.0.0/8",), service_cidrs=("172.30.0.0/16",))
t = time.perf_counter(); rs = compile_ruleset(inv, cfg); print(f"compile {time.perf_counter()-t:.2f}s")
script = render_script(rs)
print("script lines", script.count("\n"))
nft = Libnftables(sys.argv[2])
tx = Transaction()
for line in script.splitlines():
    if line: tx.raw(line)
t = time.perf_counter(); nft.run(tx); print(f"load (one tx) {time.perf_counter()-t:.2f}s")
for rep in range(2):
    t = time.perf_counter(); txt = nft.list_table("ip", "nftrec"); t1 = time.perf_counter()
    tbl = parse_table(txt, "ip"); t2 = time.perf_counter()
    print(f"list_table {t1-t:.3f}s ({len(txt)/1e6:.1f} MB), parse+canonicalise {t2-t1:.3f}s")
t = time.perf_counter(); live = read_live(nft, "nftrec"); t1 = time.perf_counter()
ch = diff(rs, live); t2 = time.perf_counter()
fp = fingerprint(live); t3 = time.perf_counter()
print(f"read_live both families {t1-t:.3f}s, diff {t2-t1:.3f}s (changes={len(ch)}), fingerprint {t3-t2:.3f}s")
t = time.perf_counter()
for _ in range(100): g = nft.generation()
print(f"generation() {(time.perf_counter()-t)/100*1e3:.3f} ms -> {g}")
# one-service change: drop an endpoint of svc5
E2 = list(E); e5 = E2[5]; E2[5] = sl(e5.namespace, e5.service_name, e5.endpoints[:4], e5.ports)
rs2 = compile_ruleset(Inventory(services=inv.services, endpoint_slices=tuple(E2)), cfg)
t = time.perf_counter(); ch = diff(rs2, live); tx = transaction_for(ch, rs2); t1 = time.perf_counter()
nft.run(tx); t2 = time.perf_counter()
print(f"one-service change: diff+tx {t1-t:.3f}s, run {t2-t1:.3f}s, ops={len(tx)} owners={ch.owners()}")
nft.close()
