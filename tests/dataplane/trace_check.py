"""`nftrec trace` against the wire: every data-plane probe is also a trace check.

`Topology.probe` (dp_topology.py) traces each probe with nftrec's evaluator before it
sends it, using the ruleset the test loaded (`load`: the compiled Ruleset, i.e. the
desired ruleset) or, when the test applied through the CLI, the live one read back from
the node namespace (the `--live` path). `mismatches` then compares the prediction with
what the packets did:

- a reply from an endpoint: trace must predict DNAT to exactly that ip:port, and
  masquerade exactly when the backend saw an address other than the client's;
- a reply from the destination itself: trace must predict no DNAT (local or forward);
- refused: reject (or delivered to the node where nothing listens); timeout: drop (and,
  for SCTP, whose raw-socket prober sees no ICMP, a reject); unreachable: forwarded
  un-DNATed to the upstream sink;
- with enough attempts (15 per predicted endpoint, no affinity), the endpoints reached
  must be all the endpoints trace predicts, not a subset.

Rulesets loaded by hand (`load_script`, the harness's own tests) are not nftrec's output
and are not traced; a live ruleset that changed while the probe ran (watch syncing) is
not compared either.
"""

from __future__ import annotations

ALLOWED_ERRORS = {"reject": {"refused"}, "drop": {"timeout"}, "forward": {"unreachable"},
                  "local": {"refused"}}
COVERAGE_PER_ENDPOINT = 15


def _allowed(verdict: str, proto: str) -> set[str]:
    # sctp_raw.py listens on a raw SCTP socket, which never sees the ICMP error a reject
    # sends: for SCTP a reject shows on the wire as a timeout.
    allowed = ALLOWED_ERRORS.get(verdict, set())
    return allowed | {"timeout"} if proto == "sctp" and verdict == "reject" else allowed


def join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def summary(tr) -> str:
    parts = []
    for o in tr.outcomes:
        what = o.endpoint if o.verdict == "dnat" else o.verdict
        parts.append(f"{what} p={o.probability}" + (" masq" if o.masquerade else ""))
    return "; ".join(parts)


def mismatches(tr, results, src: str) -> list[str]:
    """What the wire showed that the trace `tr` did not predict (empty: they agree)."""
    out: list[str] = []
    outcomes = tr.outcomes
    seen: set[str] = set()
    for r in results:
        if r.reply is not None:
            ep = join(r.reply.server_ip, r.reply.server_port)
            seen.add(ep)
            dnat = [o for o in outcomes if o.verdict == "dnat" and o.endpoint == ep]
            if dnat:
                masq = r.reply.peer_ip != src
                if masq not in {o.masquerade for o in dnat}:
                    out.append(f"{ep} saw peer {r.reply.peer_ip} (client {src}): masquerade is {masq} on "
                               f"the wire, trace says {sorted({o.masquerade for o in dnat})}")
            elif r.reply.server_ip == tr.packet.dst and any(o.verdict in ("local", "forward") for o in outcomes):
                pass  # answered by the destination itself; trace says nothing DNATs it
            else:
                out.append(f"answered by {ep}; trace predicts {summary(tr)}")
        elif not any(r.error in _allowed(o.verdict, tr.packet.proto) for o in outcomes):
            out.append(f"{r.error} on the wire; trace predicts {summary(tr)}")
    predicted = set(tr.endpoints)
    all_dnat = all(o.verdict == "dnat" for o in outcomes)
    if (predicted and all_dnat and not any(o.affinity for o in outcomes)
            and len(results) >= COVERAGE_PER_ENDPOINT * len(predicted) and seen != predicted):
        out.append(f"{len(results)} attempts reached {sorted(seen)}; trace predicts {sorted(predicted)}")
    return out
