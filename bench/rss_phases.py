#!/usr/bin/env python3
"""Where one `nftrec apply` peaks: its phases' peak RSS, in-process.

    .venv/bin/python bench/rss_phases.py . -- --state-dir S apply DIR --config C --netns NS
    .venv/bin/python bench/rss_phases.py /tmp/base --trace -- ...   # + tracemalloc before the commit

CODE is a checkout holding reconciler/. Around the commit, the verification, the state
write and the conntrack cleanup, prints VmHWM since the previous mark (reset through
/proc/self/clear_refs) and VmRSS now, on stderr. /usr/bin/time's maximum of this process
is then the last phase's only (clear_refs resets it too). --trace: the 30 biggest
allocation sites (tracemalloc, one frame) just before the commit; slow (~2x) and
inflates RSS, so its RSS figures are not the command's.
"""
import sys, os, time
code = sys.argv[1]; trace = "--trace" in sys.argv
args = sys.argv[sys.argv.index("--") + 1:]
sys.path.insert(0, code)
def vm():
    d = {}
    for l in open("/proc/self/status"):
        k, _, v = l.partition(":")
        if k in ("VmRSS", "VmHWM"):
            d[k] = int(v.split()[0]) // 1024
    return d
def reset():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
T0 = time.time()
def mark(what):
    d = vm()
    print(f"[probe {time.time()-T0:6.1f}s] {what}: peak since last {d['VmHWM']} MB, now {d['VmRSS']} MB", file=sys.stderr, flush=True)
    reset()
if trace:
    import tracemalloc; tracemalloc.start(1)
import reconciler.engine.apply as A
import reconciler.engine.sync as S
import reconciler.engine.state as ST
def wrap(mod, name, label, snap=False):
    f = getattr(mod, name)
    def g(*a, **k):
        mark(f"before {label}")
        if snap and trace:
            s = tracemalloc.take_snapshot()
            for st in s.statistics("lineno")[:30]:
                print("   ", st, file=sys.stderr)
            print("    total", sum(x.size for x in s.traces) >> 20, "MB", file=sys.stderr)
        try:
            return f(*a, **k)
        finally:
            mark(f"{label}")
    setattr(mod, name, g)
wrap(A, "commit", "commit", snap=True)
wrap(A, "verify_listed", "verify_listed")
wrap(A, "verify_touched", "verify_touched")
wrap(ST.StateStore, "record_applied", "record_applied")
wrap(A, "clean_udp_conntrack", "conntrack")
reset()
from reconciler.cli import main
sys.argv = ["nftrec"] + args
try:
    main()
finally:
    mark("end")
