"""The `nftrec` command line against the real kernel (issue 4's acceptance criteria).

Every test works in a throwaway network namespace (conftest `netns`) with a temp state
directory; every nftrec command runs as a subprocess with `--netns` and `--state-dir`,
exactly as an operator would run it. Concurrency and crash tests live in
test_cli_concurrency.py; the helpers they share are here.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from ruamel.yaml import YAML

from nsutil import EXAMPLES, in_ns, sh, throwaway_netns

pytestmark = pytest.mark.kernel

NFTREC = str(Path(sys.executable).with_name("nftrec"))
CONFIG = EXAMPLES / "edge-small.config.yaml"
EDGE = EXAMPLES / "edge-small"
EXIT_USAGE = 64


# --- helpers -------------------------------------------------------------------------------


def nftrec(*args: str, state: Path | None = None, ns: str | None = None, config: bool | Path = True,
           input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `nftrec [--state-dir S] ARGS [--netns NS] [--config CONFIG]` (CONFIG: True for
    edge-small's node config, a path for another one, False for none)."""
    cmd = [NFTREC]
    if state is not None:
        cmd += ["--state-dir", str(state)]
    cmd += list(args)
    if ns is not None:
        cmd += ["--netns", ns]
    if config:
        cmd += ["--config", str(CONFIG if config is True else config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout,
                          env={**os.environ, "NO_COLOR": "1"})
    assert "Traceback" not in proc.stderr, f"{cmd}: traceback:\n{proc.stderr}"
    return proc


def ok(proc: subprocess.CompletedProcess, rc: int = 0) -> subprocess.CompletedProcess:
    assert proc.returncode == rc, (
        f"{' '.join(proc.args)} exited {proc.returncode}, expected {rc}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def plan_json(d: Path, state: Path, ns: str, *extra: str, config: bool | Path = True) -> tuple[int, dict]:
    p = nftrec("plan", str(d), "-o", "json", "--detailed-exitcode", *extra, state=state, ns=ns, config=config)
    assert p.returncode in (0, 2), p.stderr
    return p.returncode, json.loads(p.stdout)


def assert_clean(d: Path, state: Path, ns: str, config: bool | Path = True) -> None:
    """`plan --detailed-exitcode` says "no changes", with and without --refresh."""
    for extra in ((), ("--refresh",)):
        p = ok(nftrec("plan", str(d), "--detailed-exitcode", *extra, state=state, ns=ns, config=config))
        assert "No changes" in p.stdout, p.stdout


def listing(ns: str, family: str = "ip", table: str = "nftrec") -> str:
    return in_ns(ns, "nft", "-a", "list", "table", family, table).stdout


def ruleset(ns: str) -> str:
    return in_ns(ns, "nft", "-a", "list", "ruleset").stdout


def copy_edge(dst: Path) -> Path:
    d = dst / "manifests"
    shutil.copytree(EDGE, d)
    return d


_yaml = YAML()  # round-trip: comments and order survive the edits
_yaml.preserve_quotes = True
_yaml.width = 4096


def edit_docs(path: Path, fn: Callable[[list], list]) -> None:
    """Load every document of a YAML file, let `fn` return the new list, write it back."""
    docs = list(_yaml.load_all(path.read_text()))
    docs = fn(docs)
    buf = io.StringIO()
    _yaml.dump_all(docs, buf)
    path.write_text(buf.getvalue())


def edit_object(d: Path, kind: str, ns: str, name: str, fn: Callable[[dict], None]) -> None:
    """Apply `fn` to the one object (kind, namespace, name) found under `d`."""
    hits = 0
    for path in sorted(d.rglob("*.yaml")):
        docs = list(_yaml.load_all(path.read_text()))
        found = False
        for doc in docs:
            for obj in (doc.get("items", []) if doc and doc.get("kind") == "List" else [doc]):
                md = (obj or {}).get("metadata", {})
                if obj and obj.get("kind") == kind and md.get("name") == name \
                        and md.get("namespace", "default") == ns:
                    fn(obj)
                    found = True
        if found:
            hits += 1
            buf = io.StringIO()
            _yaml.dump_all(docs, buf)
            path.write_text(buf.getvalue())
    assert hits == 1, f"{kind} {ns}/{name} found in {hits} files"


def remove_objects(d: Path, pred: Callable[[dict], bool]) -> int:
    removed = 0
    for path in sorted(d.rglob("*.yaml")):
        docs = list(_yaml.load_all(path.read_text()))
        keep = [doc for doc in docs if not (doc and pred(doc))]
        if len(keep) != len(docs):
            removed += len(docs) - len(keep)
            if keep:
                buf = io.StringIO()
                _yaml.dump_all(keep, buf)
                path.write_text(buf.getvalue())
            else:
                path.unlink()
    return removed


def service_ips(d: Path) -> dict[str, set[str]]:
    """Every IP in the manifests under `d`, by Service ("ns/name"): ClusterIPs, external
    and LoadBalancer IPs, endpoint addresses (slices and legacy Endpoints)."""
    out: dict[str, set[str]] = {}
    for path in sorted(d.rglob("*")):
        if path.suffix not in (".yaml", ".yml", ".json") or not path.is_file():
            continue
        for doc in _yaml.load_all(path.read_text()):
            for obj in (doc.get("items", []) if doc and doc.get("kind") == "List" else [doc]):
                if not obj:
                    continue
                md = obj.get("metadata", {})
                ns = md.get("namespace", "default")
                kind = obj.get("kind")
                if kind == "Service":
                    ips = out.setdefault(f"{ns}/{md['name']}", set())
                    spec = obj.get("spec", {})
                    ips.update(x for x in [spec.get("clusterIP")] + list(spec.get("clusterIPs", []))
                               if x and x != "None")
                    ips.update(spec.get("externalIPs", []))
                    for ing in obj.get("status", {}).get("loadBalancer", {}).get("ingress", []):
                        ips.add(ing["ip"])
                elif kind == "EndpointSlice":
                    svc = md["labels"]["kubernetes.io/service-name"]
                    ips = out.setdefault(f"{ns}/{svc}", set())
                    for ep in obj.get("endpoints", []):
                        ips.update(ep["addresses"])
                elif kind == "Endpoints":
                    ips = out.setdefault(f"{ns}/{md['name']}", set())
                    for sub in obj.get("subsets", []):
                        for a in sub.get("addresses", []) + sub.get("notReadyAddresses", []):
                            ips.add(a["ip"])
    return out


_OP = re.compile(r"^(add|flush|delete) (table|chain|rule|element|set|map) (ip6?) nftrec(?: (\S+))?(.*)$")
_SVC_CHAIN = re.compile(r"^(?:service|external|local|firewall|endpoint|affinity)-[A-Z2-7]{8}-([^/]+/[^/]+)/")
_OWNER_REF = re.compile(r"(?:service|external|local|firewall|endpoint|affinity)-[A-Z2-7]{8}-([^/\s]+/[^/\s]+)/")


_LAYOUT_MAP = re.compile(r"endpoint-(?:dnat-(?:tcp|udp|sctp)|vmap)-[0-9a-f]{2}$")
# A hairpin shard's set and chain, and the dispatch vmap (layout sharded, deviation 14):
# a shard exists while its set holds an element, so an edit that adds a shard's first
# local endpoint or removes its last one creates or deletes the set, the chain and the
# vmap element, which name no Service or address (the vmap's key is a masked address).
_HAIRPIN = re.compile(r"hairpin-(?:connections-)?[0-9a-f]{2}$|hairpin-shards$")


def op_owners(op: str, ips: dict[str, set[str]], plan: dict | None = None) -> set[str]:
    """The Services an nft operation touches, from chain names, goto/jump targets,
    element comments ("ns/name:port") and IPs in element keys/values. An empty set
    means a shared object (table, base chain, helper chain, static set definition).
    An operation on a shared endpoint map (layout sharded) names only an index or the
    map, and a set flushed or declared with elements (changes.transaction_for: elements
    written through the declaration, a set losing elements rewritten whole) names the
    set: their owners are the Services whose plan objects are in that set. So are those
    of an operation on a hairpin shard's set or chain or on the dispatch vmap (`_HAIRPIN`;
    the shard's elements name their endpoint's address)."""
    m = _OP.match(op)
    assert m, f"unexpected operation {op!r}"
    verb, kind, _fam, name, rest = m.groups()
    hairpin = _HAIRPIN.match(name or "") and not (kind == "element" and name != "hairpin-shards")
    if plan is not None and (_LAYOUT_MAP.match(name or "") or hairpin or (
            kind in ("set", "map") and (verb == "flush" or "elements = {" in rest))):
        return {s["service"] for s in plan["services"] for o in s["objects"] if o.get("name") == name}
    if plan is not None and verb == "add" and kind in ("set", "map") and "elements" not in rest \
            and not _SVC_CHAIN.match(name or ""):
        # a bare re-declaration of an existing shared set (a no-op for the kernel) before
        # the chain declarations that use it (changes.transaction_for step 5): it belongs
        # to the Services whose chains in this transaction reference it
        users = [o for o in plan["transaction"] if o.startswith("add chain ") and f"@{name}" in o]
        if users:
            return set().union(*(op_owners(o, ips) for o in users))
    if kind in ("chain", "rule", "set", "map"):
        own = _SVC_CHAIN.match(name or "")
        return {own.group(1)} if own else set()
    if kind == "table":
        return set()
    owners = set(_OWNER_REF.findall(rest))
    owners.update(c.split(":", 1)[0] for c in re.findall(r'comment "([^"]+)"', rest) if "/" in c)
    atoms = set(re.findall(r"[0-9a-fA-F:.]*[0-9][0-9a-fA-F:.]*", rest))
    for svc, svc_ips in ips.items():
        if atoms & svc_ips:
            owners.add(svc)
    return owners


def assert_only(plan: dict, svc: str, ips: dict[str, set[str]], action: str) -> None:
    """The plan names exactly `svc`, shares nothing, and every operation is `svc`'s (a
    hairpin shard it alone fills or empties included)."""
    assert [s["service"] for s in plan["services"]] == [svc], json.dumps(plan["services"], indent=1)
    assert plan["services"][0]["action"] == action, plan["services"][0]
    assert plan["shared"] == [], plan["shared"]
    assert plan["transaction"], "an edit must produce a transaction"
    for op in plan["transaction"]:
        assert op_owners(op, ips, plan) == {svc}, f"operation touches {op_owners(op, ips, plan) or 'shared objects'}: {op}"
    assert plan["summary"]["operations"] == len(plan["transaction"])


@pytest.fixture
def netns2():
    """A second throwaway namespace."""
    with throwaway_netns() as name:
        yield name


@pytest.fixture
def state(tmp_path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def applied(netns, state, tmp_path):
    """edge-small copied to a temp dir and applied: (netns, state dir, manifest dir)."""
    d = copy_edge(tmp_path)
    ok(nftrec("apply", str(d), state=state, ns=netns))
    return netns, state, d


# --- apply on an empty namespace, then a clean plan ------------------------------------------


def test_apply_on_empty_namespace_then_plan_is_clean(netns, state, tmp_path):
    d = copy_edge(tmp_path)
    code, before = plan_json(d, state, netns)
    assert code == 2 and before["changed"]
    ok(nftrec("apply", str(d), state=state, ns=netns))
    assert_clean(d, state, netns)
    code, after = plan_json(d, state, netns, "--refresh")
    assert code == 0 and not after["changed"] and after["transaction"] == [] and after["services"] == []
    assert after["shared"] == []
    # Both families' tables exist and nothing else was created.
    assert sorted(in_ns(netns, "nft", "list", "tables").stdout.split("\n")) == \
        sorted(["table ip nftrec", "table ip6 nftrec", ""])
    st = ok(nftrec("status", "-o", "json", state=state, ns=netns))
    doc = json.loads(st.stdout)
    assert doc["drift"] is False and doc["lastAppliedRevision"] == before["revision"]


def test_apply_twice_is_a_noop(applied):
    ns, state, d = applied
    before = ruleset(ns)
    p = ok(nftrec("apply", str(d), state=state, ns=ns))
    assert "No changes" in p.stdout
    assert ruleset(ns) == before


# --- single edits: the plan names exactly that Service ---------------------------------------


def _add_endpoint(d):
    edit_object(d, "EndpointSlice", "default", "web-abc12",
                lambda o: o["endpoints"].append({"addresses": ["10.244.0.14"], "nodeName": "edge-1"}))


def _remove_endpoint(d):
    edit_object(d, "EndpointSlice", "default", "web-abc12",
                lambda o: o.__setitem__("endpoints", [e for e in o["endpoints"] if e["addresses"] != ["10.244.0.11"]]))


def _endpoint_not_ready(d):
    def fn(o):
        for e in o["endpoints"]:
            if e["addresses"] == ["10.244.0.12"]:
                e["conditions"] = {"ready": False, "serving": False, "terminating": False}
    edit_object(d, "EndpointSlice", "default", "web-abc12", fn)


def _add_service(d):
    (d / "new.yaml").write_text("""\
apiVersion: v1
kind: Service
metadata: {name: fresh, namespace: team}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: fresh-1
  namespace: team
  labels: {kubernetes.io/service-name: fresh}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - addresses: [10.244.3.1]
  - addresses: [10.244.3.2]
""")


def _add_service_without_endpoints(d):
    (d / "new.yaml").write_text("""\
apiVersion: v1
kind: Service
metadata: {name: fresh, namespace: team}
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30200}]
""")


def _remove_service(d):
    n = remove_objects(d, lambda o: (o.get("kind") == "Service" and o["metadata"]["name"] == "web")
                       or (o.get("kind") == "EndpointSlice" and o["metadata"]["name"] == "web-abc12"))
    assert n == 2


def _remove_service_without_endpoints(d):
    assert remove_objects(d, lambda o: o.get("kind") == "Service" and o["metadata"]["name"] == "idle") == 1


def _to_nodeport(d):
    def fn(o):
        o["spec"]["type"] = "NodePort"
        o["spec"]["ports"][0]["nodePort"] = 30100
    edit_object(d, "Service", "default", "web", fn)


def _source_range(d):
    def fn(o):
        r = o["spec"]["loadBalancerSourceRanges"]
        r[r.index("203.0.113.0/24")] = "198.51.100.0/24"
    edit_object(d, "Service", "edge", "ingress", fn)


def _affinity_on(d):
    def fn(o):
        o["spec"]["sessionAffinity"] = "ClientIP"
        o["spec"]["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 300}}
    edit_object(d, "Service", "default", "web", fn)


def _affinity_off(d):
    def fn(o):
        o["spec"]["sessionAffinity"] = "None"
        del o["spec"]["sessionAffinityConfig"]
    edit_object(d, "Service", "default", "sticky", fn)


def _affinity_timeout(d):
    edit_object(d, "Service", "default", "sticky",
                lambda o: o["spec"]["sessionAffinityConfig"]["clientIP"].__setitem__("timeoutSeconds", 60))


def _legacy_endpoint_ready(d):
    def fn(o):
        sub = o["subsets"][0]
        sub["addresses"].append(sub.pop("notReadyAddresses")[0])
    edit_object(d, "Endpoints", "default", "legacy", fn)


def _dns_endpoint_removed(d):  # inside a `kind: List`
    edit_object(d, "EndpointSlice", "kube-system", "dns-q8w2e",
                lambda o: o.__setitem__("endpoints", o["endpoints"][:1]))


def _external_ip_changed(d):
    edit_object(d, "Service", "monitoring", "metrics",
                lambda o: o["spec"].__setitem__("externalIPs", ["192.168.50.11"]))


EDITS = {
    "endpoint-added": (_add_endpoint, "default/web", "~"),
    "endpoint-removed": (_remove_endpoint, "default/web", "~"),
    "endpoint-not-ready": (_endpoint_not_ready, "default/web", "~"),
    "service-added": (_add_service, "team/fresh", "+"),
    "service-added-no-endpoints": (_add_service_without_endpoints, "team/fresh", "+"),
    "service-removed": (_remove_service, "default/web", "-"),
    "service-removed-no-endpoints": (_remove_service_without_endpoints, "default/idle", "-"),
    "clusterip-to-nodeport": (_to_nodeport, "default/web", "~"),
    "source-range-changed": (_source_range, "edge/ingress", "~"),
    "affinity-on": (_affinity_on, "default/web", "~"),
    "affinity-off": (_affinity_off, "default/sticky", "~"),
    "affinity-timeout": (_affinity_timeout, "default/sticky", "~"),
    "legacy-endpoints-not-ready-to-ready": (_legacy_endpoint_ready, "default/legacy", "~"),
    "list-item-endpoint-removed": (_dns_endpoint_removed, "kube-system/dns", "~"),
    "external-ip-changed": (_external_ip_changed, "monitoring/metrics", "~"),
}


def _check_single_edit(ns, state, d, fn, svc, action, config: bool | Path = True, families=("ip", "ip6")):
    ips_before = service_ips(d)
    fn(d)
    ips_after = service_ips(d)
    ips = {k: ips_before.get(k, set()) | ips_after.get(k, set()) for k in ips_before.keys() | ips_after.keys()}
    # An IP that two Services share (none in these examples) could not tell them apart.
    for a in ips:
        for b in ips:
            assert a == b or not (ips[a] & ips[b]), f"{a} and {b} share IPs"
    ok(nftrec("validate", str(d), config=config))
    code, plan = plan_json(d, state, ns, config=config)
    assert code == 2
    assert_only(plan, svc, ips, action)
    assert {_OP.match(op).group(3) for op in plan["transaction"]} <= set(families), plan["transaction"]
    text = ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=ns, config=config), 2).stdout
    assert f"{action} {svc}" in text and text.count("\n") == 2, text  # one Service line + the count
    ok(nftrec("apply", str(d), state=state, ns=ns, config=config))
    assert_clean(d, state, ns, config=config)
    ok(nftrec("status", state=state, ns=ns, config=config))


@pytest.mark.parametrize("edit", list(EDITS))
def test_single_edit_touches_only_that_service(applied, edit):
    """One edit → a plan naming exactly that Service, no shared objects, a transaction
    touching only its objects; after apply the plan is clean."""
    ns, state, d = applied
    fn, svc, action = EDITS[edit]
    _check_single_edit(ns, state, d, fn, svc, action)


DUAL = EXAMPLES / "dual-stack"
DUAL_CONFIG = EXAMPLES / "dual-stack.config.yaml"


def _dual_v6_endpoint_added(d):
    edit_object(d, "EndpointSlice", "default", "web-v6",
                lambda o: o["endpoints"].append({"addresses": ["fd00:10:244::11"], "nodeName": "edge-1"}))


def _dual_v4_endpoint_removed(d):
    edit_object(d, "EndpointSlice", "default", "api-v4", lambda o: o.__setitem__("endpoints", []))


def _dual_external_ip_removed(d):
    edit_object(d, "Service", "default", "api",
                lambda o: o["spec"].__setitem__("externalIPs", ["192.168.50.11"]))


DUAL_EDITS = {
    "v6-endpoint-added": (_dual_v6_endpoint_added, "default/web", "~", ("ip6",)),
    "v4-endpoints-gone": (_dual_v4_endpoint_removed, "default/api", "~", ("ip",)),
    "v6-external-ip-removed": (_dual_external_ip_removed, "default/api", "~", ("ip6",)),
}


@pytest.mark.parametrize("edit", list(DUAL_EDITS))
def test_single_edit_dual_stack_touches_only_that_family(netns, state, tmp_path, edit):
    d = tmp_path / "dual"
    shutil.copytree(DUAL, d)
    ok(nftrec("apply", str(d), state=state, ns=netns, config=DUAL_CONFIG))
    assert_clean(d, state, netns, config=DUAL_CONFIG)
    fn, svc, action, families = DUAL_EDITS[edit]
    _check_single_edit(netns, state, d, fn, svc, action, config=DUAL_CONFIG, families=families)


# --- other owners' tables --------------------------------------------------------------------

OTHER = """\
table ip other {
  chain c {
    type filter hook input priority 0;
    counter;
  }
}
"""
KUBE_PROXY = """\
table ip kube-proxy {
  comment "rules for kube-proxy"
  set cluster-ips {
    type ipv4_addr
    elements = { 172.30.0.1 }
  }
  chain services {
    ip daddr @cluster-ips counter
  }
}
table ip6 kube-proxy {
  set cluster-ips {
    type ipv6_addr
  }
  chain services {
    ip6 daddr @cluster-ips counter
  }
}
"""


def _others(ns: str) -> dict[str, str]:
    return {t: in_ns(ns, "nft", "-a", "list", "table", *t.split()).stdout
            for t in ("ip other", "ip kube-proxy", "ip6 kube-proxy")}


def test_other_tables_are_never_touched(netns, state, tmp_path):
    in_ns(netns, "nft", "-f", "-", input=OTHER + "\n" + KUBE_PROXY)
    before = _others(netns)
    d = copy_edge(tmp_path)
    ok(nftrec("apply", str(d), state=state, ns=netns))
    assert _others(netns) == before
    _add_endpoint(d)
    ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=netns), 2)
    ok(nftrec("plan", str(d), "--out", str(tmp_path / "p.json"), state=state, ns=netns))
    ok(nftrec("apply", str(d), state=state, ns=netns))
    assert_clean(d, state, netns)
    ok(nftrec("status", state=state, ns=netns))
    assert _others(netns) == before
    doc = ok(nftrec("doctor", ns=netns)).stdout
    assert "kube-proxy" in doc  # the doctor mentions the conflicting table ...
    assert _others(netns) == before  # ... and leaves it alone
    ok(nftrec("cleanup", "--dry-run", "--kube-proxy", state=state, ns=netns))
    assert _others(netns) == before
    ok(nftrec("cleanup", state=state, ns=netns))
    assert _others(netns) == before
    tables = in_ns(netns, "nft", "list", "tables").stdout.split("\n")
    assert "table ip nftrec" not in tables and "table ip6 nftrec" not in tables
    ok(nftrec("cleanup", "--kube-proxy", state=state, ns=netns))
    tables = [t for t in in_ns(netns, "nft", "list", "tables").stdout.split("\n") if t]
    assert tables == ["table ip other"]
    assert in_ns(netns, "nft", "-a", "list", "table", "ip", "other").stdout == before["ip other"]


# --- drift -----------------------------------------------------------------------------------


def _chain_of(ns: str, prefix: str) -> str:
    names = re.findall(r"^\tchain (\S+) \{", listing(ns), re.M)
    hits = [n for n in names if n.startswith(prefix) or re.match(prefix, n)]
    assert len(hits) == 1, (prefix, names)
    return hits[0]


def _rule_handles(ns: str, chain: str) -> list[int]:
    text = in_ns(ns, "nft", "-a", "list", "chain", "ip", "nftrec", chain).stdout
    return [int(h) for h in re.findall(r"^\t\t.*# handle (\d+)$", text, re.M)]


def _assert_drift(ns, state, d, services: list[str]):
    st = nftrec("status", state=state, ns=ns)
    ok(st, 2)
    assert "drift:     yes" in st.stdout
    for s in services:
        assert s in st.stdout, st.stdout
    doc = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns), 2).stdout)
    assert doc["drift"] is True and doc["driftedServices"] == services
    for extra in ((), ("--refresh",)):
        code, plan = plan_json(d, state, ns, *extra)
        assert code == 2, plan
        assert [s["service"] for s in plan["services"]] == services
    ok(nftrec("apply", str(d), state=state, ns=ns))
    ok(nftrec("status", state=state, ns=ns))
    assert_clean(d, state, ns)


def test_drift_deleted_rule_is_reported_and_repaired(applied):
    ns, state, d = applied
    chain = _chain_of(ns, r"service-[A-Z2-7]{8}-default/web/")
    handles = _rule_handles(ns, chain)
    assert len(handles) == 1
    in_ns(ns, "nft", "delete", "rule", "ip", "nftrec", chain, "handle", str(handles[0]))
    _assert_drift(ns, state, d, ["default/web"])
    assert len(_rule_handles(ns, chain)) == 1


def test_drift_deleted_rule_of_a_shared_chain(applied):
    ns, state, d = applied
    handles = _rule_handles(ns, "cluster-ips-check")
    in_ns(ns, "nft", "delete", "rule", "ip", "nftrec", "cluster-ips-check", "handle", str(handles[-1]))
    st = ok(nftrec("status", state=state, ns=ns), 2)
    assert "shared objects" in st.stdout
    code, plan = plan_json(d, state, ns)
    assert code == 2 and plan["services"] == [] and [c["name"] for c in plan["shared"]] == ["cluster-ips-check"]
    ok(nftrec("apply", str(d), state=state, ns=ns))
    ok(nftrec("status", state=state, ns=ns))
    assert_clean(d, state, ns)


def test_drift_added_element_is_reported_and_repaired(applied):
    ns, state, d = applied
    chain = _chain_of(ns, r"service-[A-Z2-7]{8}-default/web/")
    in_ns(ns, "nft", "add", "element", "ip", "nftrec", "service-ips",
          "{ 10.96.0.99 . tcp . 81 : goto " + chain + " }")
    _assert_drift(ns, state, d, ["default/web"])
    assert "10.96.0.99" not in listing(ns)


def test_drift_added_shared_element_is_reported_and_repaired(applied):
    ns, state, d = applied
    in_ns(ns, "nft", "add", "element", "ip", "nftrec", "cluster-ips", "{ 10.96.0.98 }")
    st = ok(nftrec("status", state=state, ns=ns), 2)
    assert "shared objects" in st.stdout
    code, plan = plan_json(d, state, ns)
    assert code == 2 and plan["services"] == []
    assert [(c["action"], c["name"], c["key"]) for c in plan["shared"]] == [("remove", "cluster-ips", ["10.96.0.98"])]
    # the set is small: flushed and re-declared without it (changes.rewritten_sets), not
    # `delete element` (nft 1.0.6 fills its whole cache for that)
    flush, decl = plan["transaction"]
    assert flush == "flush set ip nftrec cluster-ips" and decl.startswith("add set ip nftrec cluster-ips { type ipv4_addr ;")
    assert "10.96.0.98" not in decl and "10.96.0.10" in decl
    ok(nftrec("apply", str(d), state=state, ns=ns))
    ok(nftrec("status", state=state, ns=ns))
    assert "10.96.0.98" not in listing(ns)


def test_drift_deleted_table_is_repaired(applied):
    ns, state, d = applied
    before = listing(ns, "ip6")
    in_ns(ns, "nft", "delete", "table", "ip6", "nftrec")
    ok(nftrec("status", state=state, ns=ns), 2)
    ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=ns), 2)
    ok(nftrec("apply", str(d), state=state, ns=ns))
    ok(nftrec("status", state=state, ns=ns))
    # Same objects again (handles differ: the table is new).
    strip = lambda s: re.sub(r" # handle \d+", "", s)  # noqa: E731
    assert strip(listing(ns, "ip6")) == strip(before)


def test_affinity_entries_are_runtime_state_not_drift(applied, tmp_path):
    """Elements the kernel adds to the dynamic affinity sets (simulated here with
    `nft add element`) are neither drift nor a reason to call a saved plan stale, and an
    apply that changes another Service keeps them."""
    ns, state, d = applied
    # the sharded layout's shared set (client . endpoint id; nft accepts only id 0 . 0 here),
    # or where nft refuses it (0.9.8, kernel/features.py) kube-proxy's set of an endpoint
    shared = "affinity-clients" in listing(ns)
    aff = _set_of(ns, r"affinity-clients$" if shared else r"affinity-")
    key = " . 0 . 0" if shared else ""
    in_ns(ns, "nft", "add", "element", "ip", "nftrec", aff, f"{{ 192.0.2.1{key} timeout 5m }}")
    ok(nftrec("status", state=state, ns=ns))
    assert_clean(d, state, ns)
    _add_endpoint(d)
    f = tmp_path / "p.plan"
    ok(nftrec("plan", str(d), "--out", str(f), state=state, ns=ns))
    in_ns(ns, "nft", "add", "element", "ip", "nftrec", aff, f"{{ 192.0.2.2{key} timeout 5m }}")
    ok(nftrec("apply", "--plan", str(f), state=state, ns=ns))
    elems = in_ns(ns, "nft", "list", "set", "ip", "nftrec", aff).stdout
    assert "192.0.2.1" in elems and "192.0.2.2" in elems
    ok(nftrec("status", state=state, ns=ns))


def _set_of(ns: str, pattern: str) -> str:
    names = [n for n in re.findall(r"^\t(?:set|map) (\S+) \{", listing(ns), re.M) if re.match(pattern, n)]
    assert len(names) >= 1, pattern
    return names[0]


# --- saved plans -----------------------------------------------------------------------------


def test_saved_plan_stale_already_applied_and_fresh(applied, tmp_path):
    ns, state, d = applied
    _add_endpoint(d)
    stale = tmp_path / "stale.plan"
    ok(nftrec("plan", str(d), "--out", str(stale), state=state, ns=ns))
    # The kernel changes behind the plan's back.
    in_ns(ns, "nft", "add", "element", "ip", "nftrec", "cluster-ips", "{ 10.96.0.98 }")
    before = ruleset(ns)
    p = ok(nftrec("apply", "--plan", str(stale), state=state, ns=ns), 1)
    assert "stale" in p.stderr, p.stderr
    assert ruleset(ns) == before
    # A fresh plan applies fine; the same plan a second time is refused.
    fresh = tmp_path / "fresh.plan"
    p = ok(nftrec("plan", str(d), "--out", str(fresh), state=state, ns=ns))
    assert "Saved the plan" in p.stdout
    ok(nftrec("apply", "--plan", str(fresh), state=state, ns=ns))
    assert "10.96.0.98" not in listing(ns)
    assert_clean(d, state, ns)
    after = ruleset(ns)
    p = ok(nftrec("apply", "--plan", str(fresh), state=state, ns=ns), 1)
    assert "already applied" in p.stderr, p.stderr
    assert ruleset(ns) == after
    ok(nftrec("status", state=state, ns=ns))
    # The stale one stays stale.
    p = ok(nftrec("apply", "--plan", str(stale), state=state, ns=ns), 1)
    assert "stale" in p.stderr or "already applied" in p.stderr, p.stderr


def test_saved_plan_of_another_namespace_is_refused(applied, netns2, tmp_path):
    ns, state, d = applied
    f = tmp_path / "p.plan"
    ok(nftrec("plan", str(d), "--out", str(f), state=state, ns=ns))
    doc = json.loads(f.read_text())
    assert doc["netns"] == ns
    p = ok(nftrec("apply", "--plan", str(f), state=state, ns=netns2), 1)
    assert ns in p.stderr
    assert in_ns(netns2, "nft", "list", "tables").stdout == ""


def test_tampered_saved_plan_is_refused(applied, tmp_path):
    ns, state, d = applied
    _add_endpoint(d)
    f = tmp_path / "p.plan"
    ok(nftrec("plan", str(d), "--out", str(f), state=state, ns=ns))
    doc = json.loads(f.read_text())
    doc["transaction"].append("flush ruleset")
    f.write_text(json.dumps(doc))
    before = ruleset(ns)
    ok(nftrec("apply", "--plan", str(f), state=state, ns=ns), 1)
    assert ruleset(ns) == before


# --- the kernel rejects a transaction ----------------------------------------------------------


def _desired(d: Path, ns: str):
    from reconciler.engine.desired import load_desired

    return load_desired(d, CONFIG, netns=ns)


def _with_ruleset(desired, rs):
    from reconciler.engine.desired import Desired

    return Desired(desired.inventory, desired.config, rs)


@pytest.mark.parametrize("breakage", ["element-goto-missing-chain", "rule-jump-missing-chain"])
def test_kernel_rejection_leaves_previous_ruleset_whole(applied, breakage):
    from reconciler.engine import CommandError, Target, run_apply
    from reconciler.compile.ruleset import Chain, Element, Rule

    ns, state, d = applied
    before = ruleset(ns)
    status_before = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns)).stdout)
    _add_endpoint(d)  # a valid change rides along: it must not land either
    desired = _desired(d, ns)
    rs = copy.deepcopy(desired.ruleset)
    t = rs.tables["ip"]
    if breakage == "element-goto-missing-chain":
        t.sets["service-ips"].add(Element(("10.96.0.77", "tcp", "80"), "goto service-NOSUCHCH-x/y/tcp/http"))
    else:
        name = next(n for n in t.chains if re.match(r"service-[A-Z2-7]{8}-default/web/", n))
        c = t.chains[name]
        t.chains[name] = Chain(c.name, (Rule("jump no-such-chain"),) + c.rules, c.base, c.comment)
    target = Target(ns, "nftrec", state)
    with pytest.raises(CommandError) as exc:
        run_apply(target, desired=_with_ruleset(desired, rs), out_stream=io.StringIO())
    msg = str(exc.value)
    assert "rejected" in msg and "previous ruleset is whole" in msg
    assert "No such file or directory" in msg and "Could not process rule" in msg, msg
    assert ruleset(ns) == before
    # The attempt is recorded; the kernel still matches the last applied ruleset; the newest
    # revision is not applied: status exits 1.
    doc = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns), 1).stdout)
    assert doc["drift"] is False and doc["lastAppliedRevision"] == status_before["lastAppliedRevision"]
    assert doc["lastError"] and "No such file or directory" in doc["lastError"]
    # The lock was released: a valid apply goes through.
    assert run_apply(target, desired=desired, out_stream=io.StringIO()) == 0
    assert_clean(d, state, ns)
    doc = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns)).stdout)
    assert doc["lastError"] is None


# --- usage errors, version, validate, render, doctor ------------------------------------------


@pytest.mark.parametrize("args", [
    ["apply", "--no-such-option"],
    ["plan", str(EDGE), "-o", "yaml"],
    ["status", "-o", "xml"],
    ["validate", str(EDGE), "-o", "yaml"],
    ["apply", str(EDGE), "--plan", "/nonexistent.plan"],
    ["apply", str(EDGE), "--rollback"],
    ["apply", "--plan", "/nonexistent.plan", "--rollback"],
    ["--log-format", "xml", "validate", str(EDGE)],
    ["no-such-command"],
    ["plan", str(EDGE), "--detailed-exitcode=maybe"],
])
def test_usage_errors_exit_64(args, netns, state):
    before = ruleset(netns)
    p = nftrec(*args, state=state, ns=netns, config=False)  # --netns: never the host, even on a bug
    assert p.returncode == EXIT_USAGE, (args, p.returncode, p.stderr)
    assert p.stderr.strip()
    assert ruleset(netns) == before


def test_version():
    p = ok(nftrec("--version", config=False))
    from reconciler import __version__
    assert p.stdout.strip() == f"nftrec {__version__}"


@pytest.mark.parametrize("example,config", [
    ("edge-small", "edge-small.config.yaml"),
    ("dual-stack", "dual-stack.config.yaml"),
    ("git-sync/current", "edge-small.config.yaml"),
    ("fleet", "fleet.edge-paris-1.config.yaml"),
    ("fleet", "fleet.edge-lyon-1.config.yaml"),
])
def test_validate_and_render_examples(netns, example, config):
    d = EXAMPLES / example
    cfg = str(EXAMPLES / config)
    ok(nftrec("validate", str(d), "--config", cfg, config=False))
    j = ok(nftrec("validate", str(d), "--config", cfg, "-o", "json", config=False))
    json.loads(j.stdout)
    r = ok(nftrec("render", str(d), "--config", cfg, config=False))
    assert "table ip nftrec" in r.stdout and "table ip6 nftrec" in r.stdout
    in_ns(netns, "nft", "-c", "-f", "-", input=r.stdout)
    # And for real: the rendered script loads, and a second load is idempotent.
    in_ns(netns, "nft", "-f", "-", input=r.stdout)
    first = ruleset(netns)
    in_ns(netns, "nft", "-f", "-", input=r.stdout)
    strip = lambda s: re.sub(r" # handle \d+", "", s)  # noqa: E731
    assert strip(ruleset(netns)) == strip(first)


def test_render_then_plan_is_clean(netns, state, tmp_path):
    """What `render` prints and what `apply` commits are the same ruleset, on a node whose
    interfaces carry its nodeIPs (render reads no interfaces: nodeIPs stand in for them;
    plan lists the namespace's interface addresses for nodePortAddresses)."""
    d = copy_edge(tmp_path)
    r = ok(nftrec("render", str(d)))
    assert r.stdout.startswith("# nodeport-ips: render looks at no interface, so nodeIPs (192.168.50.2, "
                               "2001:db8:50::2) stand in"), r.stdout[:300]
    in_ns(netns, "nft", "-f", "-", input=r.stdout)
    code, plan = plan_json(d, state, netns, "--refresh")
    assert code == 2 and "nodeport-ips" in json.dumps(plan), "no node address in the namespace yet"
    in_ns(netns, "ip", "link", "add", "wan0", "type", "veth", "peer", "name", "wan0p")  # both ends in netns
    in_ns(netns, "ip", "addr", "add", "192.168.50.2/24", "dev", "wan0")
    in_ns(netns, "ip", "addr", "add", "2001:db8:50::2/64", "dev", "wan0", "nodad")
    code, plan = plan_json(d, state, netns, "--refresh")
    assert code == 0, json.dumps(plan, indent=1)[:3000]


def test_validate_invalid_exits_1(tmp_path):
    d = copy_edge(tmp_path)
    # web takes ingress' ClusterIP and port: two Services claim 10.96.0.12:80/TCP.
    edit_object(d, "Service", "default", "web", lambda o: o["spec"].__setitem__("clusterIP", "10.96.0.12"))
    p = ok(nftrec("validate", str(d)), 1)
    assert "services.yaml:" in (p.stdout + p.stderr)


def test_invalid_input_is_never_applied(applied):
    ns, state, d = applied
    before = ruleset(ns)
    edit_object(d, "Service", "default", "web", lambda o: o["spec"]["ports"][0].__setitem__("port", 70000))
    applied_rev = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns)).stdout)["lastAppliedRevision"]
    p = ok(nftrec("apply", str(d), state=state, ns=ns), 1)
    assert "spec.ports[0].port" in p.stderr and "nothing was changed" in p.stderr
    ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=ns), 1)
    assert ruleset(ns) == before
    # Flux-style status: the failed revision is the last attempted, the good one stays applied
    st = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns), 1).stdout)
    assert st["lastAppliedRevision"] == applied_rev
    assert st["lastAttemptedRevision"] != applied_rev and "error(s) in the input" in st["lastError"]
    assert "attempted:" in ok(nftrec("status", state=state, ns=ns), 1).stdout  # not applied: exit 1


def test_log_format_json_puts_one_object_per_line_on_stderr(applied):
    ns, state, d = applied
    edit_object(d, "Service", "default", "web", lambda o: o["spec"]["ports"][0].__setitem__("port", 70000))
    p = ok(nftrec("--log-format", "json", "apply", str(d), state=state, ns=ns), 1)
    lines = [json.loads(line) for line in p.stderr.splitlines()]
    problem = next(x for x in lines if x.get("field") == "spec.ports[0].port")
    assert problem["level"] == "error" and problem["file"].endswith("services.yaml") and problem["line"] > 0
    assert lines[-1]["level"] == "error" and "nothing was changed" in lines[-1]["msg"]


def test_doctor(netns):
    p = ok(nftrec("doctor", ns=netns))
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    assert sum(l.startswith("ok") for l in lines) >= 4, p.stdout
    assert not any(l.startswith("FAIL") for l in lines)
    assert in_ns(netns, "nft", "list", "tables").stdout == ""  # the doctor's check is a dry run


# --- cleanup -----------------------------------------------------------------------------------


def test_cleanup_dry_run_then_twice(applied):
    ns, state, d = applied
    before = ruleset(ns)
    p = ok(nftrec("cleanup", "--dry-run", state=state, ns=ns))
    assert "would delete table ip nftrec" in p.stdout and "would delete table ip6 nftrec" in p.stdout
    assert ruleset(ns) == before
    p = ok(nftrec("cleanup", state=state, ns=ns))
    assert "deleted table ip nftrec" in p.stdout and "deleted table ip6 nftrec" in p.stdout
    assert in_ns(ns, "nft", "list", "tables").stdout == ""
    p = ok(nftrec("cleanup", state=state, ns=ns))
    assert "not present: table ip nftrec" in p.stdout
    p = ok(nftrec("cleanup", "--kube-proxy", state=state, ns=ns))
    assert "not present: table ip kube-proxy" in p.stdout
    p = ok(nftrec("cleanup", "--dry-run", state=state, ns=ns))
    assert "would delete" not in p.stdout
    # After cleanup, status says the tables were removed on purpose (no drift) and apply restores them.
    assert "cleaned up at" in ok(nftrec("status", state=state, ns=ns)).stdout
    ok(nftrec("apply", str(d), state=state, ns=ns))
    assert_clean(d, state, ns)


def test_cleanup_on_empty_namespace(netns, state):
    p = ok(nftrec("cleanup", state=state, ns=netns))
    assert "error" not in p.stdout
    assert in_ns(netns, "nft", "list", "tables").stdout == ""


# --- rollback ----------------------------------------------------------------------------------


def test_rollback(applied, tmp_path):
    ns, state, a = applied
    b = tmp_path / "b"
    shutil.copytree(a, b)
    _add_service(b)
    _remove_endpoint(b)
    _source_range(b)
    ok(nftrec("apply", str(b), state=state, ns=ns))
    assert_clean(b, state, ns)
    p = ok(nftrec("apply", "--rollback", state=state, ns=ns))
    assert "Rolling back" in p.stdout
    assert_clean(a, state, ns)
    ok(nftrec("plan", str(b), "--detailed-exitcode", "--refresh", state=state, ns=ns), 2)
    ok(nftrec("status", state=state, ns=ns))
    # A second rollback returns to B (like `cd -`).
    ok(nftrec("apply", "--rollback", state=state, ns=ns))
    assert_clean(b, state, ns)


def test_rollback_with_nothing_to_go_back_to(applied):
    ns, state, d = applied
    before = ruleset(ns)
    p = ok(nftrec("apply", "--rollback", state=state, ns=ns), 1)
    assert "nothing to roll back" in p.stderr
    assert ruleset(ns) == before


def test_rollback_after_drift_restores_the_previous_ruleset(applied, tmp_path):
    ns, state, a = applied
    b = tmp_path / "b"
    shutil.copytree(a, b)
    _affinity_on(b)
    ok(nftrec("apply", str(b), state=state, ns=ns))
    in_ns(ns, "nft", "add", "element", "ip", "nftrec", "cluster-ips", "{ 10.96.0.98 }")
    ok(nftrec("apply", "--rollback", state=state, ns=ns))
    assert_clean(a, state, ns)


# --- corrupt state -----------------------------------------------------------------------------


def _status_path(state: Path, ns: str) -> Path:
    from reconciler.engine.state import StateStore

    return StateStore(state, netns=ns, table="nftrec").status_path


@pytest.mark.parametrize("garbage", [b"\x00\xffgarbage{", b"[1, 2]", b'{"formatVersion": 99}', b""])
def test_corrupt_status_file_is_reported_moved_aside_and_rebuilt(applied, tmp_path, garbage):
    ns, state, a = applied
    path = _status_path(state, ns)
    assert path.is_file()
    path.write_bytes(garbage)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    _add_endpoint(b)
    p = ok(nftrec("apply", str(b), state=state, ns=ns))
    assert str(path) in p.stderr, p.stderr
    aside = list(path.parent.glob("status.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    json.loads(path.read_text())
    p = ok(nftrec("status", state=state, ns=ns))
    assert "drift:     no" in p.stdout
    assert_clean(b, state, ns)


def test_corrupt_status_file_then_status_and_plan(applied):
    ns, state, d = applied
    path = _status_path(state, ns)
    path.write_text("{not json")
    p = nftrec("status", state=state, ns=ns)
    assert p.returncode in (0, 1, 2)
    assert str(path) in p.stderr, p.stderr
    assert_clean(d, state, ns)
    ok(nftrec("apply", str(d), state=state, ns=ns))
    ok(nftrec("status", state=state, ns=ns))


def _break_history(state: Path, ns: str) -> Path:
    from reconciler.engine.state import StateStore

    (entry,) = StateStore(state, netns=ns, table="nftrec").history()
    entry.path.write_text("garbage")
    return entry.path


def test_corrupt_history_file_plan_falls_back_to_the_kernel(applied):
    """A damaged history entry (the last applied ruleset) is reported, never a traceback,
    and `plan` still compares with the kernel (SPEC §5: never trusted, rebuilt from the
    kernel). BUG: plan's fast path (apply.read_live_state) lets StateCorrupt from
    store.history() escape, so plan exits 1 instead of reading the kernel."""
    ns, state, d = applied
    path = _break_history(state, ns)
    p = nftrec("status", state=state, ns=ns)
    assert p.returncode in (0, 1, 2) and str(path) in p.stderr, p.stderr
    assert_clean(d, state, ns)


def test_corrupt_history_file_is_moved_aside_by_apply(applied, tmp_path):
    """After a successful apply the state is whole again: status works (exit 0).
    BUG: nothing moves a damaged history entry aside (the message says nftrec does), so
    store.history() raises on it until it is pruned: status exits 1 after every apply."""
    ns, state, d = applied
    path = _break_history(state, ns)
    b = tmp_path / "b"
    shutil.copytree(d, b)
    _add_endpoint(b)
    ok(nftrec("apply", str(b), state=state, ns=ns))
    p = ok(nftrec("status", state=state, ns=ns))
    assert "drift:     no" in p.stdout
    assert not path.exists() and list(path.parent.glob(path.name + ".corrupt-*"))
    assert_clean(b, state, ns)


# --- bad --netns values ------------------------------------------------------------------------


@pytest.mark.parametrize("command", [("apply", str(EDGE)), ("status",), ("cleanup",), ("plan", str(EDGE))])
def test_bad_netns_name_is_a_clear_error(state, command, name="../etc"):
    """A --netns value that cannot name a namespace is one clear line (usage error 64, or
    1), never a traceback. BUG: apply/status/cleanup build the state path first and
    state.namespace_dir's ValueError escapes as a traceback (exit 1)."""
    p = subprocess.run([NFTREC, "--state-dir", str(state), *command, "--netns", name, "--config", str(CONFIG)],
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode in (1, EXIT_USAGE), p.stderr
    assert name in p.stderr


def test_netns_given_as_a_path(netns, state, tmp_path):
    """nft.Libnftables accepts `--netns /run/netns/NAME` (a path); the rest of nftrec must
    either work with it or refuse it cleanly — never a traceback."""
    d = copy_edge(tmp_path)
    p = subprocess.run([NFTREC, "--state-dir", str(state), "apply", str(d), "--netns", f"/run/netns/{netns}",
                        "--config", str(CONFIG)], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode in (0, 1, EXIT_USAGE), p.stderr


def test_state_of_a_namespace_named_host_is_not_the_hosts(tmp_path):
    """`--netns host` acts in /run/netns/host (nft.py), so its state must not be the host
    namespace's state (state.namespace_dir's docstring promises named namespaces "live one
    level down so that `ip netns add host` cannot collide"). BUG: namespace_dir maps
    netns "host" to <root>/host, the host's own directory (and lock), and a saved plan
    records the host as "host" too, so the two are indistinguishable."""
    from reconciler.engine.state import StateStore

    host = StateStore(tmp_path, netns=None, table="nftrec")
    named = StateStore(tmp_path, netns="host", table="nftrec")
    assert named.dir != host.dir
    assert named.lock_path != host.lock_path


# --- plan's fast path (apply.read_live_state / kernel_token) --------------------------------


def _fast(ns: str, state: Path) -> bool:
    """Would `plan` take the fast path now (skip listing the table)?"""
    from reconciler.engine.apply import read_live_state
    from reconciler.engine import Target

    target = Target(ns, "nftrec", state)
    nft = target.nft()
    try:
        return read_live_state(nft, target, refresh=False)[1]
    finally:
        nft.close()


def test_fast_path_only_while_nothing_committed_since_apply(applied):
    netns, state, d = applied
    assert _fast(netns, state)
    in_ns(netns, "nft", "add", "table", "ip", "somebody-else")  # another table: generation bumps
    assert not _fast(netns, state)
    assert_clean(d, state, netns)
    in_ns(netns, "nft", "delete", "element", "ip", "nftrec", "cluster-ips", "{ 10.96.0.10 }")  # hand edit
    ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=netns), 2)
    ok(nftrec("apply", str(d), state=state, ns=netns))
    assert _fast(netns, state)


def test_fast_path_is_not_fooled_by_a_recreated_namespace(state, tmp_path):
    """`ip netns del X; ip netns add X` often hands the new namespace the old one's inode
    number, and a fresh namespace counts generations from the start again: after as many
    commits as nftrec's apply made, inode + generation matched the state and `plan` said
    "No changes" for an empty kernel."""
    import uuid

    from nsutil import sh

    d = copy_edge(tmp_path)
    name = f"nftrec-t-{uuid.uuid4().hex[:8]}"
    path = Path("/run/netns") / name
    sh("ip", "netns", "add", name)
    try:
        ok(nftrec("apply", str(d), state=state, ns=name))
        inode = path.stat().st_ino
        gen = json.loads(next(state.rglob("status.json")).read_text())["kernelGeneration"] & 0xFFFFFFFF
        for _ in range(8):  # try to get the same inode back, as happens in practice
            sh("ip", "netns", "del", name)
            time.sleep(0.5)
            sh("ip", "netns", "add", name)
            if path.stat().st_ino == inode:
                break
        from reconciler.kernel import Libnftables

        with Libnftables(name) as nft:
            i = 0
            while nft.generation() < gen:
                in_ns(name, "nft", "add", "table", "ip", f"t{i}")
                i += 1
            assert nft.generation() == gen
        assert not _fast(name, state)
        p = ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=name), 2)
        assert "+ table ip " in p.stdout
    finally:
        sh("ip", "netns", "del", name, check=False)


def test_state_copied_from_another_namespace_is_not_trusted(applied, netns2):
    netns, state, d = applied
    src = next(p for p in (state / "netns").iterdir() if p.name == netns)
    shutil.copytree(src, state / "netns" / netns2)
    p = ok(nftrec("plan", str(d), "--detailed-exitcode", state=state, ns=netns2), 2)
    assert "cannot be trusted" in p.stderr and "Plan: 8 to add" in p.stdout
    assert not _fast(netns2, state)


def test_without_cap_net_admin_errors_say_what_to_do(applied):
    """EPERM: run inside the namespace (no --netns) with CAP_NET_ADMIN dropped."""
    netns, state, d = applied
    drop = ["setpriv", "--bounding-set=-net_admin,-sys_admin", "--inh-caps=-net_admin,-sys_admin"]
    for args in (["plan", str(d), "--refresh"], ["plan", str(d)], ["apply", str(d)], ["cleanup"]):
        p = in_ns(netns, *drop, "env", "NO_COLOR=1", NFTREC, "--state-dir", str(state), *args,
                  "--config", str(CONFIG), check=False)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        assert "Operation not permitted" in p.stderr and "CAP_NET_ADMIN" in p.stderr and "run it as root" in p.stderr, p.stderr
    # and through --netns: entering the namespace needs CAP_SYS_ADMIN
    p = sh(*drop, "env", "NO_COLOR=1", NFTREC, "--state-dir", str(state), "plan", str(d), "--netns", netns,
           "--config", str(CONFIG), check=False)
    assert p.returncode == 1 and "cannot enter network namespace" in p.stderr and "run it as root" in p.stderr, p.stderr


def test_apply_fast_path_recovers_when_the_recorded_state_is_wrong(applied):
    """apply plans from the recorded ruleset while the kernel's generation is unchanged.
    If that record is wrong (here: it claims an extra element the kernel never had), the
    transaction fails; apply must then list the kernel, re-plan and succeed."""
    from reconciler.kernel import kernel_token
    from reconciler.kernel import Libnftables
    from reconciler.compile.ruleset import Element
    from reconciler.engine.state import StateStore

    ns, state, d = applied
    store = StateStore(state, netns=ns, table="nftrec")
    wrong = store.load_ruleset(store.history()[-1])
    # an element the kernel never had, in a set whose removals are written as `delete
    # element` (a set losing elements is rewritten whole when it is small and declarable,
    # changes.rewritten_sets, which would not fail): the transaction fails
    wrong.tables["ip"].sets["no-endpoint-services"].add(Element(("10.96.99.99", "tcp", "80"), "goto reject-chain", "x/y:80"))
    with Libnftables(ns) as nft:
        token = kernel_token(nft)
    assert token is not None
    store.record_applied("forged", wrong, None, token)  # same generation: the fast path trusts it
    before = ruleset(ns)
    p = ok(nftrec("apply", str(d), state=state, ns=ns))
    assert "listing the kernel's tables and planning again" in p.stderr
    assert "10.96.99.99" not in ruleset(ns) and ruleset(ns) == before
    assert_clean(d, state, ns)
