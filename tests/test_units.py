"""The systemd units in examples/systemd/ (what the package installs): each service rated
"OK" or better by `systemd-analyze security --offline=yes` (the score the README shows),
all passing `systemd-analyze verify`, the settings the node relies on (watch: Type=notify
with a watchdog; restore: early boot, again after nftables.service) present; and nftrec's
commands working under the units' restrictions where a tool can impose them here (no
systemd as PID 1): the capability bounding set of the unit (setpriv), no new privileges,
and memory that is never writable and executable at once (prctl PR_SET_MDWE, as
MemoryDenyWriteExecute=, on kernels from 6.3), in a throwaway namespace."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nsutil import EXAMPLES, in_ns
from test_cli_kernel import CONFIG, EDGE
from test_notify import Listener

UNITS = EXAMPLES / "systemd"
SERVICES = ("nftrec-watch.service", "nftrec-restore.service", "nftrec-apply.service")
OK_BOUND = 5.0  # systemd's ratings: below 5.0 is OK, below 1.0 SAFE, 0.0 PERFECT; from 5.0 on MEDIUM
NFTREC = str(Path(sys.executable).with_name("nftrec"))
HARDENING = {"CapabilityBoundingSet": "CAP_NET_ADMIN", "AmbientCapabilities": "CAP_NET_ADMIN",
             "ProtectSystem": "strict", "StateDirectory": "nftrec", "ProtectHome": "yes",
             "RestrictAddressFamilies": "AF_UNIX AF_NETLINK AF_INET AF_INET6",
             "SystemCallFilter": "@system-service", "NoNewPrivileges": "yes", "MemoryDenyWriteExecute": "yes"}


def settings(name: str) -> dict[str, list[str]]:
    """KEY -> its values, in order (continuation lines joined), over all sections."""
    found: dict[str, list[str]] = {}
    text = re.sub(r"\\\n\s*", " ", (UNITS / name).read_text())
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def _analyze(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here (apt install systemd)")
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.split()
    if int(version[1]) < 250:
        pytest.skip(f"systemd {version[1]}: `security --offline` needs 250 or later")
    return subprocess.run([tool, *args], capture_output=True, text=True)


def test_the_directory_holds_exactly_the_installed_units():
    assert sorted(p.name for p in UNITS.iterdir()) == sorted(
        [*SERVICES, "nftrec-apply.path", "nftrec-apply.timer"])


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_is_rated_ok_or_better_and_keeps_the_hardening(name):
    p = _analyze("security", "--offline=yes", "--no-pager", str(UNITS / name))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) < OK_BOUND and m.group(2) in ("OK", "SAFE", "PERFECT"), m.group(0)
    readme = (EXAMPLES.parent / "README.md").read_text()
    assert f"| `{name}` | {m.group(1)} {m.group(2)} |" in readme, f"README: show {name}'s score, {m.group(0)}"
    found = settings(name)
    for key, value in HARDENING.items():
        assert found.get(key) == [value], (name, key, found.get(key))
    assert all(c.startswith("/usr/bin/nftrec --state-dir /var/lib/nftrec ") for c in found["ExecStart"]), found


def test_every_unit_verifies(tmp_path):
    for unit in UNITS.iterdir():  # the installed binary's path, here the checkout's
        (tmp_path / unit.name).write_text(unit.read_text().replace("/usr/bin/nftrec", NFTREC))
    p = _analyze("verify", "--man=no", *sorted(str(u) for u in tmp_path.iterdir()))
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr


def test_watch_notifies_and_restore_runs_early_and_after_nftables():
    watch = settings("nftrec-watch.service")
    assert watch["Type"] == ["notify"] and watch["NotifyAccess"] == ["main"] and watch["WatchdogSec"]
    check = "/usr/bin/nftrec --state-dir /var/lib/nftrec doctor --config /etc/nftrec/config.yaml"
    assert watch["ExecStartPre"] == [check] and watch["ExecReload"] == [check, "/bin/kill -HUP $MAINPID"]
    restore = settings("nftrec-restore.service")
    assert restore["DefaultDependencies"] == ["no"] and "network-pre.target" in restore["Before"][0].split()
    assert restore["PartOf"] == ["nftables.service"] and "nftables.service" in restore["After"][0].split()
    assert restore["ExecStart"] == ["/usr/bin/nftrec --state-dir /var/lib/nftrec apply --restore"]
    assert restore["Type"] == ["oneshot"] and restore["RemainAfterExit"] == ["yes"]
    # a node that never applied has no commit record: the unit is skipped, not failed
    assert restore["ConditionPathExistsGlob"] == ["/var/lib/nftrec/host/tables/*/commits.jsonl"]


# PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN; kernels before 6.3 lack it (EINVAL): run without
MDWE = ("import ctypes, errno, os, sys\n"
        "if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) and ctypes.get_errno() != errno.EINVAL:\n"
        "    raise SystemExit('PR_SET_MDWE: ' + os.strerror(ctypes.get_errno()))\n"
        "os.execvp(sys.argv[1], sys.argv[1:])\n")


@pytest.mark.kernel
def test_the_commands_work_under_the_units_restrictions(netns, tmp_path):
    caps = settings("nftrec-watch.service")["CapabilityBoundingSet"][0].lower().replace("cap_", "")
    state = tmp_path / "state"

    def confined(*args: str) -> list[str]:  # the host namespace, as far as nftrec can tell
        return ["ip", "netns", "exec", netns, sys.executable, "-c", MDWE, "setpriv", "--no-new-privs",
                f"--bounding-set=-all,+{caps}", "--inh-caps=-all", NFTREC, "--state-dir", str(state), *args]

    def run(*args: str) -> str:
        p = subprocess.run(confined(*args), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    assert "nftrec can run here" in run("doctor", "--config", str(CONFIG))
    run("apply", str(EDGE), "--config", str(CONFIG))
    in_ns(netns, "nft", "flush", "ruleset")
    assert "Restore complete" in run("apply", "--restore")
    in_ns(netns, "nft", "list", "table", "ip", "nftrec")
    in_ns(netns, "nft", "flush", "ruleset")
    listener = Listener(str(tmp_path / "notify"), ns=netns)
    watch = subprocess.Popen(confined("watch", str(EDGE), "--config", str(CONFIG), "--metrics-address",
                                      "127.0.0.1:0"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NOTIFY_SOCKET": str(tmp_path / "notify"),
                                  "WATCHDOG_USEC": "2000000"})
    try:
        listener.wait("READY=1", timeout=30)
        assert listener.lines("READY=1")[0][1] is True  # the kernel held the table by then
        listener.wait("WATCHDOG=1", 2)
    finally:
        watch.terminate()
        out = watch.communicate(timeout=20)[0]
        listener.close()
    assert watch.returncode == 0 and "Traceback" not in out, out
