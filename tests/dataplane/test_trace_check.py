"""The comparison behind the data-plane trace checks (trace_check.py), offline: each kind
of disagreement between a trace and the wire is caught. No kernel needed."""

from __future__ import annotations

from fractions import Fraction

from dp_topology import Reply, Result
from reconciler.engine.tracereport import Outcome, Packet, Trace
from trace_check import mismatches

SRC, VIP = "198.51.100.2", "10.96.0.10"


def tr(*outcomes: tuple) -> Trace:
    """outcomes: (verdict, endpoint, masquerade[, affinity])"""
    p = Fraction(1, len(outcomes))
    return Trace(Packet(SRC, VIP, 80), "ip", "desired",
                 [Outcome(p, v, ep, m, bool(rest and rest[0]), [], None, None) for v, ep, m, *rest in outcomes], [])


def ok(ip: str, peer: str = SRC, port: int = 8080) -> Result:
    return Result(Reply(ip, port, peer, 40000), None)


def err(kind: str) -> Result:
    return Result(None, kind)


TWO = tr(("dnat", "10.244.1.10:8080", False), ("dnat", "10.244.1.11:8080", False))


def test_agreement_is_silent():
    assert mismatches(TWO, [ok("10.244.1.10"), ok("10.244.1.11")], SRC) == []
    assert mismatches(tr(("reject", None, False)), [err("refused")], SRC) == []
    assert mismatches(tr(("drop", None, False)), [err("timeout")], SRC) == []
    assert mismatches(tr(("forward", None, False)), [err("unreachable")], SRC) == []


def test_an_endpoint_trace_did_not_predict():
    assert mismatches(TWO, [ok("10.244.1.12")], SRC)


def test_the_wrong_target_port():
    assert mismatches(TWO, [ok("10.244.1.10", port=9090)], SRC)


def test_masquerade_disagreement_both_ways():
    assert mismatches(TWO, [ok("10.244.1.10", peer="10.244.1.1")], SRC)
    masq = tr(("dnat", "10.244.1.10:8080", True))
    assert mismatches(masq, [ok("10.244.1.10")], SRC)
    assert mismatches(masq, [ok("10.244.1.10", peer="10.244.1.1")], SRC) == []


def test_error_kinds_must_match_the_verdict():
    assert mismatches(tr(("reject", None, False)), [err("timeout")], SRC)
    assert mismatches(tr(("drop", None, False)), [err("refused")], SRC)
    assert mismatches(TWO, [err("unreachable")], SRC)


def test_enough_attempts_must_reach_every_predicted_endpoint():
    only_one = [ok("10.244.1.10")] * 30
    assert mismatches(TWO, only_one, SRC)
    assert mismatches(TWO, only_one[:10], SRC) == []  # too few attempts to tell
    sticky = tr(("dnat", "10.244.1.10:8080", False, True), ("dnat", "10.244.1.11:8080", False, True))
    assert mismatches(sticky, only_one, SRC) == []  # affinity: one endpoint per client


def test_an_sctp_reject_is_a_timeout_on_the_wire():
    """sctp_raw.py's raw socket never sees the ICMP of a reject; for TCP it stays an error."""
    sctp = Trace(Packet(SRC, VIP, 80, "sctp"), "ip", "desired",
                 [Outcome(Fraction(1), "reject", None, False, False, [], None, None)], [])
    assert mismatches(sctp, [err("timeout")], SRC) == []
    assert mismatches(tr(("reject", None, False)), [err("timeout")], SRC)
