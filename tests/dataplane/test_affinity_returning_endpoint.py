"""ClientIP affinity across an endpoint that goes and comes back, through `nftrec apply`'s
own engine (engine/apply.run_apply): kube-proxy deletes the endpoint's affinity set with
it, so its former clients, who moved to another endpoint meanwhile, stay there when it
returns. The sharded layout's shared set does the same through the cleanup after the
commit (engine/sync.forget_affinity_clients; docs/kube-proxy-behaviours.md deviation 14).
"""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest

from dp_topology import CLIENT_A4, EP4
from test_kube_proxy_semantics import config, eps, inv, servers, service, sport
from reconciler.compile import compile_ruleset
from reconciler.compile.layout import AFFINITY_SET, affinity_key
from reconciler.engine import EXIT_OK, Target, run_apply
from reconciler.engine.desired import Desired

pytestmark = pytest.mark.dataplane

VIP = "10.96.0.70"
A, B = EP4[0], EP4[1]  # A's check comes first in the policy chain (endpoints in address order)


def apply(dp, state, endpoints: tuple[str, ...]) -> None:
    """`nftrec apply` of the sticky Service with `endpoints`, in-process (the real engine:
    plan against the kernel, one transaction, verify, post-commit steps)."""
    inventory = inv(service("sticky", (VIP,), sport(80, 8080), session_affinity="ClientIP",
                            affinity_timeout_seconds=300), eps("sticky", endpoints))
    cfg = replace(config(), spelling=dp.spelling())  # what this nft accepts
    desired = Desired(inventory, cfg, compile_ruleset(inventory, cfg))
    out = io.StringIO()
    assert run_apply(Target(dp.node, "nftrec", state), desired=desired, out_stream=out) == EXIT_OK, out.getvalue()
    dp.hand_loaded, dp.loaded_ruleset = False, None  # probes are traced against the live table
    dp.flush_conntrack()  # every probe below is a fresh NAT decision


def lands_on(dp) -> set[str]:
    return set(servers(dp.probe("clientA", VIP, 80, count=8)))


def entries_of(dp, endpoint: str) -> bool:
    """Whether client A has an entry for `endpoint`: in the shared set, or (an nft that
    refuses it, kernel/features.py) in kube-proxy's set of that endpoint."""
    aset = f"affinity-{_endpoint_chain(dp, endpoint)[len('endpoint-'):]}"
    if not dp.spelling().shared_affinity:
        listing = dp.nft_list()
        at = listing.find(f"set {aset} {{")
        assert at >= 0, f"no set {aset}"
        return f"{CLIENT_A4} " in listing[at:listing.find("\n\t}", at)]  # `198.51.100.2 expires 4m59s`
    key = affinity_key("ip", aset)
    hi, lo = (int(x or 0) for x in re.fullmatch(
        r"ip saddr \. numgen random mod 1(?: offset (\d+))? \. numgen random mod 1(?: offset (\d+))?", key).groups())
    listing = dp.nft_list()
    return f"{CLIENT_A4} . {hi} . {lo} " in listing


def _endpoint_chain(dp, endpoint: str) -> str:
    names = re.findall(r"chain (endpoint-\S+/sticky/tcp/__" + re.escape(endpoint) + r"/8080) \{",
                       dp.nft_list())
    assert len(names) == 1, names
    return names[0]


def test_a_returning_endpoint_does_not_get_its_former_clients_back(dp, tmp_path):
    state = tmp_path / "state"
    apply(dp, state, (A,))
    assert lands_on(dp) == {A}  # client A's entry is for A
    apply(dp, state, (A, B))
    assert lands_on(dp) == {A}, "affinity broken by adding an endpoint"
    assert entries_of(dp, A)
    chain_a = _endpoint_chain(dp, A)

    apply(dp, state, (B,))  # A goes: its clients move to B
    assert (AFFINITY_SET in dp.nft_list()) == dp.spelling().shared_affinity
    assert lands_on(dp) == {B}
    apply(dp, state, (A, B))  # A comes back: kube-proxy's set for A is new and empty
    assert _endpoint_chain(dp, A) == chain_a  # the same id as before it went
    assert not entries_of(dp, A), "A's former entry for client A survived its removal"
    assert lands_on(dp) == {B}, "client A was sent back to the returning endpoint"
