"""doctor's checks as pure functions, and the whole command inside a test namespace."""

from __future__ import annotations

import io

import pytest

from reconciler.engine.doctor import SKIP_KERNEL_ENV, check_kernel, check_nft_version, check_privileges, run_doctor
from nsutil import in_ns
from reconciler.kernel import Libnftables, probe_spelling


def test_kernel_version_gate_and_skip():
    assert check_kernel("6.18.44-fc", {}).ok
    assert check_kernel("5.13.0", {}).ok
    old = check_kernel("5.10.0-23-amd64", {})
    assert not old.ok and "5.13" in old.detail and SKIP_KERNEL_ENV in old.detail
    assert check_kernel("5.10.0", {SKIP_KERNEL_ENV: "1"}).ok


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
