"""doctor's checks as pure functions, and the whole command inside a test namespace."""

from __future__ import annotations

import io

import pytest

from reconciler.engine.doctor import SKIP_KERNEL_ENV, check_kernel, check_nft_version, check_privileges, run_doctor
from nsutil import in_ns


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
    assert "ok   nft version: 1." in out.getvalue() and "nftrec can run here." in out.getvalue()
    # the host's nft accepts nftrec's own spellings (found by check transactions)
    assert ("ok   nft spellings: endpoint maps: `typeof numgen random mod 1 : verdict` maps accepted, so shared maps"
            in out.getvalue()), out.getvalue()
    assert "affinity: `typeof ip saddr . numgen … . numgen …` sets accepted, so one shared set" in out.getvalue()
    in_ns(netns, "nft", "add", "table", "ip", "kube-proxy")
    out = io.StringIO()
    assert run_doctor(netns, "nftrec", out=out) == 0  # a warning, not a failure
    assert "warn conflicting tables: kube-proxy's tables exist (ip)" in out.getvalue()
    # doctor only probes (dry run): it created nothing
    assert in_ns(netns, "nft", "list", "tables").stdout.split() == ["table", "ip", "kube-proxy"]
