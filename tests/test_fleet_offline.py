"""The offline review of a fleet: the NodeInventory loader, the shared parse (every node's
read equals read_inventory(identity=) for that node, on a fixed fleet and random ones),
`validate --fleet` (each problem once, with its nodes) and `diff --fleet` (per node the
plan a one-node diff makes, identical plans grouped; text, JSON, Markdown, --git)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.engine.fleetreview import compress, run_diff_fleet, run_validate_fleet
from reconciler.intake import cache as cache_module
from reconciler.intake.fleet import Identity
from reconciler.intake.fleetview import read_git, read_tree
from reconciler.intake.inventory import read_inventory, read_revision
from reconciler.intake.nodeinventory import load_node_inventory

FLEET = """\
apiVersion: nftrec/v1alpha1
kind: Fleet
layers:
- path: base
- path: sites/${labels.site}
- path: canary
  selector: {matchLabels: {ring: canary}}
- path: nodes/${nodeName}
  optional: true
variables: {dnsIP: 172.30.0.10}
"""


def service(name: str, ip: str, port: int, ns: str = "default", annotations: str = "") -> str:
    meta = f"{{name: {name}, namespace: {ns}{', annotations: {' + annotations + '}' if annotations else ''}}}"
    return (f"apiVersion: v1\nkind: Service\nmetadata: {meta}\nspec:\n  clusterIP: {ip}\n"
            f"  ports: [{{port: {port}, protocol: TCP}}]\n")


def slice_(name: str, svc: str, ip: str, port: int, node: str) -> str:
    return (f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: default, "
            f"labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: IPv4\nendpoints:\n"
            f"- addresses: [{ip}]\n  nodeName: {node}\nports: [{{port: {port}, protocol: TCP}}]\n")


REMOVE_WEB = ("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default, annotations: "
              "{fleet.nftrec.io/remove: \"true\"}}\n")


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def example(root: Path) -> Path:
    """A base, two sites (one with a per-node IP from a label), a canary layer replacing
    web, a per-node layer removing it."""
    return write(root, {
        "fleet.yaml": FLEET,
        "base/svc.yaml": service("web", "172.30.0.20", 80) + "---\n" + service("dns", "${vars.dnsIP}", 53, "kube-system"),
        "sites/lyon/svc.yaml": service("edge", "172.30.1.1", 443, annotations='site: "${labels.site}"')
        + "  internalTrafficPolicy: Local\n---\n"
        + slice_("edge-1", "edge", "10.0.0.1", 443, "lyon-1"),
        "sites/paris/svc.yaml": service("edge", "${labels.ip}", 443),
        "canary/web.yaml": service("web", "172.30.0.20", 8080),
        "nodes/lyon-2/rm.yaml": REMOVE_WEB,
        "elsewhere/broken.yaml": "this: [is not read",
    })


NODES = [Identity("lyon-1", (("site", "lyon"),)), Identity("lyon-2", (("site", "lyon"),)),
         Identity("lyon-3", (("site", "lyon"),)), Identity("lyon-4", (("ring", "canary"), ("site", "lyon"))),
         Identity("paris-1", (("ip", "172.30.2.1"), ("site", "paris"))),
         Identity("paris-2", (("ip", "172.30.2.1"), ("site", "paris"))),
         Identity("paris-3", (("ip", "1.2.3"), ("site", "paris"))), Identity("nice-1", (("site", "nice"),))]


def inventory_text(nodes: list[Identity]) -> str:
    lines = ["apiVersion: nftrec/v1alpha1", "kind: NodeInventory", "nodes:"]
    for n in nodes:
        labels = ", ".join(f"{k}: {json.dumps(v)}" for k, v in n.labels)
        lines.append(f"- {{name: {n.name}, labels: {{{labels}}}}}")
    return "\n".join(lines) + "\n"


def same_read(a, b) -> None:
    assert a.inventory.services == b.inventory.services
    assert a.inventory.endpoint_slices == b.inventory.endpoint_slices
    assert a.inventory.service_cidrs == b.inventory.service_cidrs
    assert a.inventory.revision == b.inventory.revision
    assert a.problems == b.problems
    assert (a.documents, a.files, a.digest) == (b.documents, b.files, b.digest)


# --- NodeInventory -------------------------------------------------------------------------


def test_inventory_loads_names_and_labels(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(inventory_text(NODES[:2]) + "x-note: ignored\n")
    nodes, problems = load_node_inventory(p)
    assert nodes == NODES[:2] and problems == []


def test_inventory_duplicate_name_names_both_lines(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(inventory_text([NODES[0], NODES[1], NODES[0]]))
    nodes, problems = load_node_inventory(p)
    assert nodes == []
    assert [(x.file, x.line, x.field) for x in problems] == [(str(p), 6, "nodes[2].name")]
    assert "lyon-1 is listed twice (lines 4 and 6)" in problems[0].message


def test_inventory_bad_label_and_unknown_key_with_file_line(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeInventory\nnodes:\n- name: a\n  labels: {site: \"x y\"}\n"
                 "- name: b\n  zone: z\n")
    nodes, problems = load_node_inventory(p)
    assert nodes == []
    assert [(x.line, x.field) for x in problems] == [(5, "nodes[0].labels.site"), (7, "nodes[1].zone")]
    assert all(x.is_error and x.file == str(p) for x in problems)


# --- the shared parse ----------------------------------------------------------------------


def test_each_node_reads_as_read_inventory_does(tmp_path):
    root = example(tmp_path / "fleet")
    tree = read_tree(root)
    for n in NODES:
        same_read(tree.view(n).result, read_inventory(root, identity=n))


def test_identical_projections_share_one_read_and_each_file_is_parsed_once(tmp_path, monkeypatch):
    root = example(tmp_path / "fleet")
    parsed: list[str] = []
    real = cache_module.parse_file
    monkeypatch.setattr("reconciler.intake.fleetview.parse_file", lambda d, r: parsed.append(d) or real(d, r))
    tree = read_tree(root)
    views = [tree.view(n) for n in NODES]
    assert len(parsed) == len(set(parsed)) == 5  # every file of a layer some node takes; never elsewhere/
    # lyon-1 and lyon-3 differ only by an optional per-node layer that is not there; the
    # paris nodes with one ip share; paris-3 (a bad ip) and the others each have their own
    assert views[0] is views[2] and views[4] is views[5]
    assert len({id(v) for v in views}) == 6
    assert views[0].nodes == ["lyon-1", "lyon-3"]


FILES = st.sampled_from(["a", "b"])
SITES = st.sampled_from(["lyon", "paris", "nice"])
NAMES = st.sampled_from(["web", "dns", "edge"])


@st.composite
def fleets(draw):
    """A random fleet root: 1-4 layers (static or by site label, some with selectors,
    some optional), Services using ${labels.site} or ${vars.v} or nothing, removal stubs;
    and 1-6 nodes."""
    files: dict[str, str] = {}
    layers = []
    for i in range(draw(st.integers(1, 4))):
        by_site = draw(st.booleans())
        path = f"l{i}/${{labels.site}}" if by_site else f"l{i}"
        sel = draw(st.sampled_from(["", "{matchLabels: {ring: canary}}",
                                    "{matchExpressions: [{key: ring, operator: DoesNotExist}]}"]))
        optional = draw(st.booleans())
        layers.append(f"- path: {path}" + (f"\n  selector: {sel}" if sel else "") + ("\n  optional: true" if optional else ""))
        for site in (["lyon", "paris"] if by_site else [""]):
            d = f"l{i}/{site}".rstrip("/")
            for _ in range(draw(st.integers(0, 2))):
                name, port = draw(NAMES), draw(st.integers(1, 3))
                ip = draw(st.sampled_from(["172.30.0.1", "${vars.v}", "${labels.ip}"]))
                doc = REMOVE_WEB.replace("name: web", f"name: {name}") if draw(st.integers(0, 5)) == 0 else \
                    service(name, ip, port, annotations=draw(st.sampled_from(["", 'a: "${labels.site}"', 'b: "$${x}"'])))
                files[f"{d}/{draw(FILES)}{len(files)}.yaml"] = doc
    files["fleet.yaml"] = "apiVersion: nftrec/v1alpha1\nkind: Fleet\nlayers:\n" + "\n".join(layers) + \
        "\nvariables: {v: 172.30.9.9}\n"
    nodes = []
    for k in range(draw(st.integers(1, 6))):
        labels = {"site": draw(SITES)}
        if draw(st.booleans()):
            labels["ring"] = "canary"
        ip = draw(st.sampled_from([None, "172.30.5.5", "bad ip"]))
        if ip:
            labels["ip"] = ip
        nodes.append(Identity(f"n{k}", tuple(sorted(labels.items()))))
    return files, nodes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_random_fleets_each_node_reads_as_read_inventory_does(case):
    files, nodes = case
    with tempfile.TemporaryDirectory() as d:
        root = write(Path(d), files)
        tree = read_tree(root)
        for n in nodes:
            same_read(tree.view(n).result, read_inventory(root, identity=n))


def test_plain_root_every_node_reads_it_all(tmp_path):
    root = write(tmp_path / "plain", {"svc.yaml": service("web", "172.30.0.20", 80)})
    tree = read_tree(root)
    views = {id(tree.view(n)) for n in NODES}
    assert len(views) == 1
    same_read(tree.view(NODES[0]).result, read_inventory(root))


# --- validate --fleet ----------------------------------------------------------------------


def run(fn, *args, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = fn(*args, **kw, **({"stream": out} if fn is run_validate_fleet else {"out_stream": out}))
    return rc, out.getvalue()


def test_validate_fleet_reports_each_problem_once_with_its_nodes(tmp_path):
    root = example(tmp_path / "fleet")
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(NODES))
    rc, text = run(run_validate_fleet, inv, root)
    assert rc == 1
    lines = text.splitlines()
    assert lines[0] == (f"{root}/fleet.yaml:5:1: Fleet: layers: layer sites/nice does not exist in this revision; create "
                        "it or mark the layer `optional: true` — nodes: nice-1 (1 node)")
    assert lines[1].startswith(f"{root}/sites/paris/svc.yaml:5:14: Service default/edge: spec.clusterIP: '1.2.3' is not")
    assert "${labels.ip} = '1.2.3', the node's label ip" in lines[1] and lines[1].endswith(" — nodes: paris-3 (1 node)")
    assert lines[2] == f"{root}: 8 nodes (6 distinct projections), 2 errors, 0 warnings"
    rc, text = run(run_validate_fleet, inv, root, output="json")
    doc = json.loads(text)
    assert (rc, doc["valid"], doc["errors"], doc["nodes"]) == (1, False, 2, 8)
    assert [p["nodes"] for p in doc["problems"]] == [["nice-1"], ["paris-3"]]


def test_validate_fleet_one_problem_many_nodes_and_valid_exit_0(tmp_path):
    root = example(tmp_path / "fleet")
    (root / "base" / "svc.yaml").write_text(service("web", "172.30.0.20", 80) + "---\n"
                                            + service("dns", "172.30.0.300", 53, "kube-system"))
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(NODES[:2] + NODES[4:6]))
    rc, text = run(run_validate_fleet, inv, root)
    assert rc == 1 and text.count("172.30.0.300") == 1
    assert "— nodes: lyon-1, lyon-2, paris-1, paris-2 (4 nodes)" in text
    shutil.rmtree(root)
    example(root)
    rc, text = run(run_validate_fleet, inv, root)
    assert (rc, text) == (0, f"{root}: 4 nodes (3 distinct projections), 0 errors, 0 warnings\n")


# --- diff --fleet --------------------------------------------------------------------------

OK_NODES = NODES[:6]


def change(root: Path) -> None:
    """One Service edited in base, one added to one site, an endpoint on lyon-1 added
    (edge's internalTrafficPolicy is Local: only lyon-1's plan shows it)."""
    svc = root / "base" / "svc.yaml"
    svc.write_text(svc.read_text().replace("port: 80,", "port: 81,"))
    site = root / "sites" / "lyon" / "svc.yaml"
    text = site.read_text().replace("- addresses: [10.0.0.1]\n", "- addresses: [10.0.0.2]\n  nodeName: lyon-1\n"
                                    "- addresses: [10.0.0.1]\n")
    site.write_text(text + "---\n" + service("dns2", "172.30.1.2", 53))


def one_node_plan(old: Path, new: Path, node: Identity) -> dict:
    """What `nftrec diff` computes for one node (review.run_diff's steps), independently."""
    from reconciler.compile import compile_ruleset, derived_topology_hints, relocate
    from reconciler.engine.plan import make_plan, to_json
    from reconciler.intake import load_node_config
    from reconciler.kernel import canonical

    config, _ = load_node_config(None, discover=False)
    config = replace(config, node_name=node.name)
    o, n = (read_inventory(d, identity=node).inventory for d in (old, new))
    ro, rn = compile_ruleset(o, config), compile_ruleset(n, config)
    plan = make_plan(relocate(rn, ro), canonical(ro), {s.key: s for s in n.services},
                     derived_topology_hints(n.services, n.endpoint_slices, config))
    return to_json(plan)


@pytest.fixture
def sides(tmp_path):
    old = example(tmp_path / "old")
    new = tmp_path / "new"
    shutil.copytree(old, new)
    change(new)
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(OK_NODES))
    return old, new, inv


def test_diff_fleet_per_node_plan_is_the_one_node_diff(sides):
    old, new, inv = sides
    rc, text = run(run_diff_fleet, str(old), str(new), inv, output="json")
    doc = json.loads(text)
    assert rc == 0 and doc["nodes"] == 6 and doc["changed"]
    by_node = {n: g["plan"] for g in doc["groups"] for n in g["nodes"]}
    assert sorted(by_node) == sorted(n.name for n in OK_NODES)
    for node in OK_NODES:
        got = {k: v for k, v in by_node[node.name].items() if k not in ("old", "new", "table")}
        assert got == one_node_plan(old, new, node), node.name
    # lyon-1 is named by edge's endpoints (internalTrafficPolicy Local): its compile is its own
    assert [g["nodes"] for g in doc["groups"]] == [["lyon-1"], ["lyon-2", "lyon-4"], ["lyon-3"], ["paris-1", "paris-2"]]


POOL = {"web": "172.30.0.1", "dns": "172.30.0.2", "edge": "172.30.0.3", "loc": "172.30.0.4"}


@st.composite
def valid_changes(draw):
    """A valid random fleet (base, sites, canary, per-node dirs) and a change to it: ports
    edited, a Local Service's endpoints moved between nodes."""
    nodes = [Identity(f"n{k}", tuple(sorted({"site": draw(st.sampled_from(["lyon", "paris"])),
                                              **({"ring": "canary"} if draw(st.booleans()) else {})}.items())))
             for k in range(draw(st.integers(1, 5)))]
    dirs = ["base", "sites/lyon", "sites/paris", "canary"] + [f"nodes/{n.name}" for n in nodes if draw(st.booleans())]

    def layer_files(d: str) -> dict[str, str]:
        out = {}
        for name in draw(st.lists(st.sampled_from(sorted(POOL)), unique=True, max_size=3)):
            text = service(name, POOL[name], draw(st.integers(1, 4)))
            if name == "loc":
                text += "  internalTrafficPolicy: Local\n---\n" + slice_(
                    "loc-s", "loc", "10.0.0.9", 80, draw(st.sampled_from([n.name for n in nodes] + ["other"])))
            out[f"{d}/{name}.yaml"] = text
        return out

    old = {"fleet.yaml": FLEET}
    for d in dirs:
        old.update(layer_files(d))
    new = dict(old)
    for d in draw(st.lists(st.sampled_from(dirs), unique=True, max_size=2)):
        new = {k: v for k, v in new.items() if not k.startswith(d + "/")}
        new.update(layer_files(d))
    for side in (old, new):  # every non-optional layer is there
        for d in dirs[:4]:
            side.setdefault(f"{d}/keep.yaml", "")
    return old, new, nodes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_changes())
def test_random_changes_each_nodes_plan_is_the_one_node_diff(case):
    old_files, new_files, nodes = case
    with tempfile.TemporaryDirectory() as d:
        old, new = write(Path(d) / "old", old_files), write(Path(d) / "new", new_files)
        inv = Path(d) / "inv.yaml"
        inv.write_text(inventory_text(nodes))
        rc, text = run(run_diff_fleet, str(old), str(new), inv, output="json")
        assert rc == 0, text
        by_node = {n: g["plan"] for g in json.loads(text)["groups"] for n in g["nodes"]}
        for node in nodes:
            got = {k: v for k, v in by_node[node.name].items() if k not in ("old", "new", "table")}
            assert got == one_node_plan(old, new, node), node.name


def test_diff_fleet_text_groups_and_detailed_exitcode(sides):
    old, new, inv = sides
    rc, text = run(run_diff_fleet, str(old), str(new), inv, detailed=True)
    assert rc == 2
    assert text.splitlines()[0] == "lyon-1 (1 node):" and "~ default/edge endpoints +10.0.0.2:443" in text
    assert "lyon-2, lyon-4 (2 nodes): + default/dns2 ClusterIP 172.30.1.2:53/TCP -> no endpoints (reject)" in text
    assert "paris-1, paris-2 (2 nodes): ~ default/web" in text
    assert text.splitlines()[-1] == "Fleet: 6 nodes, 6 with changes in 4 groups."
    rc, text = run(run_diff_fleet, str(old), str(old), inv, detailed=True)
    assert rc == 0 and text == ("No changes: lyon-1…lyon-4, paris-1, paris-2 (6 nodes)\n"
                                "Fleet: 6 nodes, 0 with changes in 0 groups.\n")


def test_diff_fleet_invalid_side_reports_each_problem_once_and_exits_1(sides, tmp_path):
    old, new, _ = sides
    inv = tmp_path / "all.yaml"
    inv.write_text(inventory_text(NODES))
    rc, text = run(run_diff_fleet, str(old), str(new), inv, output="json")
    doc = json.loads(text)
    assert rc == 1 and doc["valid"] is False
    assert sorted((os.path.relpath(p["file"], tmp_path), p["nodes"]) for p in doc["problems"]) == [
        ("new/fleet.yaml", ["nice-1"]), ("new/sites/paris/svc.yaml", ["paris-3"]),
        ("old/fleet.yaml", ["nice-1"]), ("old/sites/paris/svc.yaml", ["paris-3"])]
    rc, text = run(run_diff_fleet, str(old), str(new), inv)
    assert rc == 1 and text.count("— nodes: paris-3 (1 node)") == 2 and "Fleet: " not in text.splitlines()[-1][:7]


def test_diff_fleet_markdown_is_one_comment_under_githubs_cap(tmp_path):
    """400 nodes, each with its own per-node layer: 400 distinct plans; the comment is
    cut with a count of the groups left out."""
    nodes = [Identity(f"edge-{i:03}", (("site", "lyon"),)) for i in range(400)]
    old = example(tmp_path / "old")
    new = tmp_path / "new"
    shutil.copytree(old, new)
    for n in nodes:
        write(new, {f"nodes/{n.name}/own.yaml": service(f"own-{n.name}", "172.30.7.7", 7000)})
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(nodes))
    rc, text = run(run_diff_fleet, str(old), str(new), inv, output="markdown")
    assert rc == 0 and text.startswith("<!-- nftrec-diff -->\n")
    assert len(text) <= 65536
    assert "more groups" in text and "left out to fit a comment" in text
    assert "#### edge-000 (1 node)" in text


def test_compress_node_names():
    names = [f"edge-{i:03}" for i in range(1, 41)] + ["edge-100", "edge-2", "core", "edge-042", "edge-043"]
    assert compress(names) == "core, edge-2, edge-001…edge-040, edge-042, edge-043, edge-100"
    assert compress(["n10", "n9", "n11", "n8"]) == "n8…n11"


# --- the command line, and --git ------------------------------------------------------------


def nftrec(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1")
    env.pop("NFTREC_STATE_DIR", None)
    return subprocess.run([sys.executable, "-m", "reconciler.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          check=True, capture_output=True, text=True, timeout=60).stdout


def test_cli_validate_fleet_and_diff_fleet_git_range(tmp_path):
    repo = tmp_path / "repo"
    example(repo / "fleet")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    change(repo / "fleet")
    git(repo, "commit", "-q", "-am", "two")
    for rev in ("HEAD~1", "HEAD"):  # read from git, each node as read_revision reads it
        commit = git(repo, "rev-parse", rev).strip()
        tree = read_git(repo / "fleet", rev, commit)
        for n in NODES:
            mine, theirs = tree.view(n).result, read_revision(repo / "fleet", rev, commit, identity=n)
            if theirs.ok:
                same_read(mine, theirs)
            else:  # an invalid node: read_revision stops at a missing layer; the problems agree
                assert mine.problems == theirs.problems
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(OK_NODES))
    r = nftrec("validate", "--fleet", str(inv), str(repo / "fleet"))
    assert r.returncode == 0, r.stderr
    r = nftrec("diff", "--git", str(repo / "fleet"), "HEAD~1..HEAD", "--fleet", str(inv), "--detailed-exitcode")
    assert r.returncode == 2, r.stderr
    assert "lyon-2, lyon-4 (2 nodes): + default/dns2" in r.stdout
    plain = nftrec("diff", str(tmp_path / "nope"), str(repo / "fleet"), "--fleet", str(tmp_path / "missing.yaml"))
    assert plain.returncode == 1 and "missing.yaml" in plain.stderr


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fleet"


@pytest.mark.skipif(not (EXAMPLE / "inventory.yaml").is_file(), reason="examples/fleet is not in this tree")
def test_the_example_fleet_each_node_reads_as_read_inventory_does():
    nodes, problems = load_node_inventory(EXAMPLE / "inventory.yaml")
    assert nodes and problems == []
    tree = read_tree(EXAMPLE)
    for n in nodes:
        same_read(tree.view(n).result, read_inventory(EXAMPLE, identity=n))


def test_cli_fleet_usage_errors(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(OK_NODES))
    r = nftrec("validate", "--fleet", str(inv), "--node", "lyon-1", str(tmp_path))
    assert r.returncode == 64 and "--fleet validates every node of the inventory" in r.stderr
    r = nftrec("validate", "--fleet", str(inv), "-")
    assert r.returncode == 1 and "not standard input" in r.stderr
