"""The no-op fast path of `plan` and `apply` (reconciler/engine/noop.py), against a real
kernel in a throwaway namespace: after an apply, an unchanged directory, config and kernel
answer "No changes" without compiling or listing; any change to one of them, --refresh
and --strict take the normal path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsutil import in_ns
from test_cli_kernel import CONFIG, _add_endpoint, copy_edge, nftrec, ok

pytestmark = pytest.mark.kernel

FAST = "no-op fast path: "
NOT_FAST = "no-op fast path not taken: "


@pytest.fixture(autouse=True)
def debug_logs(monkeypatch):
    monkeypatch.setenv("NFTREC_LOG_LEVEL", "debug")


@pytest.fixture
def applied(netns, tmp_path):
    state = tmp_path / "state"
    d = copy_edge(tmp_path)
    ok(nftrec("apply", str(d), state=state, ns=netns))
    return netns, state, d


def plan(d: Path, state: Path, ns: str, *extra: str, config: bool | Path = True):
    p = nftrec("plan", str(d), "-o", "json", "--detailed-exitcode", *extra, state=state, ns=ns, config=config)
    assert p.returncode in (0, 2), p.stderr
    return p.returncode, json.loads(p.stdout), p.stderr


def test_noop_plan_and_apply_after_apply_take_the_fast_path(applied):
    ns, state, d = applied
    slow_code, slow, _ = plan(d, state, ns, "--refresh")
    assert slow_code == 0 and slow["fastPath"] is False
    code, doc, err = plan(d, state, ns)
    assert code == 0 and doc["fastPath"] is True and FAST in err, err
    assert "intake cache" not in err  # the manifests were hashed, not read as YAML
    # the same document as a plan that compiled and listed, apart from fastPath
    assert {**doc, "fastPath": False} == slow
    text = ok(nftrec("plan", str(d), state=state, ns=ns))
    assert text.stdout == "No changes. The kernel matches the desired ruleset.\n" and FAST in text.stderr
    before = in_ns(ns, "nft", "list", "ruleset").stdout
    p = ok(nftrec("apply", str(d), state=state, ns=ns))
    assert "No changes" in p.stdout and "unchanged since the last apply" in p.stdout and FAST in p.stderr
    assert in_ns(ns, "nft", "list", "ruleset").stdout == before
    status = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=ns)).stdout)
    assert status["drift"] is False and status["lastAppliedRevision"] == doc["revision"]
    # and the fast path keeps holding after a fast apply
    assert plan(d, state, ns)[1]["fastPath"] is True


def test_refresh_reads_compiles_and_lists(applied):
    ns, state, d = applied
    code, doc, err = plan(d, state, ns, "--refresh")
    assert code == 0 and doc["fastPath"] is False and FAST not in err and "intake cache" in err


def test_an_edited_manifest_is_not_a_noop(applied):
    ns, state, d = applied
    _add_endpoint(d)
    code, doc, err = plan(d, state, ns)
    assert code == 2 and doc["fastPath"] is False
    assert NOT_FAST + "the manifests changed" in err
    assert [s["service"] for s in doc["services"]] == ["default/web"]
    p = ok(nftrec("apply", str(d), state=state, ns=ns))
    assert "No changes" not in p.stdout and NOT_FAST in p.stderr
    assert plan(d, state, ns)[1]["fastPath"] is True  # the new input is now the applied one


def test_an_edit_keeping_size_and_mtime_is_not_a_noop(applied):
    import os

    ns, state, d = applied
    f = next(p for p in sorted(d.rglob("*.yaml")) if "10.244.0.11" in p.read_text())
    st = f.stat()
    text = f.read_text()
    f.write_text(text.replace("10.244.0.11", "10.244.0.19", 1))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    code, doc, err = plan(d, state, ns)
    assert code == 2 and doc["fastPath"] is False and NOT_FAST + "the manifests changed" in err


def test_an_edited_config_is_not_a_noop_but_a_comment_is(applied, tmp_path):
    ns, state, d = applied
    cfg = tmp_path / "node.yaml"
    cfg.write_text(CONFIG.read_text() + "# a comment changes the bytes, not the effective config\n")
    code, doc, err = plan(d, state, ns, config=cfg)
    assert code == 0 and doc["fastPath"] is True, err
    # (not nodeIPs: with nodePortAddresses [primary] a node IP that is on no interface of
    # the namespace changes nothing in the ruleset, as in kube-proxy)
    assert "masqueradeBit: 14" in CONFIG.read_text()
    cfg.write_text(CONFIG.read_text().replace("masqueradeBit: 14", "masqueradeBit: 13"))
    code, doc, err = plan(d, state, ns, config=cfg)
    assert code == 2 and doc["fastPath"] is False and NOT_FAST + "the effective node config" in err


def test_strict_after_a_lenient_apply_is_not_a_noop(applied):
    ns, state, d = applied
    p = nftrec("plan", str(d), "--strict", state=state, ns=ns)
    assert p.returncode == 1 and "Deployment" in p.stderr and NOT_FAST in p.stderr


def test_a_kernel_change_by_someone_else_is_not_a_noop(applied):
    ns, state, d = applied
    chain = in_ns(ns, "nft", "-j", "list", "chains", "ip").stdout
    name = next(c["chain"]["name"] for c in json.loads(chain)["nftables"]
                if "chain" in c and c["chain"]["table"] == "nftrec" and "hook" not in c["chain"])
    in_ns(ns, "nft", "add", "rule", "ip", "nftrec", name, "counter")
    code, doc, err = plan(d, state, ns)
    assert code == 2 and doc["fastPath"] is False and NOT_FAST + "the kernel's ruleset generation changed" in err
    ok(nftrec("apply", str(d), state=state, ns=ns))  # repairs it
    assert plan(d, state, ns)[1]["fastPath"] is True


def test_rollback_disables_the_fast_path(applied):
    ns, state, d = applied
    _add_endpoint(d)
    ok(nftrec("apply", str(d), state=state, ns=ns))
    ok(nftrec("apply", "--rollback", state=state, ns=ns))
    code, doc, err = plan(d, state, ns)
    assert code == 2 and doc["fastPath"] is False  # the kernel holds the rollback, not this input


def test_discovered_node_addresses_are_part_of_the_config_digest(netns, tmp_path):
    """Without nodeIPs the addresses are discovered in the namespace: a new primary
    address must not hide behind the fast path."""
    state = tmp_path / "state"
    d = copy_edge(tmp_path)
    cfg = tmp_path / "node.yaml"
    cfg.write_text("".join(line for line in CONFIG.read_text().splitlines(True) if not line.startswith("nodeIPs")))
    in_ns(netns, "ip", "addr", "add", "192.0.2.5/32", "dev", "lo")
    in_ns(netns, "ip", "route", "add", "default", "dev", "lo", "src", "192.0.2.5")
    ok(nftrec("apply", str(d), state=state, ns=netns, config=cfg))
    code, doc, err = plan(d, state, netns, config=cfg)
    assert code == 0 and doc["fastPath"] is True, err
    in_ns(netns, "ip", "addr", "add", "192.0.2.6/32", "dev", "lo")
    in_ns(netns, "ip", "route", "replace", "default", "dev", "lo", "src", "192.0.2.6")
    code, doc, err = plan(d, state, netns, config=cfg)
    assert doc["fastPath"] is False and NOT_FAST + "the effective node config" in err
    assert code == 2  # NodePorts follow the primary address


# --- the no-op through the entry point, and what it imports -----------------------------------

PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: print('IMPORTED', *sorted(m for m in ('typer', 'pyroute2', 'jsonschema')"
         " if m in sys.modules), file=sys.stderr))\n"
         "from reconciler.cli import main\n"
         "sys.argv[0] = 'nftrec'\n"
         "main()\n")


def run_cli(*args: str, state: Path, ns: str, config: Path = CONFIG):
    """`nftrec ARGS` through reconciler.cli.main; stderr ends with the heavy modules the
    process imported."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-c", PROBE, "--state-dir", str(state), *args, "--netns", ns, "--config", str(config)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert "Traceback" not in p.stderr, p.stderr
    imported = p.stderr.rsplit("IMPORTED", 1)[1].split()
    return p.returncode, p.stdout, p.stderr, imported


@pytest.mark.parametrize("args", [("plan",), ("plan", "-o", "json"), ("plan", "--detailed-exitcode", "-v"),
                                  ("--log-format", "json", "plan", "--output=json")])
def test_a_noop_plan_imports_no_stage_it_does_not_need(applied, args):
    ns, state, d = applied
    cmd = args[:args.index("plan") + 1] + (str(d),) + args[args.index("plan") + 1:]
    code, out, err, imported = run_cli(*cmd, state=state, ns=ns)
    assert code == 0 and FAST in err, err
    assert "fastPath" not in out or '"fastPath": true' in out
    assert imported == ["typer"]  # nor pyroute2 nor jsonschema: discovery remembered, nothing validated


def test_a_noop_apply_imports_no_stage_it_does_not_need(applied):
    ns, state, d = applied
    code, out, err, imported = run_cli("apply", str(d), "--verify", "full", state=state, ns=ns)
    assert code == 0 and "unchanged since the last apply" in out and FAST in err
    assert imported == ["typer"]


def test_invalid_input_is_reported_and_recorded(netns, tmp_path):
    d = copy_edge(tmp_path)
    (d / "broken.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name}\n")
    code, out, err, _ = run_cli("apply", str(d), state=tmp_path / "s", ns=netns)
    assert code == 1 and "Bad_Name" in err, err
    st = json.loads((tmp_path / "s" / "netns" / netns / "tables" / "nftrec" / "status.json").read_text())
    assert st["lastError"] and st["lastAppliedRevision"] is None


def test_not_a_noop_runs_the_whole_command_and_checks_once(applied):
    """Not a no-op: the plan is made, and the check is not made (nor logged) twice."""
    ns, state, d = applied
    _add_endpoint(d)
    code, out, err, imported = run_cli("plan", str(d), "--detailed-exitcode", state=state, ns=ns)
    assert code == 2 and "default/web" in out and "typer" in imported
    assert err.count(NOT_FAST) == 1, err
    code, out, err, _ = run_cli("plan", str(d), "--refresh", state=state, ns=ns)
    assert code == 0 and NOT_FAST not in err and FAST not in err
    code, out, err, _ = run_cli("plan", str(d), "-o", "yaml", state=state, ns=ns)
    assert code == 64 and "text or json" in err  # a usage error


def test_an_address_added_in_the_namespace_is_not_a_noop(netns, tmp_path):
    """nodeIPs set, nodePortAddresses a CIDR: the NodePort addresses are the interface
    addresses in that CIDR. The remembered discovery must not hide a new one."""
    state = tmp_path / "state"
    d = copy_edge(tmp_path)
    cfg = tmp_path / "node.yaml"
    cfg.write_text(CONFIG.read_text().replace("nodePortAddresses: [primary]", "nodePortAddresses: [192.0.2.0/24]"))
    in_ns(netns, "ip", "addr", "add", "192.0.2.5/32", "dev", "lo")
    ok(nftrec("apply", str(d), state=state, ns=netns, config=cfg))
    for _ in range(2):  # the first discovers and remembers, the second reuses
        code, doc, err = plan(d, state, netns, config=cfg)
        assert code == 0 and doc["fastPath"] is True, err
    assert "using the addresses discovered before" in err
    in_ns(netns, "ip", "addr", "add", "192.0.2.6/32", "dev", "lo")
    code, doc, err = plan(d, state, netns, config=cfg)
    assert doc["fastPath"] is False and NOT_FAST + "the effective node config" in err
    assert code == 2 and "using the addresses discovered before" not in err.split(NOT_FAST)[0]  # looked again
    ok(nftrec("apply", str(d), state=state, ns=netns, config=cfg))
    in_ns(netns, "ip", "addr", "del", "192.0.2.6/32", "dev", "lo")  # and back
    code, doc, err = plan(d, state, netns, config=cfg)
    assert code == 2 and doc["fastPath"] is False


def test_damaged_caches_are_ignored_and_rebuilt(applied):
    ns, state, d = applied
    assert plan(d, state, ns)[1]["fastPath"] is True  # fills both
    cache = state / "cache" / "nodeconfig"
    files = sorted(cache.glob("discovery-*.json")) + sorted(cache.rglob("*.jsonl"))  # discovery, settings
    assert len(files) == 2
    for f in files:
        f.write_text('{"format": 1, "fingerprint": 7, "key": [], "settings": "x"')
    code, doc, err = plan(d, state, ns)
    assert code == 0 and doc["fastPath"] is True and err.count("ignoring") == 2, err
    for f in files:
        f.write_text('{"format": 1, "fingerprint": "0", "key": "0", "settings": {}, "hostAddresses": [[1]]}')
    code, doc, err = plan(d, state, ns)
    assert code == 0 and doc["fastPath"] is True and err.count("ignoring") == 2, err
    code, doc, err = plan(d, state, ns)
    assert code == 0 and doc["fastPath"] is True and "ignoring" not in err
