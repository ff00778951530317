#!/usr/bin/env python3
"""The target table: nftrec's real commands against two baselines measured in the same run,
one table per size (bench/README.md describes each figure's procedure).

    sudo .venv/bin/python bench/targets.py --quick                  # 1,000 Services x 5
    sudo .venv/bin/python bench/targets.py --sizes 1000,10000 --json out.json

P is the parse floor (PyYAML's libyaml loader over every manifest, a fresh process), K
kube-proxy's layout through `nft -f` into an empty namespace. Then, per size, nftrec's
commands as subprocesses in fresh namespaces and state dirs: cold `validate` and `apply`,
no-op `plan` and `plan --refresh`, one-edit `apply`, and `watch` on a git-sync layout.
Every figure is printed with its ratio to P and K, its target and met/missed. Needs root;
namespaces `nftrec-bench-<what>-<pid>` are deleted in a `finally`, also on SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
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
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from mix import (  # noqa: E402
    EP_NET, NODE_CONFIG, SVC_NET, counts, edit_service, ep_ips, fresh_ip, generate, write_slice_file,
)

NS_PREFIX = "nftrec-bench-"
NFT = shutil.which("nft") or "/usr/sbin/nft"
GNU_TIME = "/usr/bin/time"
T0 = time.perf_counter()
PROBE_SVC = 5             # --latency: the ClusterIP Service probed (no affinity)
SMALL = 100               # --latency: the small node's Service count
DEBOUNCE = 0.2            # the watch's --debounce (its default), subtracted from the latency
IDLE_WAIT = 10.0          # seconds without edits before the watch's idle RSS is read
INSTALL_HINT = "PyYAML is missing: pip install -e '.[bench]'  (the parse floor P uses its libyaml loader)"
K_CONFIG = NODE_CONFIG + "layout: kube-proxy\n"
K_HOW = "`nftrec render` with `layout: kube-proxy`"


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def nftrec_bin() -> str:
    cand = Path(sys.executable).with_name("nftrec")
    return str(cand) if cand.exists() else (shutil.which("nftrec") or "nftrec")


# ---------------------------------------------------------------------------------------
# subprocesses and namespaces
# ---------------------------------------------------------------------------------------

class Timeout(Exception):
    pass


def run(argv, timeout: float, *, rss: bool = False, stdout=subprocess.PIPE, env=None) -> dict:
    """Run argv: wall, child user/sys CPU, rc, output; peak RSS (KiB) when rss=True."""
    argv = [str(a) for a in argv]
    rssfile = None
    if rss and os.access(GNU_TIME, os.X_OK):
        fd, rssfile = tempfile.mkstemp(prefix="nftrec-bench-time-")
        os.close(fd)
        argv = [GNU_TIME, "-v", "-o", rssfile, *argv]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise Timeout(f"{' '.join(argv[:8])}… timed out after {timeout:.0f} s") from e
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"wall": wall, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
           "rc": p.returncode,
           "stdout": p.stdout.decode(errors="replace") if isinstance(p.stdout, bytes) else "",
           "stderr": p.stderr.decode(errors="replace")[-3000:]}
    if rss:
        if rssfile is not None:
            txt = Path(rssfile).read_text()
            os.unlink(rssfile)
            mt = re.search(r"Maximum resident set size \(kbytes\): (\d+)", txt)
            out["rss_mb"] = int(mt.group(1)) * 1024 / 1e6 if mt else None
        else:  # max over every child reaped so far: an upper bound
            out["rss_mb"] = r1.ru_maxrss * 1024 / 1e6
    return out


def check(res: dict, what: str, ok=(0,)) -> dict:
    if res["rc"] not in ok:
        raise RuntimeError(f"{what}: exit {res['rc']}\n{res['stderr'][-1500:]}\n{res['stdout'][-1500:]}")
    return res


class Namespaces:
    """Every namespace this run creates; all deleted by cleanup() (in a finally)."""

    def __init__(self):
        self.names: list[str] = []

    def add(self, tag: str) -> str:
        name = f"{NS_PREFIX}{tag}-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
        self.names.append(name)
        return name

    def delete(self, name: str) -> None:
        if name in self.names:
            subprocess.run(["ip", "netns", "del", name], timeout=120, check=False)
            self.names.remove(name)

    def cleanup(self) -> None:
        for name in list(reversed(self.names)):
            self.delete(name)


class Ctx:
    """One size's inputs: manifest dir, configs, temp dir, namespaces, options."""

    def __init__(self, args, nss: Namespaces, tmp: Path, n: int, m: int):
        self.args, self.nss, self.tmp, self.n, self.m = args, nss, tmp, n, m
        self.to = args.timeout * max(1.0, n / 10000)   # per subprocess, scaled with the size
        self.reps = args.reps if n <= 10000 else 1      # P and K: median of this many runs
        self.root = tmp / "m"
        self.cfg = tmp / "node.yaml"
        self.kp_cfg = tmp / "node-kp.yaml"

    def nftrec(self, state: Path, *a, ns=None, rss=False, ok=(0,), what=None) -> dict:
        argv = [nftrec_bin(), "--state-dir", state, *a]
        if ns:
            argv += ["--netns", ns]
        return check(run(argv, self.to, rss=rss), what or " ".join(map(str, a[:2])), ok)


# ---------------------------------------------------------------------------------------
# baselines
# ---------------------------------------------------------------------------------------

PARSE = r"""
import sys, time, pathlib, yaml
t = time.perf_counter()
docs = 0
for p in sorted(pathlib.Path(sys.argv[1]).rglob("*.yaml")):
    with open(p, "rb") as f:
        docs += sum(1 for _ in yaml.load_all(f, Loader=yaml.CSafeLoader))
print(docs, time.perf_counter() - t)
"""


def measure_parse_floor(c: Ctx) -> dict:
    """P: PyYAML's libyaml loader reads every manifest once, in a fresh process (the
    median of --reps such processes: P divides every ratio, so it is the one figure
    taken more than once)."""
    runs = []
    for _ in range(c.reps):
        r = check(run([sys.executable, "-c", PARSE, c.root], c.to), "parse floor")
        docs, inproc = r["stdout"].split()
        runs.append({"wall": r["wall"], "in_process": float(inproc), "documents": int(docs)})
    out = dict(sorted(runs, key=lambda x: x["wall"])[len(runs) // 2])
    out["walls"] = [x["wall"] for x in runs]
    return out


def nft_load(c: Ctx, script: Path, tag: str) -> dict:
    """`nft -f script` into an empty, fresh namespace (deleted right after)."""
    ns = c.nss.add(tag)
    try:
        return check(run(["ip", "netns", "exec", ns, NFT, "-f", script], c.to, rss=True), f"nft -f ({tag})")
    finally:
        c.nss.delete(ns)


def measure_kube_proxy(c: Ctx, state: Path) -> dict:
    """K: kube-proxy's current layout for the same Services, through `nft -f`."""
    r = c.nftrec(state, "render", c.root, "--config", c.kp_cfg, what="render (K)")
    script = c.tmp / "kube-proxy.nft"
    script.write_text(r["stdout"])
    runs = [nft_load(c, script, "kp") for _ in range(c.reps)]  # median of --reps loads, like P
    out = dict(sorted(runs, key=lambda x: x["wall"])[len(runs) // 2])
    out["walls"] = [x["wall"] for x in runs]
    out["render_s"] = r["wall"]
    out["lines"] = r["stdout"].count("\n")
    return out


# ---------------------------------------------------------------------------------------
# nftrec one-shot commands
# ---------------------------------------------------------------------------------------

def measure_oneshot(c: Ctx) -> dict:
    """Cold apply (empty cache and kernel), no-op plan, plan --refresh, one-edit apply."""
    R: dict = {}
    state = c.tmp / "state-oneshot"
    ns = c.nss.add("apply")
    try:
        # the intake alone (read, schema, checks, model) with an empty cache;
        # `validate` touches no kernel, and its own state dir leaves the apply's cache empty
        R["intake_cold"] = c.nftrec(c.tmp / "state-validate", "validate", c.root, "--config", c.cfg,
                                    what="cold validate")
        log(f"  cold intake (validate, empty cache) {R['intake_cold']['wall']:.2f} s")
        R["apply_cold"] = c.nftrec(state, "apply", c.root, "--config", c.cfg, ns=ns, rss=True, what="cold apply")
        log(f"  cold apply {R['apply_cold']['wall']:.2f} s, {R['apply_cold']['rss_mb']:.0f} MB")
        R["plan"] = c.nftrec(state, "plan", c.root, "--config", c.cfg, "--detailed-exitcode", ns=ns, rss=True,
                             ok=(0, 2), what="plan")
        log(f"  no-op plan {R['plan']['wall']:.2f} s (exit {R['plan']['rc']})")
        R["plan_refresh"] = c.nftrec(state, "plan", c.root, "--config", c.cfg, "--detailed-exitcode",
                                     "--refresh", ns=ns, rss=True, ok=(0, 2), what="plan --refresh")
        log(f"  no-op plan --refresh {R['plan_refresh']['wall']:.2f} s (exit {R['plan_refresh']['rc']})")
        k = edit_service(c.n)
        ips = ep_ips(k, c.m)
        ips[0] = fresh_ip(c.n, c.m, 0)
        write_slice_file(c.root, k, c.n, c.m, {k: ips})
        R["apply_edit"] = c.nftrec(state, "apply", c.root, "--config", c.cfg, ns=ns, rss=True,
                                   what="one-edit apply")
        mt = re.search(r"Apply complete: (\d+) operations", R["apply_edit"]["stdout"])
        R["apply_edit"]["operations"] = int(mt.group(1)) if mt else None
        log(f"  one-edit apply {R['apply_edit']['wall']:.2f} s, {R['apply_edit']['operations']} operations")
        write_slice_file(c.root, k, c.n, c.m)  # back to the generated manifests
        if c.args.latency:
            log(f"  first-packet latency: {SMALL} vs {c.n} Services, {c.args.rounds} interleaved rounds")
            R["latency"] = measure_latency(c, ns)
    finally:
        c.nss.delete(ns)
    for v in R.values():
        v.pop("stdout", None)
    return R


def sh(ns: str, cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", cmd], check=True, timeout=60)


def median(xs):
    return statistics.median(xs) if xs else None



# ---------------------------------------------------------------------------------------
# first-packet latency (--latency): 100-Service node vs N-Service node
# ---------------------------------------------------------------------------------------

SERVER = r"""
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(4096)
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.close()
"""

CLIENT = r"""
import socket, sys, json, time
ip, port, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out, errors = [], 0
for i in range(warm + n):
    s = socket.socket(); s.settimeout(2)
    t0 = time.perf_counter_ns()
    try:
        s.connect((ip, port))
        if i >= warm:
            out.append((time.perf_counter_ns() - t0) / 1000)
    except OSError:
        errors += 1
    s.close()
print(json.dumps({"us": out, "errors": errors}))
"""


def topology(nss: Namespaces, node: str, tag: str, td: Path, m: int) -> dict:
    """client ns → `node` (holds the ruleset) → backend ns with the probe Service's
    endpoint addresses on lo and a TCP server on :8080. Returns the client ns + server."""
    cl, be = nss.add(f"{tag}c"), nss.add(f"{tag}b")
    a, b = f"nb{os.getpid() % 100000}{tag}a", f"nb{os.getpid() % 100000}{tag}b"
    subprocess.run(["ip", "link", "add", a, "netns", cl, "type", "veth", "peer", "name",
                    a + "p", "netns", node], check=True, timeout=30)
    subprocess.run(["ip", "link", "add", b, "netns", be, "type", "veth", "peer", "name",
                    b + "p", "netns", node], check=True, timeout=30)
    sh(cl, f"ip link set lo up; ip link set {a} up; ip addr add 10.99.1.2/24 dev {a}; "
           f"ip route add default via 10.99.1.1")
    sh(node, f"ip link set lo up; ip link set {a}p up; ip link set {b}p up; "
             f"ip addr add 10.99.1.1/24 dev {a}p; ip addr add 10.99.2.1/24 dev {b}p; "
             f"ip route add {EP_NET} via 10.99.2.2; sysctl -qw net.ipv4.ip_forward=1")
    sh(be, f"ip link set lo up; ip link set {b} up; ip addr add 10.99.2.2/24 dev {b}; "
           f"ip route add default via 10.99.2.1; "
           + "; ".join(f"ip addr add {ip}/32 dev lo" for ip in ep_ips(PROBE_SVC, m)))
    srv = subprocess.Popen(["ip", "netns", "exec", be, sys.executable,
                            str(td / "server.py")],
                           stdout=subprocess.PIPE)
    if srv.stdout.readline().strip() != b"ready":
        raise RuntimeError("latency server did not start")
    return {"client": cl, "server": srv}


def connects(client_ns: str, td: Path, n: int, warm: int = 2) -> dict:
    ip = str(ipaddress.ip_address(int(SVC_NET.network_address) + 10 + PROBE_SVC))
    p = subprocess.run(["ip", "netns", "exec", client_ns, sys.executable,
                        str(td / "client.py"),
                        ip, "80", str(n), str(warm)], capture_output=True, text=True, timeout=n * 2 + 30)
    if p.returncode:
        raise RuntimeError(f"latency client failed: {p.stderr[-500:]}")
    return json.loads(p.stdout)


def latency(nss: Namespaces, big_node: str, small_node: str, td: Path, m: int,
            total: int, rounds: int) -> dict:
    (td / "server.py").write_text(SERVER)
    (td / "client.py").write_text(CLIENT)
    tops = {}
    try:
        tops["small"] = topology(nss, small_node, "ls", td, m)
        tops["big"] = topology(nss, big_node, "lb", td, m)
        for t in tops.values():  # warm-up: ARP, routes, caches; discarded
            connects(t["client"], td, 20)
        per = max(1, total // rounds)
        res = {k: {"us": [], "round_medians": [], "errors": 0} for k in tops}
        for r in range(rounds):  # interleaved so that machine noise hits both sizes alike
            for k in (("small", "big") if r % 2 == 0 else ("big", "small")):
                c = connects(tops[k]["client"], td, per)
                res[k]["us"] += c["us"]
                res[k]["errors"] += c["errors"]
                if c["us"]:
                    res[k]["round_medians"].append(median(c["us"]))
        for v in res.values():
            us = sorted(v["us"])
            v["mean_round_median_us"] = statistics.fmean(v["round_medians"])
            v["n"] = len(us)
            v["median_us"] = median(us)
            v["p10_us"] = us[len(us) // 10] if us else None
            v["p90_us"] = us[len(us) * 9 // 10] if us else None
            del v["us"]
        return res
    finally:
        for t in tops.values():
            t["server"].kill()
            t["server"].wait(timeout=10)


def lat_noise(s: dict, b: dict) -> float:
    """Two standard errors of the difference of the mean round medians (each round is a
    fresh client process; rounds alternate between the sizes, so slow phases of the
    machine hit both); at least 5 % of the small size's median. Per-process latency is
    bimodal here (~25 or ~40 µs for a whole process, whatever the ruleset), so rounds,
    not single connects, are the independent samples."""
    def se(x):
        rm = x["round_medians"]
        return statistics.stdev(rm) / len(rm) ** 0.5 if len(rm) > 1 else 0.0
    return max(2 * (se(s) ** 2 + se(b) ** 2) ** 0.5, 0.05 * s["median_us"])




def measure_latency(c: Ctx, big_ns: str) -> dict:
    """TCP connect() to one ClusterIP through the N-Service node (`big_ns`, nftrec's
    one-shot namespace) and through a node with only the first 100 of the same Services."""
    small = c.tmp / "m-small"
    generate(small, SMALL, c.m)
    small_ns = c.nss.add("small")
    try:
        c.nftrec(c.tmp / "state-small", "apply", small, "--config", c.cfg, ns=small_ns, what="apply (100 Services)")
        return latency(c.nss, big_ns, small_ns, c.tmp, c.m, c.args.connects, c.args.rounds)
    finally:
        for tag in ("lsc", "lsb", "lbc", "lbb"):
            c.nss.delete(f"{NS_PREFIX}{tag}-{os.getpid()}")
        c.nss.delete(small_ns)


# ---------------------------------------------------------------------------------------
# nftrec watch on a git-sync layout
# ---------------------------------------------------------------------------------------

class Monitor:
    """`nft monitor` in a namespace; records when a line first mentions the awaited address."""

    def __init__(self, ns: str):
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, NFT, "monitor"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.lock = threading.Lock()
        self.pattern: re.Pattern | None = None
        self.seen: float | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.lock:
                if self.pattern is not None and self.seen is None and self.pattern.search(line):
                    self.seen = time.monotonic()

    def expect(self, ip: str) -> None:
        with self.lock:
            self.pattern, self.seen = re.compile(re.escape(ip) + r"(?![0-9])"), None

    def wait(self, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.seen is not None:
                    return self.seen
            time.sleep(0.002)
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def vm_kb(pid: int, key: str) -> int | None:
    try:
        mt = re.search(rf"^{key}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(mt.group(1)) if mt else None


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost", GIT_COMMITTER_NAME="bench",
               GIT_COMMITTER_EMAIL="bench@localhost", GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def new_revision(src: Path, gs: Path, r: int) -> Path:
    """git-sync's new worktree for the commit just made in `src`: a linked `git worktree`
    of the one repository, named after the commit (git-sync v4: `<root>/.worktrees/<sha>`),
    a fresh checkout of every file."""
    if r >= 0:
        git(src, "commit", "-q", "-a", "-m", f"revision {r + 1}")
    sha = git(src, "rev-parse", "HEAD")
    d = gs / ".worktrees" / sha
    git(src, "worktree", "add", "-q", "--detach", str(d), sha)
    return d


def drop_revision(src: Path, old: Path) -> None:
    """git-sync removes the old worktree once the link points at the new one."""
    git(src, "worktree", "remove", "--force", str(old))


def swap(gs: Path, target: Path) -> float:
    """git-sync's atomic symlink swap (`ln -s` + `mv -T`); the time of the swap."""
    tmp_link = gs / "tmp-link"
    tmp_link.symlink_to(target.relative_to(gs))
    t = time.monotonic()
    os.replace(tmp_link, gs / "current")
    return t


def measure_watch(c: Ctx) -> dict:
    """First full sync, then one endpoint moved per revision: swap → kernel, minus debounce."""
    sys.path.insert(0, str(REPO / "tests"))
    from watchproc import Watch  # the daemon driver tests/test_watch.py uses

    gs = c.tmp / "gitsync"
    gs.mkdir()
    src = c.tmp / "src"  # the repository git-sync fetches (here: where each revision is committed)
    shutil.copytree(c.root, src)
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "revision 0")
    rev = new_revision(src, gs, -1)
    (gs / "current").symlink_to(rev.relative_to(gs))
    ns = c.nss.add("watch")
    mon = Monitor(ns)
    w = None
    R: dict = {"edits": [], "warmup": c.args.warmup}
    try:
        t0 = time.monotonic()
        w = Watch(ns, gs / "current", c.cfg, c.tmp / "state-watch", "--debounce", str(DEBOUNCE), metrics=False)
        first = w.wait_event("sync", 0, timeout=c.to * 3, kind="full")
        R["first_sync_s"] = time.monotonic() - t0
        R["first_sync_ms"] = first.get("durationMs")
        R["rss_after_first_mb"] = (vm_kb(w.proc.pid, "VmRSS") or 0) * 1024 / 1e6
        log(f"  watch first full sync {R['first_sync_s']:.2f} s (sync log {first.get('durationMs')} ms)")
        moved: dict[int, list[str]] = {}
        total = c.args.warmup + c.args.edits
        for r in range(total):
            k = (c.n // 3 + 7919 * r) % c.n               # a different Service each time
            ips = moved.get(k) or ep_ips(k, c.m)
            ips = list(ips)
            ips[r % c.m] = new_ip = fresh_ip(c.n, c.m, 100 + r)
            moved[k] = ips
            prev = rev
            write_slice_file(src, k, c.n, c.m, moved)
            rev = new_revision(src, gs, r)
            mark = len(w.lines)
            mon.expect(new_ip)
            t_swap = swap(gs, rev)
            seen = mon.wait(c.to)
            if seen is None:
                raise RuntimeError(f"watch edit {r}: {new_ip} never reached the kernel")
            s = w.wait_event("sync", mark, timeout=c.to, revision=rev.name)
            drop_revision(src, prev)
            e = {"ms": 1000 * (seen - t_swap - DEBOUNCE), "kernelMs": s.get("kernelMs"),
                 "durationMs": s.get("durationMs"), "kind": s.get("kind"), "operations": s.get("operations")}
            R["edits"].append(e)
            log(f"  watch edit {r}{' (warm-up)' if r < c.args.warmup else ''}: {e['ms']:.0f} ms after the "
                f"debounce (sync: kernel after {e['kernelMs']} ms, {e['durationMs']} ms, {e['kind']})")
            time.sleep(0.05)
        xs = [e["ms"] for e in R["edits"][c.args.warmup:]]
        R["p50_ms"], R["p95_ms"], R["n"] = percentile(xs, 50), percentile(xs, 95), len(xs)
        ks = [e["kernelMs"] for e in R["edits"][c.args.warmup:] if e["kernelMs"] is not None]
        R["kernelMs_p50"] = percentile(ks, 50) if ks else None
        R["rss_mb"] = (vm_kb(w.proc.pid, "VmRSS") or 0) * 1024 / 1e6
        R["peak_rss_mb"] = (vm_kb(w.proc.pid, "VmHWM") or 0) * 1024 / 1e6
        # and once idle: the state writer records the last revision after the daemon was
        # quiet for as long as a write takes (seconds at 10k), then frees it
        time.sleep(IDLE_WAIT)
        R["rss_idle_mb"] = (vm_kb(w.proc.pid, "VmRSS") or 0) * 1024 / 1e6
    finally:
        if w is not None:
            w.stop()
        mon.stop()
        c.nss.delete(ns)
    return R


# ---------------------------------------------------------------------------------------
# one size
# ---------------------------------------------------------------------------------------

def bench_size(args, nss: Namespaces, n: int) -> dict:
    m = args.endpoints
    tmp = Path(tempfile.mkdtemp(prefix=f"nftrec-targets-{n}-"))
    try:
        c = Ctx(args, nss, tmp, n, m)
        log(f"=== {n} Services x {m} endpoints: writing manifests")
        generate(c.root, n, m)
        c.cfg.write_text(NODE_CONFIG)
        c.kp_cfg.write_text(K_CONFIG)
        files = sorted(c.root.rglob("*.yaml"))
        R: dict = {"services": n, "endpoints": m, "files": len(files), "mix": counts(n), "k_how": K_HOW,
                   "bytes": sum(p.stat().st_size for p in files)}
        log("P: PyYAML CSafeLoader, fresh process")
        R["P"] = measure_parse_floor(c)
        log(f"  {R['P']['wall']:.2f} s ({R['P']['documents']} documents, {R['P']['in_process']:.2f} s in process)")
        if not args.watch_only and n <= args.k_up_to:
            log(f"K: {K_HOW} → nft -f, fresh namespace")
            R["K"] = measure_kube_proxy(c, tmp / "state-render")
            log(f"  {R['K']['wall']:.2f} s ({R['K']['lines']} lines)")
        if not args.watch_only:
            log("nftrec one-shot commands, fresh namespace and state dir")
            R.update(measure_oneshot(c))
        if not args.no_watch:
            log("nftrec watch, git-sync layout, fresh namespace and state dir")
            R["watch"] = measure_watch(c)
        return R
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------

# metric → size → (baseline, factor): the targets ("x": × the 10k cold apply)
TARGETS = {
    "intake_cold": {10000: ("s", 2.5)},  # an absolute figure, not a ratio
    "apply_cold": {1000: ("P", 2), 10000: ("K", 0.5)},
    "plan": {1000: ("P", 0.5), 10000: ("P", 0.1)},
    "plan_refresh": {10000: ("P", 1)},
    "apply_edit": {1000: ("P", 1), 10000: ("P", 0.3)},
    "watch_p95": {1000: ("P", 0.05), 10000: ("P", 0.03)},
    "watch_rss": {10000: ("MB", 300)},
    "oneshot_rss": {10000: ("MB", 250)},
    "linearity": {30000: ("x", 3.5)},
}


def facts() -> str:
    def out(*a):
        try:
            return subprocess.run(a, capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"
    load = os.getloadavg()[0]
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}, commit {out('git', 'rev-parse', '--short', 'HEAD')}"
            f"{' (dirty)' if out('git', 'status', '--porcelain', '--untracked-files=no') else ''}, "
            f"nproc {os.cpu_count()}, load {load:.1f}, kernel {os.uname().release}, {out(NFT, '--version')}")


def table(R: dict, results: dict[int, dict]) -> str:
    n = R["services"]
    P, K = R["P"]["wall"], R["K"]["wall"] if "K" in R else None  # no K: --watch-only, --k-up-to
    rows = []

    def row(metric, key, value, unit="s", note=""):
        """value in seconds (unit s/ms) or MB; ratios for times; target + met from TARGETS."""
        if value is None:
            rows.append((metric, "n/a " + note, "", "", target_text(key), "-"))
            return
        secs = value / 1000 if unit == "ms" else value
        shown = (f"{value:.0f} ms" if unit == "ms" else f"{value:.2f} s" if unit == "s" else f"{value:.0f} MB")
        rp = f"{secs / P:.3f}" if unit != "MB" else ""
        rk = f"{secs / K:.3f}" if unit != "MB" and K else ""
        t = TARGETS.get(key, {}).get(n)
        met = ""
        if t and t[0] == "K" and not K:
            met = "n/a (no K in this run)"
        elif t:
            base, fac = t
            limit = {"P": P * fac, "K": K * fac if K else 0, "MB": fac, "s": fac}[base]
            # the limit is in seconds (P, K) or MB: compare `secs`, not a figure in ms
            met = "met" if (value if base == "MB" else secs) <= limit else "**missed**"
        rows.append((metric, shown + (f" {note}" if note else ""), rp, rk, target_text(key, n), met))

    def target_text(key, n=n):
        t = TARGETS.get(key, {}).get(n)
        if not t:
            return ""
        base, fac = t
        return (f"<= {fac} MB" if base == "MB" else f"<= {fac}x the 10k figure" if base == "x"
                else f"<= {fac} s" if base == "s" else f"<= {fac} {base}")

    row("P: PyYAML CSafeLoader, all manifests, fresh process", "", P,
        note=f"({R['P']['documents']} docs; {R['P']['in_process']:.2f} s in process; median of "
             f"{', '.join(f'{x:.2f}' for x in R['P']['walls'])})")
    if K is not None:
        row("K: kube-proxy layout via `nft -f`, empty netns", "", K,
            note=f"(user {R['K']['user']:.2f} / sys {R['K']['sys']:.2f}; {R['K']['lines']} lines; median of "
                 f"{', '.join(f'{x:.2f}' for x in R['K']['walls'])})")
    oneshot = "apply_cold" in R  # not with --watch-only
    if oneshot:
        ac, pl, pr, ae = R["apply_cold"], R["plan"], R["plan_refresh"], R["apply_edit"]
        ic = R.get("intake_cold")
        if ic:
            row("cold intake: `validate`, empty intake cache", "intake_cold", ic["wall"],
                note=f"(user {ic.get('user', 0):.2f} / sys {ic.get('sys', 0):.2f}, all processes)")
        row("cold `apply` (empty state dir and kernel)", "apply_cold", ac["wall"])
        row("`plan`, nothing to change", "plan", pl["wall"], note=f"(exit {pl['rc']})")
        row("`plan --refresh`, nothing to change", "plan_refresh", pr["wall"], note=f"(exit {pr['rc']})")
        row("one EndpointSlice edited (1 endpoint moved), `apply`", "apply_edit", ae["wall"],
            note=f"({ae.get('operations')} ops)")
    w = R.get("watch")
    if w:
        row(f"watch: edit → kernel after the debounce, p50 (n={w['n']})", "watch_p50", w["p50_ms"], "ms",
            note=f"(sync log kernelMs p50 {w['kernelMs_p50']})")
        row(f"watch: edit → kernel after the debounce, p95 (n={w['n']})", "watch_p95", w["p95_ms"], "ms")
        row("watch: first full sync (empty state dir and kernel)", "", w["first_sync_s"])
        row("watch RSS (peak VmHWM; VmRSS after the last edit, and idle, in brackets)", "watch_rss", w["peak_rss_mb"], "MB",
            note=f"({w['rss_mb']:.0f} MB" + (f"; {w['rss_idle_mb']:.0f} MB after {IDLE_WAIT:g} s idle)"
                                              if "rss_idle_mb" in w else ")"))
    rss = {k: R[k].get("rss_mb") or 0 for k in ("apply_cold", "apply_edit", "plan", "plan_refresh") if k in R}
    if oneshot:
        row("one-shot peak RSS, max of `apply`/`plan`", "oneshot_rss", max(rss.values()), "MB",
            note=f"(cold apply {rss['apply_cold']:.0f}, edit apply {rss['apply_edit']:.0f}, "
                 f"plan {rss['plan']:.0f}, --refresh {rss['plan_refresh']:.0f})")
    lat = R.get("latency")
    if lat:
        s, b = lat["small"], lat["big"]
        d = b["mean_round_median_us"] - s["mean_round_median_us"]
        noise = lat_noise(s, b)
        flat = abs(d) <= noise and not s["errors"] and not b["errors"]
        rows.append((f"first-packet latency, TCP connect() to a ClusterIP: {SMALL} vs {n} Services",
                     f"median {s['median_us']:.0f} vs {b['median_us']:.0f} µs; mean of round medians "
                     f"{s['mean_round_median_us']:.1f} vs {b['mean_round_median_us']:.1f} "
                     f"(Δ {d:+.1f}, noise ±{noise:.1f})", "", "", "flat" if n in (1000, 10000) else "",
                     ("met" if flat else "**missed**") if n in (1000, 10000) else ""))
    if n == 30000 and oneshot:
        r10 = results.get(10000)
        if r10:
            a10 = r10["apply_cold"]
            lin = ac["wall"] / a10["wall"]
            # The load often changes between the sizes (minutes apart): the same ratio in
            # CPU seconds, and P's own 30k/10k ratio (3x the documents), say whether it did.
            cpu = (ac.get("user", 0) + ac.get("sys", 0)) / max(a10.get("user", 0) + a10.get("sys", 0), 1e-9)
            rows.append(("linearity: cold `apply` 30k / 10k",
                         f"{lin:.2f}x (CPU user+sys {cpu:.2f}x; P {P / r10['P']['wall']:.2f}x; "
                         f"in P {ac['wall'] / P:.2f} vs {a10['wall'] / r10['P']['wall']:.2f})",
                         "", "", "<= 3.5x", "met" if lin <= 3.5 else "**missed**"))
        else:
            rows.append(("linearity: cold `apply` 30k / 10k", "n/a (10k not in this run)", "", "", "<= 3.5x", "-"))
    mx = R["mix"]
    head = ("metric", "measured", "x P", "x K", "target", "met?")
    out = [f"### {n:,} Services x {R['endpoints']} endpoints",
           f"{R['files']} files, {R['bytes'] / 1e6:.1f} MB; {mx['ClusterIP']} ClusterIP, {mx['NodePort']} NodePort, "
           f"{mx['LoadBalancer']} LoadBalancer ({mx['sourceRanges']} with source ranges), {mx['affinity']} ClientIP "
           f"affinity, {mx['etpLocal']} eTP Local. K = {R['k_how']}.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,30000", help="comma-separated Service counts (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="1000 only")
    ap.add_argument("--endpoints", type=int, default=5, help="endpoints per Service (default %(default)s)")
    ap.add_argument("--edits", type=int, default=20, help="measured watch edits per size (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="discarded watch edits first (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="per subprocess at <= 10k Services, scaled up with the size (s, default %(default)s)")
    ap.add_argument("--reps", type=int, default=3,
                    help="runs of P and of K (median) up to 10k Services; 1 above (default %(default)s)")
    ap.add_argument("--no-watch", action="store_true", help="skip the watch measurements")
    ap.add_argument("--watch-only", action="store_true",
                    help="only P and the watch measurements (no K, no one-shot commands)")
    ap.add_argument("--no-classic", action="store_true",
                    help="no effect; accepted so that older checkouts' command lines run unchanged in A/B runs")
    ap.add_argument("--k-up-to", type=int, default=10**9, metavar="N",
                    help="measure K only up to N Services (K at 30k is 20+ minutes of kernel time; "
                         "the 30k target, linearity, needs only nftrec's own 10k and 30k figures)")
    ap.add_argument("--latency", action="store_true",
                    help="also first-packet latency: TCP connect() to a ClusterIP, 100-Service vs N-Service node")
    ap.add_argument("--connects", type=int, default=200, help="--latency: connects per size (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=40, help="--latency: interleaved rounds (default %(default)s)")
    ap.add_argument("--json", help="also write the raw numbers to this file")
    args = ap.parse_args(argv)
    sizes = [1000] if args.quick else [int(s) for s in args.sizes.split(",") if s.strip()]
    try:
        import yaml
        yaml.CSafeLoader  # noqa: B018
    except (ImportError, AttributeError):
        raise SystemExit(INSTALL_HINT) from None
    if not Path(sys.executable).with_name("nftrec").exists():
        raise SystemExit(f"no nftrec next to {sys.executable}: run this with the venv's Python "
                         f"(scripts/setup, then .venv/bin/python bench/targets.py)")
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces); the host ruleset is never touched")
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # run the finally blocks
    # An installed nftrec runs from byte-compiled modules (pip compiles them). A checkout
    # under PYTHONDONTWRITEBYTECODE=1 would compile its modules in every measured command;
    # compile them once here.
    import compileall

    compileall.compile_dir(REPO / "reconciler", quiet=1)
    nss = Namespaces()
    results: dict[int, dict] = {}
    header = facts()
    try:
        for n in sizes:
            results[n] = bench_size(args, nss, n)
            print(table(results[n], results), "\n", flush=True)
    except (RuntimeError, Timeout) as e:
        log(f"FAILED: {e}")
        return 1
    finally:
        nss.cleanup()
        if args.json:
            Path(args.json).write_text(json.dumps({"facts": header, "sizes": results}, indent=1, default=str))
    print(f"({header}; total {time.perf_counter() - T0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
