"""doctor's checks as pure functions, and the whole command inside a test namespace."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from reconciler.engine.doctor import (check_kernel, check_kernel_features, check_nft_version, check_privileges,
                                      run_doctor)
from reconciler.engine.neighbours import firewall_service, forward_drops, kube_services_saved, legacy_kube_services
from nsutil import in_ns, nft_scratch, sh
from reconciler.kernel import Libnftables, NftError, probe_spelling

NFTREC = str(Path(sys.executable).with_name("nftrec"))


def test_a_kernel_before_5_13_is_a_warning():
    assert check_kernel("6.18.44-fc").ok
    assert check_kernel("5.13.0").ok
    old = check_kernel("5.10.0-23-amd64")
    assert old.warning and "5.13" in old.detail and old.line().startswith("warn ")  # warns, never refuses


class _Refusing:
    """A real Libnftables whose check refuses every transaction holding `construct`, as a
    kernel without it would (what nft says when the kernel refuses a rule)."""

    def __init__(self, nft, construct: str):
        self.nft, self.construct = nft, construct

    def check(self, tx):
        if any(self.construct in c for c in tx):
            raise NftError("Error: Could not process rule: Operation not supported")
        self.nft.check(tx)


@pytest.mark.kernel
def test_kernel_features_name_each_refused_rule(netns):
    with Libnftables(netns) as nft:
        spelling = probe_spelling(nft)
        assert check_kernel_features(nft, spelling).ok
        bad = check_kernel_features(_Refusing(nft, "masquerade fully-random"), spelling)
    assert not bad.ok and not bad.warning
    refused = bad.detail.split("; ")
    assert all("masquerade fully-random" in r for r in refused[:-1]) and "Operation not supported" in refused[0]
    assert len(refused) > 2 and "apply would fail" in bad.detail
    assert in_ns(netns, "nft", "list", "ruleset").stdout.strip() == ""  # dry runs only


def test_nft_version_gate():
    assert check_nft_version("1.0.6").ok and check_nft_version("1.0.1").ok
    assert not check_nft_version("1.0.0").ok and not check_nft_version("0.9.8").ok
    old = check_nft_version("0.9.8")
    assert old.warning and "1.0.1" in old.detail and old.line().startswith("warn ")  # warns, never refuses
    assert not check_nft_version(None).ok and not check_nft_version(None).warning


def test_privileges_from_capeff():
    assert check_privileges("Name:\tx\nCapEff:\t000001ffffffffff\n").ok
    no = check_privileges("CapEff:\t0000000000000000\n")
    assert not no.ok and "CAP_NET_ADMIN" in no.detail


@pytest.mark.kernel
def test_doctor_in_a_namespace_reports_a_kube_proxy_table(netns):
    out = io.StringIO()
    assert run_doctor(netns, "nftrec", out=out) == 0
    text = out.getvalue()
    assert "nftrec can run here." in text
    assert "ok   kernel features: every construct nftrec writes is accepted" in text, text
    with Libnftables(netns) as nft:  # what this machine's libnftables says and accepts
        version, spelling = nft.version(), probe_spelling(nft)
    old = tuple(int(x) for x in version.split(".")[:3]) < (1, 0, 1)
    assert (f"warn nft version: {version} is older than 1.0.1" if old else f"ok   nft version: {version} >= 1.0.1") in text
    # the constructs found by check transactions, and the spelling used for each
    maps = "accepted, so shared maps by index range" if spelling.index_maps else \
        "refused, so kube-proxy's anonymous map per Service port"
    affinity = "accepted, so one shared set per table" if spelling.shared_affinity else \
        "refused, so kube-proxy's set per endpoint"
    assert f"ok   nft spellings: endpoint maps: `typeof numgen random mod 1 : verdict` maps {maps}; " in text, text
    assert f"affinity: `typeof ip saddr . numgen … . numgen …` sets {affinity}" in text
    in_ns(netns, "nft", "add", "table", "ip", "kube-proxy")
    out = io.StringIO()
    assert run_doctor(netns, "nftrec", out=out) == 0  # a warning, not a failure
    assert "warn conflicting tables: kube-proxy's tables exist (ip)" in out.getvalue()
    # doctor only probes (dry run): it created nothing
    assert in_ns(netns, "nft", "list", "tables").stdout.split() == ["table", "ip", "kube-proxy"]


# --- the neighbours -------------------------------------------------------------------------

# Docker's filter table as iptables-nft writes it (policy drop; DOCKER-USER jumped to
# first), a kube-proxy's KUBE-SERVICES in iptables-nft's nat table, an admin's table whose
# forward chain ends with a drop after a conditional accept, and one that passes DNATed
# connections before its drop.
NEIGHBOURS = """\
table ip filter {
  chain FORWARD {
    type filter hook forward priority filter; policy drop;
    counter jump DOCKER-USER
    oifname "docker0" ct state related,established counter accept
  }
  chain DOCKER-USER {
    counter return
  }
}
table ip nat {
  chain KUBE-SERVICES {
  }
}
table inet admin {
  chain forwarding {
    type filter hook forward priority 0;
    ip saddr 10.0.0.0/8 accept
    counter drop
  }
}
table inet lenient {
  chain forwarding {
    type filter hook forward priority 0; policy drop;
    ct status dnat counter accept
  }
}
"""


@pytest.mark.kernel
def test_doctor_names_the_neighbours_that_drop_and_the_fix(netns, tmp_path):
    in_ns(netns, "nft", "-f", "-", input=NEIGHBOURS)
    before = in_ns(netns, "nft", "list", "ruleset").stdout
    proc = sh(NFTREC, "--state-dir", str(tmp_path), "doctor", "--netns", netns, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # warnings only
    lines = proc.stdout.splitlines()
    docker = [x for x in lines if x.startswith("warn forward drop: table ip filter chain FORWARD has policy drop")]
    assert len(docker) == 1 and "`iptables -I DOCKER-USER -m conntrack --ctstate DNAT -j ACCEPT`" in docker[0], lines
    admin = [x for x in lines if x.startswith("warn forward drop: table inet admin chain forwarding ends in an "
                                              "unconditional drop (chain forwarding, rule handle ")]
    assert len(admin) == 1 and "`nft insert rule inet admin forwarding ct status dnat accept`" in admin[0], lines
    assert not [x for x in lines if "lenient" in x], lines  # it accepts DNATed connections first
    assert any(x.startswith("warn conflicting tables:") and "KUBE-SERVICES chains exist (ip nat)" in x
               for x in lines), lines
    assert "nftrec can run here." in lines
    # with the DOCKER-USER accept, Docker's chain no longer drops them; doctor changed nothing
    in_ns(netns, "nft", "insert", "rule", "ip", "filter", "DOCKER-USER", "ct", "status", "dnat", "accept")
    proc = sh(NFTREC, "--state-dir", str(tmp_path), "doctor", "--netns", netns, check=False)
    assert proc.returncode == 0 and "table ip filter chain FORWARD" not in proc.stdout, proc.stdout
    after = in_ns(netns, "nft", "list", "ruleset").stdout
    assert after.replace("\t\tct status dnat accept\n", "", 1) == before


def _items(script: str) -> list:
    """nft's own JSON items for `script`, loaded in a scratch user and network namespace."""
    nft_scratch(script + "\n", check_only=True)  # fails the test with nft's error
    proc = sh("unshare", "-rn", "sh", "-c", "nft -f - && nft -j list ruleset", input=script + "\n")
    return [i for i in json.loads(proc.stdout)["nftables"] if "metainfo" not in i]


def test_forward_drop_walks_jumps_and_skips_what_may_not_match():
    base = "table inet t {\n  chain fw {\n    type filter hook forward priority 0; policy %s;\n%s  }\n%s}"
    jump_to_drop = base % ("accept", "    jump sub\n", "  chain sub {\n    counter reject\n  }\n")
    found = forward_drops(_items(jump_to_drop))
    assert len(found) == 1 and found[0].detail.startswith("table inet t chain fw ends in an unconditional reject "
                                                          "(chain sub, rule handle "), found
    returns = base % ("accept", "    jump sub\n", "  chain sub {\n    return\n  }\n")
    assert forward_drops(_items(returns)) == []
    conditional = base % ("accept", "    tcp dport 22 drop\n", "")
    assert forward_drops(_items(conditional)) == []  # may or may not apply to nftrec's packets
    goto_falls = base % ("drop", "    goto sub\n", "  chain sub {\n    counter\n  }\n")
    assert [f for f in forward_drops(_items(goto_falls)) if "has policy drop" in f.detail]
    prerouting = "table ip t {\n  chain p {\n    type filter hook prerouting priority 0; policy drop;\n  }\n}"
    assert forward_drops(_items(prerouting)) == []  # only the forward hook


def test_kube_services_in_a_legacy_save():
    text = "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n" \
           "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\nCOMMIT\n*mangle\nCOMMIT\n"
    assert kube_services_saved(text) == ["filter", "nat"]
    assert kube_services_saved("*nat\n:KUBE-SVC-X - [0:0]\nCOMMIT\n") == []


def test_legacy_tables_without_the_save_tool_are_a_note(netns):
    names = {"/proc/thread-self/net/ip_tables_names": "nat\nfilter\n", "/proc/thread-self/net/ip6_tables_names": ""}
    found, notes = legacy_kube_services(netns, read=names.__getitem__)
    if shutil.which("iptables-legacy-save") is None:
        assert found == [] and len(notes) == 1 and "iptables-legacy has tables here (filter, nat)" in notes[0], notes
    # the namespace's own files: a fresh namespace has no legacy tables
    assert legacy_kube_services(netns) == ([], [])


def test_a_distribution_firewall_that_flushes_the_ruleset(tmp_path):
    assert firewall_service(tmp_path).ok  # nothing installed
    conf = tmp_path / "etc/nftables.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("#!/usr/sbin/nft -f\n\nflush ruleset\n\ntable inet filter {\n}\n")
    assert firewall_service(tmp_path).ok  # the service is not enabled: nothing loads it
    wants = tmp_path / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True)
    (wants / "nftables.service").symlink_to("/lib/systemd/system/nftables.service")
    f = firewall_service(tmp_path)
    assert not f.ok and "/etc/nftables.conf begins with `flush ruleset`" in f.detail
    assert "`nftrec watch` repairs them within a second" in f.detail and "one-shot users must run `nftrec apply` " \
        "again after each reload" in f.detail
    conf.write_text("table inet filter\nflush table inet filter\n")
    assert firewall_service(tmp_path).ok
    (tmp_path / "run").mkdir()
    (tmp_path / "run/firewalld.pid").write_text("1\n")
    assert "firewalld runs" in firewall_service(tmp_path).detail


def test_an_iptables_conntrack_accept_is_named_not_judged():
    """iptables-nft's `-m conntrack --ctstate DNAT -j ACCEPT` reaches nft's JSON as an `xt`
    statement (nft's xt_stmt_json) that hides the states: doctor names it."""
    chain = {"family": "ip", "table": "filter", "name": "FORWARD", "type": "filter", "hook": "forward", "prio": 0,
             "policy": "drop"}
    user = {"family": "ip", "table": "filter", "name": "DOCKER-USER"}
    rules = [{"rule": {"family": "ip", "table": "filter", "chain": "FORWARD", "handle": 3,
                       "expr": [{"counter": None}, {"jump": {"target": "DOCKER-USER"}}]}},
             {"rule": {"family": "ip", "table": "filter", "chain": "DOCKER-USER", "handle": 7,
                       "expr": [{"xt": {"type": "match", "name": "conntrack"}}, {"counter": None}, {"accept": None}]}}]
    found = forward_drops([{"chain": chain}, {"chain": user}] + rules)
    assert len(found) == 1 and "before it an accept by iptables' conntrack match (chain DOCKER-USER, rule handle 7)" \
        in found[0].detail and "iptables -I DOCKER-USER -m conntrack --ctstate DNAT -j ACCEPT" in found[0].detail
