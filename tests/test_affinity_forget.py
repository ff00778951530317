"""engine/sync.forget_affinity_clients: after a commit, the shared affinity set
(layout sharded) forgets the clients of the endpoints the commit removed, as kube-proxy
deletes an endpoint's own affinity set (deviation 14 in docs/kube-proxy-behaviours.md).

Against the Fake (the id selection and the delete transaction); the packets are in
tests/dataplane/test_affinity_returning_endpoint.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.compile import AFFINITY_SET, affinity_updates, compile_ruleset
from reconciler.engine import forget_affinity_clients, forgotten_affinity_ids, make_plan
from reconciler.intake.model import Endpoint, EndpointPort, EndpointSlice, Inventory, NodeConfig, Service, ServicePort
from reconciler.kernel import Fake, NotFound, Transaction, kernel_token, read_live

TABLE = "nftrec"
A, B = "10.244.1.10", "10.244.1.11"
CLIENTS = ("192.0.2.1", "192.0.2.2")


def config(layout: str = "sharded") -> NodeConfig:
    return NodeConfig(node_name="node-a", node_ips=("192.168.0.10",), cluster_cidrs=("10.244.0.0/16",),
                      layout=layout)


def sticky(name: str, endpoints: tuple[str, ...], timeout: int = 300, ip: str = "10.96.0.50") -> list:
    svc = Service(namespace="default", name=name, type="ClusterIP", cluster_ips=(ip,), ip_families=("IPv4",),
                  ports=(ServicePort(name="", protocol="TCP", port=80, target_port=8080),),
                  session_affinity="ClientIP", affinity_timeout_seconds=timeout)
    eps = EndpointSlice(namespace="default", name=f"{name}-ipv4", service_name=name, address_type="IPv4",
                        endpoints=tuple(Endpoint(addresses=(a,), node_name="node-a") for a in endpoints),
                        ports=(EndpointPort("", "TCP", 8080),))
    return [svc, eps]


def inventory(*objs) -> Inventory:
    return Inventory(services=tuple(o for o in objs if isinstance(o, Service)),
                     endpoint_slices=tuple(o for o in objs if isinstance(o, EndpointSlice)))


def ids_of(ruleset, service: str) -> dict[str, tuple[int, int]]:
    """{endpoint address: its id} of `service`'s endpoint chains."""
    out = {}
    for name, chain in ruleset.tables["ip"].chains.items():
        if name.startswith("endpoint-") and f"/{service}/" in name:
            (key,) = affinity_updates(chain)
            out[name.rsplit("__", 1)[1].split("/")[0]] = key
    return out


def entries(nft: Fake) -> set[tuple[str, ...]]:
    return {tuple(k.split(" . ")) for k in nft.tables[("ip", TABLE)].sets[AFFINITY_SET].elements}


@pytest.fixture
def loaded():
    """Two affinity Services (web: A, B; api: A) applied; each client has an entry for
    every endpoint (as if every client had visited every endpoint)."""
    nft = Fake()
    first = compile_ruleset(inventory(*sticky("web", (A, B)), *sticky("api", (A,), ip="10.96.0.51")), config())
    nft.run(make_plan(first, read_live(nft, TABLE)).transaction)
    tx = Transaction()
    for svc in ("web", "api"):
        for hi, lo in ids_of(first, svc).values():
            for c in CLIENTS:
                tx.raw(f"add element ip {TABLE} {AFFINITY_SET} {{ {c} . {hi} . {lo} }}")
    nft.run(tx)
    return nft, first


def apply(nft: Fake, *objs, layout: str = "sharded"):
    """Plan and commit the edit as sync.commit does; (plan, token after the commit)."""
    plan = make_plan(compile_ruleset(inventory(*objs), config(layout)), read_live(nft, TABLE))
    nft.run(plan.transaction)
    return plan, kernel_token(nft)


def test_a_removed_endpoint_is_forgotten_and_nothing_else(loaded):
    nft, first = loaded
    web, api = ids_of(first, "web"), ids_of(first, "api")
    before = entries(nft)
    plan, token = apply(nft, *sticky("web", (B,)), *sticky("api", (A,), ip="10.96.0.51"))
    assert forgotten_affinity_ids(plan) == {"ip": {web[A]}}
    assert forget_affinity_clients(nft, TABLE, plan, token) == token + 1  # one delete transaction, ours
    gone = {(c, str(web[A][0]), str(web[A][1])) for c in CLIENTS}
    assert entries(nft) == before - gone
    assert {(c, str(api[A][0]), str(api[A][1])) for c in CLIENTS} <= entries(nft)  # same address, other Service
    assert len(nft.runs[-1]) == len(gone)
    assert all(op.startswith(f"delete element ip {TABLE} {AFFINITY_SET} {{ ") for op in nft.runs[-1])


def test_a_changed_timeout_forgets_all_endpoints_of_that_service(loaded):
    nft, first = loaded
    web = ids_of(first, "web")
    plan, token = apply(nft, *sticky("web", (A, B), timeout=600), *sticky("api", (A,), ip="10.96.0.51"))
    assert forgotten_affinity_ids(plan) == {"ip": set(web.values())}
    forget_affinity_clients(nft, TABLE, plan, token)
    assert {(k[1], k[2]) for k in entries(nft)} == {tuple(map(str, v)) for v in ids_of(first, "api").values()}


def test_a_removed_service_is_forgotten(loaded):
    nft, first = loaded
    plan, token = apply(nft, *sticky("api", (A,), ip="10.96.0.51"))
    assert forgotten_affinity_ids(plan) == {"ip": set(ids_of(first, "web").values())}
    forget_affinity_clients(nft, TABLE, plan, token)
    assert {(k[1], k[2]) for k in entries(nft)} == {tuple(map(str, v)) for v in ids_of(first, "api").values()}


def test_an_edit_that_removes_no_affinity_endpoint_lists_nothing(loaded):
    nft, _ = loaded
    before = entries(nft)
    plan, token = apply(nft, *sticky("web", (A, B, "10.244.1.12")), *sticky("api", (A,), ip="10.96.0.51"))
    assert not plan.empty and forgotten_affinity_ids(plan) == {}
    nft.object_listings = []
    assert forget_affinity_clients(nft, TABLE, plan, token) == token
    assert nft.object_listings == [] and entries(nft) == before


def test_switching_to_the_kube_proxy_layout_needs_nothing(loaded):
    """The shared set is deleted with the switch: the ids are found, the set is not."""
    nft, _ = loaded
    plan, token = apply(nft, *sticky("web", (B,)), *sticky("api", (A,), ip="10.96.0.51"), layout="kube-proxy")
    assert AFFINITY_SET not in nft.tables[("ip", TABLE)].sets
    runs = len(nft.runs)
    assert forget_affinity_clients(nft, TABLE, plan, token) == token
    assert len(nft.runs) == runs


def test_an_entry_expiring_meanwhile_is_retried_with_a_fresh_listing(loaded):
    """The kernel refuses a `delete element` of an expired entry (the whole transaction):
    the next attempt lists again."""
    nft, first = loaded
    web = ids_of(first, "web")
    plan, token = apply(nft, *sticky("web", (B,)), *sticky("api", (A,), ip="10.96.0.51"))
    real_run, expired = nft.run, []

    def run(tx):
        if not expired and any(op.startswith("delete element") for op in tx):
            expired.append(tx)  # one entry expires after the listing, before this delete
            nft.tables[("ip", TABLE)].sets[AFFINITY_SET].elements.pop(f"{CLIENTS[0]} . {web[A][0]} . {web[A][1]}")
        real_run(tx)

    nft.run = run
    assert forget_affinity_clients(nft, TABLE, plan, token) == token + 1
    assert expired and not {k for k in entries(nft) if (k[1], k[2]) == tuple(map(str, web[A]))}


def test_a_failing_cleanup_warns_and_keeps_the_apply(loaded, caplog):
    nft, first = loaded
    plan, token = apply(nft, *sticky("web", (B,)), *sticky("api", (A,), ip="10.96.0.51"))
    before = entries(nft)

    def refuse(tx):
        raise NotFound("Error: Could not process rule: No such file or directory")

    nft.run = refuse
    with caplog.at_level("WARNING"):
        assert forget_affinity_clients(nft, TABLE, plan, token) == token
    assert entries(nft) == before
    assert "expire" in caplog.text and AFFINITY_SET in caplog.text


def test_another_commit_in_between_leaves_the_token_stale(loaded):
    nft, _ = loaded
    plan, token = apply(nft, *sticky("web", (B,)), *sticky("api", (A,), ip="10.96.0.51"))
    real_run = nft.run

    def run(tx):
        real_run(tx)
        nft.gen += 1  # someone else committed too

    nft.run = run
    assert forget_affinity_clients(nft, TABLE, plan, token) == token  # stale: the next plan lists
