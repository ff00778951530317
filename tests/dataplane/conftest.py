"""Fixtures of the data-plane tests; the topology itself is in dp_topology.py."""

from __future__ import annotations

import uuid

import pytest

from dp_topology import Topology, build, kernel_ready, nsx, start_servers, teardown


@pytest.fixture(scope="module")
def topo():
    why = kernel_ready()
    if why:
        pytest.fail(why)  # never a silent skip: CI must run these
    prefix = f"nftrec-dp-{uuid.uuid4().hex[:6]}"
    ns = {role: f"{prefix}-{role}" for role in ("node", "clientA", "clientB", "pod", "backend")}
    t = Topology(prefix, ns)
    try:
        build(ns)
        t.servers.extend(start_servers(ns))
        yield t
    finally:
        teardown(ns, t.servers)


@pytest.fixture
def dp(topo):
    """The module topology with an empty node (no nftrec tables) and clean conntrack."""
    for family in ("ip", "ip6"):
        nsx(topo.node, "nft", "delete", "table", family, "nftrec", check=False)
    topo.flush_conntrack()
    topo.loaded_ruleset, topo.hand_loaded = None, False  # see trace_check.py
    yield topo

