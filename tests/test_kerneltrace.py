"""`nftrec trace --kernel`'s parts: the parser of `nft monitor trace` on real captures of nft
0.9.8, 1.0.6 and 1.1.3 (tests/data/kerneltrace/nft-VERSION/*.txt: a ClusterIP connection
from the data-plane topology's clientA, DNATed by nftrec and then dropped by a Docker-style
`ip filter FORWARD` policy, or accepted by `ct status dnat accept` in DOCKER-USER), the
tracing table's script, and, in a throwaway namespace, the table's life: made and removed
by a child nft, a dead run's found and removed, a crashing child reported with its signal.

Regenerate the text golden after an intended change of the output with
    NFTREC_UPDATE_GOLDEN=1 python -m pytest tests/test_kerneltrace.py
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsutil import in_ns, throwaway_netns
from reconciler.engine.kerneltrace import _collect
from reconciler.engine.kerneltracereport import Grouper, fate, format_text, parse_line, to_json
from reconciler.engine.target import CommandError
from reconciler.kernel import Libnftables, NftError
from reconciler.kernel.tracetable import (TRACE_PRIORITY, exit_reason, run_nft_child, stale_trace_tables,
                                          sweep_trace_tables, trace_table_owner, trace_table_script)

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "data" / "kerneltrace"
VERSIONS = ("nft-0.9.8", "nft-1.0.6", "nft-1.1.3")
GOLDEN = HERE / "golden" / "kerneltrace.forward-drop.txt"
ENDPOINT = "10.244.1.10:8080"  # the Service's one endpoint in the captures


def sample(version: str, name: str) -> tuple[list[str], str]:
    """The capture's lines and its tracing table's name (as the capture has it)."""
    text = (SAMPLES / version / f"{name}.txt").read_text()
    tracer = re.search(r"^trace id \S+ \S+ (nftrec-trace-\d+) ", text, re.M).group(1)
    return text.splitlines(), tracer


def packets_of(version: str, name: str):
    lines, tracer = sample(version, name)
    packets = Grouper(tracer).feed(lines).packets
    # one packet per `packet:` line of the tracing table, the first chain every traced packet passes
    assert len(packets) == sum(f" {tracer} " in ln and "packet:" in ln for ln in lines) > 0
    return packets, [fate(p, "nftrec") for p in packets]


def summary(f) -> tuple:
    d = f.decided_by
    return (f.verdict, d.where if d else None, d.kind if d else None, f.endpoint,
            f.dnat.where if f.dnat else None, f.service)


def test_every_version_that_parses_the_forward_drop_the_same():
    seen = {}
    for version in VERSIONS:
        packets, fates = packets_of(version, "forward-drop")
        for p, f in zip(packets, fates):
            assert p.first.dst == "10.96.0.50" and p.first.dport == 80 and p.first.src == "198.51.100.2"
            assert all(e.table != sample(version, "forward-drop")[1] for e in p.events)  # the tracer is hidden
            assert f.verdict == "drop" and f.decided_by.kind == "policy"
            assert (f.decided_by.table, f.decided_by.chain) == ("filter", "FORWARD")
            # the DNAT came before the drop, by nftrec's Service chain, to the endpoint
            assert p.events.index(f.dnat) < p.events.index(f.decided_by)
            assert f.dnat.chain.startswith("service-") and f.dnat.chain.endswith("-default/web/tcp/http")
            assert f.endpoint == ENDPOINT and f.service == "default/web"
        seen[version] = {summary(f) for f in fates}
    assert len({frozenset(s) for s in seen.values()}) == 1, seen


def test_every_version_that_parses_the_docker_user_accept_the_same():
    seen = {}
    for version in VERSIONS:
        packets, fates = packets_of(version, "docker-user-accept")
        first = fates[0]
        assert first.verdict == "accept" and first.decided_by.rule == "ct status dnat accept"
        assert (first.decided_by.table, first.decided_by.chain) == ("filter", "DOCKER-USER")
        assert first.endpoint == ENDPOINT and first.service == "default/web"
        assert [e.chain for e in first.nat] == ["masquerading"]
        # the connection's later packets pass no NAT chain: conntrack translates them
        assert len(fates) > 1 and all(f.dnat is None and f.verdict == "accept" for f in fates[1:])
        assert {f.translated for f in fates[1:]} == {ENDPOINT} and first.translated is None
        seen[version] = summary(first)
    assert len(set(seen.values())) == 1, seen


def test_a_reused_trace_id_starts_a_new_packet_at_the_tracing_table():
    """The kernel reuses trace ids: two packets with one id, the second's events follow it."""
    lines, tracer = sample("nft-1.0.6", "docker-user-accept")
    ids = [ln.split()[2] for ln in lines]
    first, second = ids[0], next(i for i in ids if i != ids[0])
    same = [ln.replace(f"trace id {second} ", f"trace id {first} ") for ln in lines]
    a, b = Grouper(tracer).feed(lines).packets, Grouper(tracer).feed(same).packets
    assert len(a) == len(b) and [len(p.events) for p in a] == [len(p.events) for p in b]
    assert b[0].trace_id == b[1].trace_id == first


def test_the_text_report_golden():
    packets, fates = packets_of("nft-1.0.6", "forward-drop")
    text = format_text(packets[:1], fates[:1], {"default/web": "manifests/web.yaml:1"}) + "\n"
    if os.environ.get("NFTREC_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "verdict: DROPPED by the policy of ip filter FORWARD" in text
    assert f"after DNAT to {ENDPOINT} by ip nftrec service-" in text
    doc = to_json(packets, fates)
    assert {p["verdict"] for p in doc["packets"]} == {"drop"}
    assert {p["dnat"]["endpoint"] for p in doc["packets"]} == {ENDPOINT}


def test_the_parser_keeps_what_it_does_not_know_and_takes_each_form():
    assert parse_line("") is None and parse_line("Error: something") is None
    other = parse_line("trace id 0a1b2c3d inet fw input conntrack: ct direction original ct state new")
    assert (other.kind, other.raw) == ("other", "conntrack: ct direction original ct state new")
    ret = parse_line("trace id 0a1b2c3d ip filter SUB verdict return meta mark 0x00000010 ")
    assert (ret.kind, ret.verdict, ret.mark) == ("return", "return", "0x00000010")
    pol = parse_line("trace id 0a1b2c3d ip filter FORWARD policy drop ")
    assert (pol.kind, pol.verdict, pol.mark) == ("policy", "drop", "")
    rule = parse_line('trace id 0a1b2c3d ip t c rule tcp dport 80 comment "a (b)" reject (verdict drop)')
    assert (rule.rule, rule.verdict) == ('tcp dport 80 comment "a (b)" reject', "drop")
    bare = parse_line("trace id 0a1b2c3d ip t c rule handle 7")
    assert (bare.kind, bare.rule, bare.verdict) == ("rule", "handle 7", "")
    six = parse_line('trace id 0a1b2c3d ip6 nftrec nat-prerouting packet: iif "n-ca" ip6 saddr fd00:a::2 '
                     'ip6 daddr fd00:96::10 ip6 nexthdr udp udp sport 5353 udp dport 53 udp length 20 ')
    h = six.headers
    assert (h.proto, h.src, h.sport, h.dst, h.dport, h.iif) == ("udp", "fd00:a::2", 5353, "fd00:96::10", 53, "n-ca")
    assert h.text() == "udp [fd00:a::2]:5353 -> [fd00:96::10]:53 (in n-ca)"


def test_a_reject_and_a_dnat_seen_only_in_the_rule_text():
    lines = ["trace id 01 ip nftrec-trace-9 prerouting packet: ip saddr 10.0.0.1 ip daddr 10.96.0.1 tcp sport 1 tcp dport 80",
             "trace id 01 ip nftrec endpoint-AAAAAAAA-ns/web/tcp/p__10.1.0.5/80 rule dnat to 10.1.0.5:80 (verdict accept)",
             "trace id 01 ip fw input rule tcp dport 80 reject with tcp reset (verdict drop)"]
    (p,) = Grouper("nftrec-trace-9").feed(lines).packets
    f = fate(p, "nftrec")
    assert (f.verdict, f.endpoint, f.service) == ("reject", "10.1.0.5:80", "ns/web")
    assert "REJECTED by ip fw input rule `tcp dport 80 reject with tcp reset`" in format_text([p], [f])


def test_the_tracing_table_script_and_owner():
    script = trace_table_script("ip6", "nftrec-trace-77", "fd00:a::2", "fd00:96::10", "udp", 53)
    assert f"type filter hook prerouting priority {TRACE_PRIORITY};" in script
    assert f"type filter hook output priority {TRACE_PRIORITY};" in script
    assert script.count("ip6 saddr fd00:a::2 ip6 daddr fd00:96::10 meta l4proto udp th dport 53 meta nftrace set 1") == 2
    assert TRACE_PRIORITY < -400  # before raw (-300) and defragmentation (-400)
    assert [trace_table_owner(n) for n in ("nftrec-trace-77", "nftrec", "nftrec-trace-", "nftrec-trace-07",
                                           "nftrec-trace-7x")] == [77, None, None, None, None]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def test_only_tables_of_runs_that_ended_are_stale():
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        dead = _dead_pid()
        tables = [("ip", f"nftrec-trace-{dead}"), ("ip6", f"nftrec-trace-{live.pid}"),
                  ("ip", f"nftrec-trace-{os.getpid()}"), ("ip", "nftrec"), ("inet", "filter")]
        assert stale_trace_tables(tables) == [("ip", f"nftrec-trace-{dead}")]
    finally:
        live.kill()
        live.wait()


def test_exit_reasons():
    assert exit_reason(1) == "nft: exit 1"
    assert exit_reason(-signal.SIGSEGV).startswith("nft crashed (SIGSEGV)")
    assert exit_reason(128 + signal.SIGKILL) == "nft was killed (SIGKILL)"  # through timeout(1) or a shell
    assert exit_reason(255) == "nft: exit 255"


@pytest.mark.kernel
def test_the_table_made_swept_and_refused_in_a_namespace():
    with throwaway_netns() as ns:
        dead = _dead_pid()
        run_nft_child(ns, trace_table_script("ip", f"nftrec-trace-{dead}", "10.0.0.1", "10.0.0.2", "tcp", 80))
        run_nft_child(ns, trace_table_script("ip", f"nftrec-trace-{os.getpid()}", "10.0.0.1", "10.0.0.2", "tcp", 80))
        listing = in_ns(ns, "nft", "list", "table", "ip", f"nftrec-trace-{dead}").stdout
        assert "meta nftrace set 1" in listing and f"priority {TRACE_PRIORITY};" in listing
        with Libnftables(ns) as nft:
            assert sweep_trace_tables(nft, ns) == [("ip", f"nftrec-trace-{dead}")]
            assert sorted(nft.list_tables()) == [("ip", f"nftrec-trace-{os.getpid()}")]
        with pytest.raises(NftError) as e:
            run_nft_child(ns, "add rule ip nosuchtable c accept\n")
        assert "No such file or directory" in e.value.text


def test_a_monitor_that_crashes_is_an_error_with_its_signal():
    """A real child killed by SIGSEGV stands for an nft that crashes reading a table."""
    child = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; sys.stderr.write('reading\\n'); "
                              "sys.stderr.flush(); os.kill(os.getpid(), signal.SIGSEGV)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with pytest.raises(CommandError) as e:
            _collect(child, Grouper("nftrec-trace-1"), time.monotonic() + 20, 1, "netns x")
    finally:
        child.wait()
    assert str(e.value).startswith("`nft monitor trace` netns x ended before any packet came: nft crashed (SIGSEGV)")
    assert str(e.value).endswith("; reading")
