"""Helpers for tests that use the real kernel: run commands, run them inside a network
namespace, make a throwaway namespace. Imported by tests as `from nsutil import ...`
(pyproject's pytest `pythonpath` puts tests/ on the path)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def sh(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command, capturing text output; raise with its stderr when it fails."""
    proc = subprocess.run(args, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def in_ns(ns: str, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *args, check=check, input=input)


def _kernel_ready() -> str | None:
    if os.geteuid() != 0:
        return "real-kernel tests need root (CI runs as root)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} not found: install iproute2 and nftables"
    return None


@contextlib.contextmanager
def throwaway_netns():
    """A fresh, empty network namespace (loopback up); deleted afterwards, always."""
    why = _kernel_ready()
    if why:
        pytest.fail(why)  # never a silent skip: CI must run these
    name = f"nftrec-t-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    try:
        in_ns(name, "ip", "link", "set", "lo", "up")
        yield name
    finally:
        sh("ip", "netns", "del", name, check=False)


def nft_scratch(script: str, *, check_only: bool) -> str:
    """Run an nft script in a throwaway user+network namespace (`unshare -rn`, no root
    needed): `nft -c -f` when check_only, else load it and return `nft list ruleset`.
    Fails the test with nft's own error and the script."""
    if shutil.which("unshare") is None or shutil.which("nft") is None:
        pytest.fail("unshare (util-linux) and nft (nftables) are needed")
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        cmd = 'nft -c -f "$1"' if check_only else 'nft -f "$1" && nft list ruleset'
        proc = subprocess.run(["unshare", "-rn", "sh", "-c", cmd, "sh", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    assert proc.returncode == 0, proc.stderr + "\n----\n" + script
    return proc.stdout


@functools.lru_cache(maxsize=None)
def nft_spelling():
    """The spellings this machine's nft accepts, found as plan and apply find them
    (kernel/features.py, in a throwaway namespace): nftrec's own from nft 1.0.1,
    kube-proxy's on 0.9.8. A test that loads a compiled ruleset into the kernel compiles
    with these. conftest probes once per session, before any test opens a context (one
    per process); without root, nftrec's own (kernel tests fail on root anyway)."""
    from reconciler.intake import NftSpelling
    from reconciler.kernel import Libnftables, probe_spelling

    if _kernel_ready():
        return NftSpelling()
    with throwaway_netns() as ns, Libnftables(netns=ns) as nft:
        return probe_spelling(nft)


def for_this_nft(config):
    """`config` with the spellings this machine's nft accepts (nft_spelling)."""
    from dataclasses import replace

    return replace(config, spelling=nft_spelling())


def needs_nft_spelling(what: str, backend=None) -> None:
    """Skip a test about the sharded layout's `what` ("index_maps" or "shared_affinity")
    on an nft that refuses it (never on kernel.Fake, given as `backend`); plan and apply
    use kube-proxy's spelling there, whose packets tests/dataplane/test_nft_spelling.py
    compares."""
    from reconciler.kernel import Fake

    if not isinstance(backend, Fake) and not getattr(nft_spelling(), what):
        version = subprocess.run(["nft", "--version"], capture_output=True, text=True).stdout.strip()
        pytest.skip(f"{version} refuses the sharded layout's {what.replace('_', ' ')}")
