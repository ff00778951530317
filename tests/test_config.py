"""Node config: defaults, durations, validation, and address discovery (mocked, and once
for real inside a throwaway network namespace)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from reconciler.intake import config as cfgmod
from reconciler.intake.config import load_node_config, parse_duration

from nsutil import in_ns


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return str(p)


def fake(*, host="Edge-7.example.com", ips=("192.0.2.7", "2001:db8::7")):
    return {"hostname": lambda: host, "discover_ips": lambda: tuple(ips)}


@pytest.mark.parametrize("text,seconds", [("1s", 1.0), ("500ms", 0.5), ("1h", 3600.0), ("1m30s", 90.0),
                                          ("1.5s", 1.5), ("2h45m", 9900.0), (3, 3.0), ("100us", 1e-4)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "1", "1d", "s", "1 s", "-1s", True])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_defaults_without_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cfgmod, "DEFAULT_PATH", str(tmp_path / "absent.yaml"))
    cfg, problems = load_node_config(None, **fake())
    assert not problems
    assert cfg.node_name == "edge-7"  # hostname, lower-case, first label
    assert cfg.node_ips == ("192.0.2.7", "2001:db8::7")
    assert cfg.node_port_addresses == ("primary",) and cfg.table_name == "nftrec"
    assert (cfg.min_sync_period, cfg.sync_period, cfg.full_sync_period) == (1.0, 30.0, 3600.0)


def test_default_path_used_when_present(tmp_path, monkeypatch):
    p = write(tmp_path, "nodeName: from-default\n")
    monkeypatch.setattr(cfgmod, "DEFAULT_PATH", p)
    cfg, problems = load_node_config(None, **fake())
    assert not problems and cfg.node_name == "from-default"


def test_full_config(tmp_path):
    p = write(tmp_path, """\
apiVersion: nftrec/v1alpha1
kind: NodeConfig
nodeName: edge-1
nodeIPs: [192.168.50.2, "2001:0db8:50::2"]
clusterCIDRs: [10.244.1.0/16]
serviceCIDRs: [10.96.0.0/16]
nodePortAddresses: [192.168.50.0/24, "2001:db8:50::/64"]
masqueradeAll: true
masqueradeBit: 15
tableName: edge
zone: zone-a
minSyncPeriod: 500ms
syncPeriod: 1m30s
fullSyncPeriod: 2h
x-anything: {ignored: true}
""")
    cfg, problems = load_node_config(p, **fake())
    assert not problems
    assert cfg.node_ips == ("192.168.50.2", "2001:db8:50::2")  # canonical, not discovered
    assert cfg.cluster_cidrs == ("10.244.0.0/16",)  # network form
    assert cfg.node_port_addresses == ("192.168.50.0/24", "2001:db8:50::/64")
    assert cfg.host_addresses is None and not cfg.node_ips_discovered  # nothing listed unless asked
    assert (cfg.masquerade_all, cfg.masquerade_bit, cfg.table_name, cfg.zone) == (True, 15, "edge", "zone-a")
    assert (cfg.min_sync_period, cfg.sync_period, cfg.full_sync_period) == (0.5, 90.0, 7200.0)


def test_interface_addresses_listed_only_when_asked(tmp_path):
    p = write(tmp_path, "nodeName: n\nnodePortAddresses: [192.0.2.0/24]\n")
    pairs = (("eth0", "192.0.2.7"), ("eth1", "192.0.2.9"))
    cfg, problems = load_node_config(p, discover_addresses=lambda: pairs, **fake())
    assert not problems and cfg.host_addresses == pairs and cfg.node_ips_discovered
    cfg, _ = load_node_config(p, discover=False, discover_addresses=lambda: pairs, **fake())
    assert cfg.host_addresses is None  # validate/render: no kernel

    def broken():
        raise OSError("netlink says no")
    cfg, problems = load_node_config(p, discover_addresses=broken, **fake())
    assert cfg.host_addresses is None
    assert [(x.severity, x.field) for x in problems] == [("warning", "nodePortAddresses")]
    assert "nodeIPs stand in" in problems[0].message
    # an empty list is kube-proxy's default, ["primary"]
    cfg, _ = load_node_config(write(tmp_path, "nodePortAddresses: []\n"), **fake())
    assert cfg.node_port_addresses == ("primary",)


def test_discovery_can_find_nothing(tmp_path):
    p = write(tmp_path, "nodeName: n\n")
    cfg, problems = load_node_config(p, **fake(ips=()))
    assert not problems and cfg.node_ips == ()
    cfg, problems = load_node_config(p, discover=False, **fake())
    assert cfg.node_ips == ()


@pytest.mark.parametrize("text,where,what", [
    ("nodeName: n\nbogus: 1\n", ":2:1: NodeConfig: bogus:", "unknown key 'bogus'"),
    ("nodeIPs: [010.0.0.1]\n", ":1:11: NodeConfig: nodeIPs[0]:", "leading zeros"),
    ("serviceCIDRs: [10.96.0.0/40]\n", ":1:16: NodeConfig: serviceCIDRs[0]:", "is not a valid CIDR"),
    ("nodePortAddresses: [primery]\n", ":1:21: NodeConfig: nodePortAddresses[0]:", "is not \"primary\" or a CIDR"),
    # kube-proxy's validation: "primary" only on its own
    ("nodePortAddresses: [10.0.0.0/8, primary]\n", ":1:33: NodeConfig: nodePortAddresses[1]:",
     "can't use both 'primary' and CIDRs"),
    ("masqueradeBit: 32\n", ":1:16: NodeConfig: masqueradeBit:", "out of range"),
    ("syncPeriod: 1d\n", ":1:13: NodeConfig: syncPeriod:", "is not a duration"),
    ("syncPeriod: 0s\n", ":1:1: NodeConfig: syncPeriod:", "longer than 0s"),
    ("tableName: 'a b'\n", ":1:12: NodeConfig: tableName:", "is not a letter then"),
    ("nodeIPs: [192.0.2.1, 192.0.2.2]\n", ":1:1: NodeConfig: nodeIPs:", "two addresses of one family"),
    ("nodeName: a\nnodeName: b\n", ":2:1: NodeConfig:", "appears twice"),
    ("- a\n", ":1:1: NodeConfig:", "must be a mapping"),
    ("a: [\n", ":2:1: NodeConfig:", "YAML syntax error"),
    ("kind: Service\n", ":1:7: NodeConfig: kind:", "use NodeConfig"),
    ("nodeLabels: {'bad key!': x}\n", ":1:1: NodeConfig: nodeLabels:", "'bad key!' is not a label key"),
    ("nodeLabels: {example.com/: x}\n", ":1:1: NodeConfig: nodeLabels:", "is not a label key"),
    ("nodeLabels: {site: -lyon}\n", ":1:20: NodeConfig: nodeLabels.site:", "'-lyon' is not a label value"),
    ("nodeLabels: {ring: 12}\n", ":1:20: NodeConfig: nodeLabels.ring:", "must be a string"),
    ("nodeLabels: [site]\n", ":1:1: NodeConfig: nodeLabels:", "must be a mapping"),
])
def test_invalid_configs(tmp_path, text, where, what):
    p = write(tmp_path, text)
    _, problems = load_node_config(p, **fake())
    texts = [x.format_text() for x in problems]
    assert any(t.startswith(p + where) and what in t for t in texts), texts


def test_missing_file_is_an_error(tmp_path):
    _, problems = load_node_config(str(tmp_path / "nope.yaml"), **fake())
    assert problems and "cannot read the node config" in problems[0].message


DISCOVER = "import json; from reconciler.intake.config import discover_node_ips; print(json.dumps(discover_node_ips()))"


@pytest.mark.kernel
def test_discovery_in_a_real_netns(netns):
    """pyroute2 against a real kernel, inside a throwaway namespace (never the host)."""
    run = lambda: json.loads(in_ns(netns, sys.executable, "-c", DISCOVER, check=True).stdout)  # noqa: E731
    assert run() == []  # loopback only: nothing, and no error
    in_ns(netns, "ip", "link", "add", "dummy0", "type", "veth", "peer", "name", "peer0")  # both ends inside
    in_ns(netns, "ip", "link", "set", "dummy0", "up")
    in_ns(netns, "ip", "link", "set", "peer0", "up")
    in_ns(netns, "ip", "addr", "add", "192.0.2.10/24", "dev", "dummy0")
    in_ns(netns, "ip", "addr", "add", "198.51.100.10/24", "dev", "dummy0")
    in_ns(netns, "ip", "-6", "addr", "add", "2001:db8::10/64", "dev", "dummy0", "nodad")
    in_ns(netns, "ip", "route", "add", "default", "via", "198.51.100.1", "src", "198.51.100.10")
    ips = run()
    assert ips[0] == "198.51.100.10"  # the default route's source wins over the first address
    assert ips[1] == "2001:db8::10"  # no IPv6 default route: the first global address


def test_config_path_object_and_problem_order(tmp_path):
    # the CLI hands a Path; a missing file must be a clean problem, not a traceback
    from pathlib import Path

    _, problems = load_node_config(Path(tmp_path / "missing.yaml"), discover=False)
    assert problems and all(isinstance(p.file, str) for p in problems)
    assert problems[0].format_text().startswith(f"{tmp_path}/missing.yaml: ")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tableName: 'a;b'\nmasqueradeBit: 99\nzone: 'a b'\n")
    _, problems = load_node_config(Path(cfg), discover=False)
    assert [p.line for p in problems] == [1, 2, 3]


def test_null_config_values_mean_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodeName: edge-1\nnodeIPs: null\nclusterCIDRs: null\nmasqueradeBit: null\n")
    c, problems = load_node_config(str(cfg), discover=True, discover_ips=lambda: ("192.0.2.1",))
    assert not problems and c.node_ips == ("192.0.2.1",) and c.masquerade_bit == 14 and c.cluster_cidrs == ()


EXAMPLE_CONFIGS = sorted(Path(__file__).resolve().parent.parent.joinpath("examples").glob("*.config.yaml"))
EXTRA = ("nodePortAddresses: [192.0.2.0/24, \"2001:DB8::/64\"]\nhealthChecks:\n  - tcp: 10.96.0.10:53\n"
         "  - url: http://10.96.0.1/healthz\nsyncPeriod: 2m\nlayout: kube-proxy\n"
         "nodeLabels: {site: lyon, example.com/ring: canary}\n")


@pytest.mark.parametrize("source", [*EXAMPLE_CONFIGS, "extra"], ids=lambda p: getattr(p, "name", p))
def test_the_settings_cache_gives_the_same_config(tmp_path, source):
    """A cache hit (no YAML, no schema) builds the config a full check builds, and the
    no-op fast path's digest of it is the same."""
    from reconciler.intake import config_digest

    text = source.read_text() if isinstance(source, Path) else "nodeName: n1\n" + EXTRA
    path = write(tmp_path, text)
    cache = tmp_path / "cache"
    plain, problems = load_node_config(path, **fake())
    assert problems == []
    miss, _ = load_node_config(path, cache_dir=cache, **fake())
    [entry] = list(cache.rglob("*.jsonl"))
    hit, problems = load_node_config(path, cache_dir=cache, **fake())
    assert problems == [] and plain == miss == hit and plain.source == hit.source
    assert config_digest(plain, strict=False) == config_digest(hit, strict=False)
    # a hit really skips the check: an entry with other settings is believed (it is keyed by the bytes)
    head, settings = entry.read_text().split("\n")
    doc = json.loads(settings)
    doc["zone"] = "from-the-cache"
    body = json.dumps(doc)
    header = json.loads(head)
    header["sha256"] = hashlib.sha256(body.encode()).hexdigest()
    entry.write_text(json.dumps(header) + "\n" + body)
    assert load_node_config(path, cache_dir=cache, **fake())[0].zone == "from-the-cache"
    write(tmp_path, text + "\n# edited\n")  # other bytes: another key, checked again
    assert load_node_config(path, cache_dir=cache, **fake())[0] == plain


def test_a_config_with_problems_is_never_cached(tmp_path):
    path = write(tmp_path, "nodeName: n1\nnodeIPs: [10.0.0.1, 10.0.0.2]\n")  # two IPv4: an error after the schema
    cache = tmp_path / "cache"
    for _ in range(2):
        _, problems = load_node_config(path, cache_dir=cache, **fake())
        assert any("two addresses of one family" in p.message for p in problems)
    assert not cache.exists() or list(cache.rglob("*.jsonl")) == []


def test_node_labels_as_kubernetes_writes_them(tmp_path):
    """nodeLabels: prefixed and plain keys, empty and dotted values, kept sorted; none by default."""
    p = write(tmp_path, "nodeName: n1\nnodeLabels:\n  site: lyon\n  example.com/ring: canary\n"
                        "  topology.kubernetes.io/zone: eu-west-1a\n  empty: ''\n  v: '1.2'\n")
    cfg, problems = load_node_config(p, **fake())
    assert problems == []
    assert cfg.node_labels == (("empty", ""), ("example.com/ring", "canary"), ("site", "lyon"),
                               ("topology.kubernetes.io/zone", "eu-west-1a"), ("v", "1.2"))
    assert load_node_config(write(tmp_path, "nodeName: n1\n"), **fake())[0].node_labels == ()
