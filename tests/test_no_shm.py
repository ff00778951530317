"""`nftrec apply` where POSIX semaphores cannot be made: /dev/shm read-only or absent, as in
a minimal container or a guest booted from an initramfs. The parallel intake pool cannot
start there; the read falls back to one process with one warning, and the ruleset applied
is the one a normal run applies. Each run is in its own mount namespace (`unshare -m`), so
the host's /dev is never touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsutil import in_ns, throwaway_netns

pytestmark = pytest.mark.kernel

NFTREC = str(Path(sys.executable).with_name("nftrec"))

# /dev/shm made unusable inside a private mount namespace, then nftrec run there ("$@").
READ_ONLY = 'mount -t tmpfs -o ro tmpfs /dev/shm; exec "$@"'
# a fresh /dev without shm/, keeping the few nodes a process expects
ABSENT = '''old=$(mktemp -d); mount --rbind /dev "$old"; mount -t tmpfs tmpfs /dev
for n in null zero random urandom; do touch /dev/$n; mount --bind "$old/$n" /dev/$n; done
exec "$@"'''


def _tree(root: Path, n: int = 24) -> Path:
    """n Services, one file each: enough cache misses for the pool (intake/cache.py MIN_PARALLEL)."""
    root.mkdir()
    for i in range(1, n + 1):
        (root / f"svc{i}.yaml").write_text(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: default}}\n"
            f"spec:\n  type: ClusterIP\n  clusterIP: 10.96.1.{i}\n"
            f"  ports: [{{name: http, port: 80, targetPort: 8080}}]\n")
    return root


def _run(cmd: list[str], setup: str | None) -> subprocess.CompletedProcess:
    if setup is not None:
        cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", setup, "sh", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})


def _apply(tree: Path, state: Path, ns: str, setup: str | None) -> subprocess.CompletedProcess:
    return _run([NFTREC, "--state-dir", str(state), "apply", str(tree), "--netns", ns], setup)


def _semaphores_work(setup: str) -> bool:
    """Whether this Python can make a POSIX semaphore under `setup`: glibc before 2.34 looks
    for another tmpfs when /dev/shm is absent (Debian 11 finds one), newer ones do not."""
    return _run([sys.executable, "-c", "import multiprocessing; multiprocessing.Lock()"], setup).returncode == 0


@pytest.mark.parametrize("setup", [READ_ONLY, ABSENT], ids=["read-only", "absent"])
def test_apply_without_dev_shm_reads_serially_and_applies_the_same_ruleset(tmp_path, setup):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("needs 2 cores or more: with one, the intake never starts its pool")
    tree = _tree(tmp_path / "tree")
    with throwaway_netns() as ns:
        p = _apply(tree, tmp_path / "state", ns, setup)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        warnings = [line for line in p.stderr.splitlines() if "worker processes" in line]
        if _semaphores_work(setup):  # the pool starts: nothing to say
            assert warnings == [], p.stderr
        else:
            assert len(warnings) == 1 and "one process" in warnings[0] and "/dev/shm" in warnings[0], p.stderr
        without = in_ns(ns, "nft", "list", "table", "ip", "nftrec").stdout
    with throwaway_netns() as ns:
        p = _apply(tree, tmp_path / "state2", ns, None)
        assert p.returncode == 0, p.stderr
        assert "worker processes" not in p.stderr
        assert in_ns(ns, "nft", "list", "table", "ip", "nftrec").stdout == without
    assert "10.96.1.24" in without
