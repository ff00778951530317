"""A fleet root (SPEC §2.4) through the one-shot read paths: read_inventory for one node
(only its layers opened, merged, the digest of fleet.yaml and its files), the intake
cache keyed by the node's variables, the no-op digest, and the offline commands'
--node / --labels / --manifests. The projection itself is tests/test_fleet.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NFTREC = str(Path(sys.executable).with_name("nftrec"))

FLEET = """\
apiVersion: nftrec/v1alpha1
kind: Fleet
layers:
- path: base
- path: sites/${labels.site}
- path: nodes/${nodeName}
  optional: true
variables: {dnsIP: 10.96.0.53}
"""


def svc(name: str, ip: str, port: int = 80, ns: str = "default", extra: str = "") -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n{extra}"
            f"spec:\n  clusterIP: {ip}\n  ports:\n  - {{name: p, port: {port}, protocol: TCP}}\n")


def fleet_tree(root: Path) -> Path:
    """base: web, dns (its IP a variable, its name the node's site); sites paris and lyon;
    a node override for edge-2."""
    for d in ("base", "sites/paris", "sites/lyon", "nodes/edge-2"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "fleet.yaml").write_text(FLEET)
    (root / "base" / "web.yaml").write_text(svc("web", "10.96.0.10"))
    (root / "base" / "dns.yaml").write_text(svc("dns-${labels.site}", "${vars.dnsIP}", 53))
    (root / "sites" / "paris" / "web.yaml").write_text(svc("web", "10.96.0.11", 8080))  # replaces base's
    (root / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.12"))
    (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.13"))
    (root / "nodes" / "edge-2" / "gone.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: cache\n  namespace: default\n"
        "  annotations: {fleet.nftrec.io/remove: \"true\"}\n")
    return root


def ident(name: str = "edge-1", site: str = "paris"):
    from reconciler.intake import Identity

    return Identity(name, (("site", site),))


def read(root, identity=None, **kw):
    from reconciler.intake import read_inventory

    return read_inventory(root, identity=identity, **kw)


def test_a_node_reads_its_layers_merged_with_its_variables(tmp_path):
    root = fleet_tree(tmp_path / "f")
    paris = read(root, ident())
    assert paris.ok, [p.format_text() for p in paris.problems]
    keys = sorted(s.key for s in paris.inventory.services)
    assert keys == ["default/cache", "default/dns-paris", "default/web"]
    web = next(s for s in paris.inventory.services if s.key == "default/web")
    assert [p.port for p in web.ports] == [8080] and web.source.file == f"{root}/sites/paris/web.yaml"
    dns = next(s for s in paris.inventory.services if s.key == "default/dns-paris")
    assert dns.cluster_ips == ("10.96.0.53",)
    assert paris.files == 4  # base 2, sites/paris 2; lyon's and edge-2's never read
    edge2 = read(root, ident("edge-2"))
    assert edge2.ok and sorted(s.key for s in edge2.inventory.services) == ["default/dns-paris", "default/web"]
    lyon = read(root, ident("edge-3", "lyon"))
    assert lyon.ok and sorted(s.key for s in lyon.inventory.services) == ["default/dns-lyon", "default/lyon",
                                                                          "default/web"]


def test_the_digest_is_fleet_yaml_and_the_nodes_files(tmp_path):
    from reconciler.intake.load import chunk, tree_digest

    root = fleet_tree(tmp_path / "f")
    res = read(root, ident())
    files = ["fleet.yaml", "base/dns.yaml", "base/web.yaml", "sites/paris/cache.yaml", "sites/paris/web.yaml"]
    chunks = [chunk(f"{root}/{f}", (root / f).read_bytes()) for f in files]
    assert res.digest == tree_digest(chunks, prefix=f"{root}/")
    assert res.inventory.revision == f"sha256:{res.digest}"


def test_files_outside_the_nodes_layers_are_never_opened(tmp_path):
    """Another site's directory holding invalid YAML, a FIFO (opening it would block) and a
    link leaving the tree changes nothing for a Paris node: not its problems, not its digest."""
    root = fleet_tree(tmp_path / "f")
    before = read(root, ident())
    (root / "sites" / "lyon" / "broken.yaml").write_text("kind: [\n")
    os.mkfifo(root / "sites" / "lyon" / "fifo.yaml")
    (root / "sites" / "lyon" / "out.yaml").symlink_to("/etc/hostname")
    (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.99"))
    (root / "other.yaml").write_text("not: [valid\n")  # beside fleet.yaml, in no layer
    after = read(root, ident())
    assert after.ok and after.problems == before.problems and after.digest == before.digest
    lyon = read(root, ident("edge-3", "lyon"))
    assert not lyon.ok and {Path(p.file).name for p in lyon.problems} >= {"broken.yaml", "fifo.yaml", "out.yaml"}


def test_a_fleet_root_without_identity_is_one_clear_error(tmp_path):
    root = fleet_tree(tmp_path / "f")
    res = read(root)
    assert not res.ok and res.files == 0 and len(res.errors) == 1
    msg = res.errors[0].format_text()
    assert "fleet repository (fleet.yaml)" in msg and "nodeName and nodeLabels" in msg and "--node/--labels" in msg


def test_missing_layers_and_links_inside_the_fleet_root(tmp_path):
    root = fleet_tree(tmp_path / "f")
    res = read(root, ident("edge-9", "nice"))  # no sites/nice: an error naming fleet.yaml's line; nodes/ optional
    assert not res.ok
    [err] = res.errors
    assert err.file == f"{root}/fleet.yaml" and err.line == 5 and "sites/nice" in err.message
    shared = root / "shared"
    shared.mkdir()
    (shared / "extra.yaml").write_text(svc("extra", "10.96.0.20"))
    (root / "sites" / "paris" / "extra.yaml").symlink_to("../../shared/extra.yaml")  # inside the fleet root
    res = read(root, ident())
    assert res.ok and "default/extra" in {s.key for s in res.inventory.services}
    (root / "sites" / "paris" / "out.yaml").symlink_to(tmp_path)  # leaves the fleet root
    res = read(root, ident())
    assert not res.ok and "outside the manifest tree" in res.errors[0].message


def test_the_intake_cache_is_keyed_by_the_nodes_variables(tmp_path):
    """The same bytes (base/dns.yaml) read for two sites: each node gets its own
    substitution from a warm cache, and a warm read equals a cold one."""
    root = fleet_tree(tmp_path / "f")
    cache = tmp_path / "cache"
    for _ in range(2):
        for site, name in (("paris", "edge-1"), ("lyon", "edge-3")):
            cold, warm = read(root, ident(name, site)), read(root, ident(name, site), cache_dir=cache)
            assert f"default/dns-{site}" in {s.key for s in warm.inventory.services}
            assert warm.inventory.services == cold.inventory.services and warm.problems == cold.problems
            assert warm.digest == cold.digest


def test_input_digest_is_the_reads_and_ignores_other_sites(tmp_path):
    from reconciler.intake import input_digest

    root = fleet_tree(tmp_path / "f")
    res = read(root, ident())
    d = input_digest(root, identity=ident())
    assert not d.problems and d.digest == res.digest and d.revision == res.inventory.revision
    (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.77"))
    assert input_digest(root, identity=ident()).digest == res.digest  # another site's edit: still a no-op
    (root / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.77"))
    assert input_digest(root, identity=ident()).digest == read(root, ident()).digest != res.digest
    assert input_digest(root).problems  # no identity: the full read decides


def test_a_git_checkout_of_a_fleet_is_clean_for_its_node(tmp_path):
    """The revision of a fleet root in a git checkout is the commit, though the node reads
    only some of the commit's files; an edit in its own layer makes it dirty, in another not."""
    root = fleet_tree(tmp_path / "f")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "0"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env, capture_output=True)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, env=env,
                            capture_output=True, text=True).stdout.strip()
    assert read(root, ident()).inventory.revision == commit
    (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.77"))
    assert read(root, ident()).inventory.revision == commit
    (root / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.77"))
    assert read(root, ident()).inventory.revision.startswith(f"{commit}+dirty:sha256:")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([NFTREC, "--state-dir", "/nonexistent-state", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1", "NFTREC_INTAKE_CACHE": "off"})


def node_config(tmp: Path, name: str = "edge-1", labels: str = "{site: paris}") -> Path:
    p = tmp / "config.yaml"
    p.write_text(f"apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: {name}\nnodeLabels: {labels}\n"
                 "nodeIPs: [192.168.0.2]\nserviceCIDRs: [10.96.0.0/16]\n")
    return p


def test_render_and_validate_take_the_config_identity_or_node_and_labels(tmp_path):
    root = fleet_tree(tmp_path / "f")
    cfg = node_config(tmp_path)
    p = cli("render", "--config", str(cfg), str(root))
    assert p.returncode == 0 and "10.96.0.12" in p.stdout and "10.96.0.13" not in p.stdout, p.stderr
    p = cli("render", "--config", str(cfg), "--node", "edge-3", "--labels", "site=lyon", str(root))
    assert p.returncode == 0 and "10.96.0.13" in p.stdout and "10.96.0.12" not in p.stdout, p.stderr
    p = cli("validate", "--config", str(cfg), "--labels", "site=lyon", str(root))
    assert p.returncode == 0 and "3 objects, 0 errors" in p.stdout, p.stdout + p.stderr
    p = cli("validate", "--config", str(cfg), "--labels", "site=nice", str(root))
    assert p.returncode == 1 and "sites/nice" in p.stdout
    for bad, word in ((["--labels", "site=a b"], "label value"), (["--labels", "-x=1"], "label key"),
                      (["--labels", "site"], "KEY=VALUE"), (["--node", "Edge_1"], "node name")):
        p = cli("render", "--config", str(cfg), *bad, str(root))
        assert p.returncode == 64 and word in p.stderr, p.stderr


def test_render_manifests_prints_the_effective_documents(tmp_path):
    from ruamel.yaml import YAML

    root = fleet_tree(tmp_path / "f")
    cfg = node_config(tmp_path, "edge-2")
    p = cli("render", "--config", str(cfg), "--manifests", str(root))
    assert p.returncode == 0, p.stderr
    comments = [ln for ln in p.stdout.splitlines() if ln.startswith("# ")]
    assert comments == [f"# {root}/base/dns.yaml:1", f"# {root}/sites/paris/web.yaml:1"]  # cache removed by edge-2
    docs = list(YAML(typ="safe").load_all(p.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["dns-paris", "web"]
    assert docs[0]["spec"]["clusterIP"] == "10.96.0.53"
    p = cli("render", "--config", str(cfg), "--manifests", str(tmp_path / "nope"))
    assert p.returncode == 1


@pytest.mark.kernel
def test_the_no_op_fast_path_holds_across_another_sites_edit(netns, tmp_path):
    root = fleet_tree(tmp_path / "f")
    cfg = node_config(tmp_path)
    state = tmp_path / "state"

    def run(*args):
        return subprocess.run([NFTREC, "--state-dir", str(state), *args, "--netns", netns, "--config", str(cfg)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})

    p = run("apply", str(root))
    assert p.returncode == 0, p.stdout + p.stderr
    import json

    def fast() -> bool:
        p = run("plan", "-o", "json", str(root))
        assert p.returncode == 0, p.stdout + p.stderr
        return bool(json.loads(p.stdout).get("fastPath"))

    assert fast()
    (root / "sites" / "lyon" / "lyon.yaml").write_text(svc("lyon", "10.96.0.77"))
    assert fast()  # another site's layer: still the fast path
    (root / "sites" / "paris" / "cache.yaml").write_text(svc("cache", "10.96.0.78"))
    assert not fast()
