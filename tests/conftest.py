"""Shared fixtures. Real-kernel tests run only inside network namespaces made here.

The host's own ruleset and interfaces are never touched: every `nft` a test runs goes
through `ip netns exec <ns>` (or nftrec's `--netns`), and every namespace made here is
deleted afterwards, even when the test fails. Helpers live in nsutil.py.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest

from nsutil import nft_spelling, throwaway_netns


@pytest.fixture
def caplog(caplog):
    """pytest's caplog, also seeing nftrec's logger, which does not propagate to the root
    (logs.setup). pytest >= 9 attaches its handler to such loggers itself; pytest 8, the
    last for Python 3.9, does not: the logger propagates while the test runs."""
    log = logging.getLogger("nftrec")
    was, log.propagate = log.propagate, True
    try:
        yield caplog
    finally:
        log.propagate = was


@pytest.fixture(scope="session", autouse=True)
def _nft_spelling_probed():
    """The spellings this nft accepts, probed before any test opens a libnftables context
    (nsutil.nft_spelling opens one of its own)."""
    nft_spelling()


@pytest.fixture(autouse=True)
def _gpg_agents_stopped(request):
    """Every gpg-agent a test's gpg started (one per GNUPGHOME under its tmp_path) stopped
    after the test: each holds an inotify instance until it exits, and the user's limit
    (128 by default) is shared with every `nftrec watch` of the run."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None or shutil.which("gpgconf") is None:
        return
    for keyring in tmp.rglob("pubring.kbx"):  # a GNUPGHOME (its agent's socket may be under /run/user)
        subprocess.run(["gpgconf", "--homedir", str(keyring.parent), "--kill", "gpg-agent"], capture_output=True,
                       timeout=30, check=False)


@pytest.fixture
def netns():
    with throwaway_netns() as name:
        yield name


@pytest.fixture(params=["fake", "kernel"])
def backend(request):
    """Each test twice: against kernel.Fake, and against the real kernel's nftables in a
    throwaway namespace (the Fake must behave as the kernel does)."""
    from reconciler.kernel import Fake, Libnftables

    if request.param == "fake":
        yield Fake()
        return
    nft = Libnftables(netns=request.getfixturevalue("netns"))
    try:
        yield nft
    finally:
        nft.close()
