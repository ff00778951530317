"""The listing parser on every nft: golden listings of examples/edge-small (ClientIP
affinity, LoadBalancer source ranges, eTP Local), each loaded with one nft version's
`nft -f` in a namespace and listed as nftrec lists (`nft -y -T list table`, the flags
of Libnftables.list_table), read back to the ruleset that was compiled.

tests/data/listings/nft-VERSION/edge-small.SPELLING.FAMILY.nft, captured with the nft
of Debian 11 (0.9.8), 12 (1.0.6) and 13 (1.1.3); SPELLING: `default` (nftrec's own),
`fallback` (NftSpelling(False, False): what 0.9.8 accepts) and `kube-proxy` (the layout).
nft 0.9.8 lists protocols by number (`meta l4proto 6`, `10.96.0.10 . 6 . 53`), set
timeouts as `10m` and a one-element anonymous set in braces; 1.1.3 wraps elements one a
line. Every spelling of a version must read back to its compiled ruleset exactly.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.compile import compile_ruleset
from reconciler.engine.changes import diff
from reconciler.engine.trace import trace_packet
from reconciler.engine.tracereport import Packet
from reconciler.intake import NftSpelling, load_node_config, read_inventory
from reconciler.kernel import fingerprint, parse_live

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "listings"
SPELLINGS = {"default": {}, "fallback": {"spelling": NftSpelling(index_maps=False, shared_affinity=False)},
             "kube-proxy": {"layout": "kube-proxy"}}
CASES = sorted((v.name, p.name.split(".")[1]) for v in DATA.iterdir() for p in v.glob("edge-small.*.ip.nft"))


def compiled(spelling: str):
    inv = read_inventory(ROOT / "examples" / "edge-small").inventory
    cfg, _ = load_node_config(str(ROOT / "examples" / "edge-small.config.yaml"), discover=False)
    return compile_ruleset(inv, replace(cfg, **SPELLINGS[spelling]))


def listed(version: str, spelling: str):
    return parse_live({fam: (DATA / version / f"edge-small.{spelling}.{fam}.nft").read_text()
                       for fam in ("ip", "ip6")}, "nftrec")


def test_every_version_and_spelling_captured():
    versions = {v for v, _ in CASES}
    assert versions == {"nft-0.9.8", "nft-1.0.6", "nft-1.1.3"}
    assert {s for v, s in CASES if v == "nft-0.9.8"} == {"fallback", "kube-proxy"}  # 0.9.8 refuses `default`
    assert {s for v, s in CASES if v != "nft-0.9.8"} == set(SPELLINGS)


def test_the_spellings_differ_as_the_compile_says():
    # the fallback spelling has no shared maps nor affinity set: anonymous maps per port
    fallback, default = compiled("fallback").tables["ip"], compiled("default").tables["ip"]
    assert "affinity-clients" in default.sets and "affinity-clients" not in fallback.sets
    assert any(n.startswith("endpoint-dnat-") for n in default.sets)
    assert not any(n.startswith(("endpoint-dnat-", "endpoint-vmap-")) for n in fallback.sets)
    assert any(n.startswith("hairpin-connections-") for n in fallback.sets)  # sharded otherwise


@pytest.mark.parametrize("version,spelling", CASES)
def test_listing_reads_back_to_the_compiled_ruleset(version, spelling):
    changes = diff(compiled(spelling), listed(version, spelling))
    assert changes.empty, f"{version} {spelling}: {len(changes)} differences:\n{changes}"


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_versions_read_to_one_form(spelling):
    prints = {v: fingerprint(listed(v, s)) for v, s in CASES if s == spelling}
    assert len(prints) >= 2 and len(set(prints.values())) == 1, prints


@pytest.mark.parametrize("version,spelling", CASES)
def test_trace_live_dnats_a_clusterip_with_endpoints(version, spelling):
    """`trace --live` on what each nft lists: default/web's ClusterIP has endpoints."""
    tr = trace_packet(listed(version, spelling), Packet("192.168.50.77", "10.96.0.10", 80, "tcp"),
                      ("192.168.50.2",), ruleset_kind="live")
    verdicts = {o.verdict for o in tr.outcomes}
    assert verdicts == {"dnat"}, (version, spelling, tr.outcomes)
    assert {o.endpoint for o in tr.outcomes} == {"10.244.0.11:8080", "10.244.0.12:8080"}
