"""`nftrec fleet status REMOTE`: the report of a revision (applied, held with its kind,
failed with its error, offline, pending) as text, JSON and Markdown, and `--wait WAVE`'s
exit codes (0 applied, 1 one failed at once, 2 timeout, an unreachable remote retried).

The report and the gate read records the way fetch_records returns them; the end-to-end
tests push them to real git remotes (a bare repository on file:// and one served by
`git daemon` on 127.0.0.1) and run nftrec as a subprocess with its clock offset.
"""

from __future__ import annotations

import io
import json
import logging

import pytest

from reconciler import clock
from reconciler.engine.fleetstatus import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, run_fleet_status
from reconciler.intake import Record

T0 = 1_800_000_000.0  # the test clock's start
R1, R2 = "1" * 40, "2" * 40


def rec(node: str, wave: str, outcome: str, *, applied: str = R2, attempted: str = R2, error: str = "",
        t: float = T0, labels=()) -> Record:
    return Record(node, tuple(labels), wave, applied, attempted, outcome, error, t)


FLEET = [
    rec("edge-001", "canary", "applied", t=T0 - 60),
    rec("edge-002", "canary", "applied", t=T0 - 50),
    rec("edge-003", "canary", "applied", t=T0 - 40),
    rec("edge-004", "early", "held", applied=R1, error="held: wave early opens at 2027-01-15T08:30:00Z", t=T0 - 30),
    rec("edge-005", "early", "held", applied=R1, error="held: wave early opens at 2027-01-15T08:30:00Z", t=T0 - 30),
    rec("edge-006", "rest", "held", applied=R1, error="held locally: change freeze (until 2027-01-16T00:00:00Z)",
        t=T0 - 20),
    rec("edge-007", "rest", "halted", applied=R1, error="halted: 1 of wave canary failed " + R2[:12], t=T0 - 20),
    rec("edge-008", "canary", "rolled-back", applied=R1, error="health check https://127.0.0.1/ failed\nmore", t=T0 - 70),
    rec("edge-009", "rest", "applied", t=T0 - 4 * 3600),  # not seen for 4h: offline
    rec("edge-010", "rest", "applied", applied=R1, attempted=R1, t=T0 - 10),  # has not seen R2 yet
]


@pytest.fixture
def at_t0():
    now = [T0]
    clock.set_clock(lambda: now[0])
    yield now
    clock.set_clock(None)


@pytest.fixture
def said(caplog):
    """nftrec's log lines (conftest's caplog sees its logger)."""
    caplog.set_level(logging.INFO, logger="nftrec")
    return caplog


def fixed(records, error=None):
    calls = []

    def fetch(remote, ssh_key=None, *, timeout=30.0):
        calls.append(remote)
        return (records, None) if error is None else ((), error)

    fetch.calls = calls
    return fetch


def report(output: str, records=FLEET, **kw) -> tuple[int, str]:
    out = io.StringIO()
    code = run_fleet_status("file:///remote", output=output, stream=out, fetch=fixed(records), **kw)
    return code, out.getvalue()


def test_the_report_sorts_every_node_of_the_newest_revision(at_t0):
    code, text = report("json")
    assert code == EXIT_OK
    doc = json.loads(text)
    assert doc["revision"] == R2 and doc["nodes"] == 10 and doc["offlineAfterSeconds"] == 3 * 3600
    names = {s: [n["node"] for n in doc[s]["nodes"]] for s in ("applied", "held", "failed", "offline", "pending")}
    assert names == {"applied": ["edge-001", "edge-002", "edge-003"],
                     "held": ["edge-004", "edge-005", "edge-006", "edge-007"],
                     "failed": ["edge-008"], "offline": ["edge-009"], "pending": ["edge-010"]}
    held = {n["node"]: n["kind"] for n in doc["held"]["nodes"]}
    assert held == {"edge-004": "wave", "edge-005": "wave", "edge-006": "local-hold", "edge-007": "halted"}
    assert doc["failed"]["nodes"][0]["reason"] == "rolled-back: health check https://127.0.0.1/ failed"
    assert doc["offline"]["nodes"][0]["reason"].startswith("last seen ")
    assert doc["pending"]["nodes"][0]["reason"] == "runs " + R1[:12]


def test_text_groups_nodes_by_reason_with_compressed_names(at_t0):
    _, text = report("text")
    assert text.splitlines()[0] == f"Revision {R2[:12]}: 10 nodes reporting"
    assert "  applied     3  edge-001…edge-003" in text
    assert "edge-004, edge-005 (2 nodes): held: wave early opens at 2027-01-15T08:30:00Z" in text
    assert "edge-006 (1 node): held locally: change freeze" in text
    assert "edge-008 (1 node): rolled-back: health check https://127.0.0.1/ failed" in text
    assert "more" not in text  # the first line of the error only


def test_markdown_is_a_table_with_no_markup_from_the_records(at_t0):
    evil = FLEET + [rec("edge-011", "rest", "failed", error="<img src=x> | `rm -rf`", t=T0 - 5)]
    _, md = report("markdown", evil)
    assert md.startswith("<!-- nftrec-fleet-status -->\n### nftrec fleet status `222222222222`")
    assert "**3 of 11 nodes applied it.**" in md
    assert "| applied | edge-001…edge-003 | 3 | |" in md
    assert "| failed | edge-011 | 1 | failed: &lt;img src=x&gt; \\| \\`rm -rf\\` |" in md


def test_a_node_held_after_applying_the_revision_runs_it(at_t0):
    held_after = [rec("edge-001", "canary", "held", error="held locally: maintenance (until release)")]
    doc = json.loads(report("json", held_after)[1])
    assert doc["applied"]["count"] == 1 and doc["held"]["count"] == 0


def test_revision_selects_an_older_one_by_a_short_commit(at_t0):
    _, text = report("json", revision=R1[:8])
    doc = json.loads(text)
    assert doc["revision"] == R1[:8]
    assert [n["node"] for n in doc["applied"]["nodes"]] == ["edge-004", "edge-005", "edge-006", "edge-007",
                                                            "edge-008", "edge-010"]


def test_offline_after_and_the_fleets_interval_set_the_threshold(at_t0, tmp_path):
    _, text = report("json", offline_after=30.0)
    assert [n["node"] for n in json.loads(text)["offline"]["nodes"]] == ["edge-001", "edge-002", "edge-003",
                                                                         "edge-008", "edge-009"]
    (tmp_path / "fleet.yaml").write_text("apiVersion: nftrec/v1alpha1\nkind: Fleet\nlayers: [{path: base}]\n"
                                         "rollout:\n  interval: 2h\n  waves: [{name: canary, percent: 10}, "
                                         "{name: rest, percent: 100}]\n")
    _, text = report("json", fleet_dir=tmp_path)
    doc = json.loads(text)
    assert doc["offlineAfterSeconds"] == 6 * 3600 and doc["offline"]["count"] == 0


def wait(records_seq, wave="canary", revision=R2, timeout=60.0, error=None, **kw):
    """run_fleet_status --wait with fetch returning records_seq[i] on its i-th call (the
    last one thereafter) and sleep advancing the test clock."""
    calls = []

    def fetch(remote, ssh_key=None, *, timeout=30.0):
        i = min(len(calls), len(records_seq) - 1)
        calls.append(clock.now())
        item = records_seq[i]
        return ((), item) if isinstance(item, str) else (item, None)

    def sleep(seconds):
        now = clock.now()
        clock.set_clock(lambda: now + seconds)

    out = io.StringIO()
    code = run_fleet_status("file:///remote", revision=revision, wait=wave, timeout=timeout, stream=out,
                            fetch=fetch, sleep=sleep, **kw)
    return code, calls, out.getvalue()


CANARY_DONE = [r for r in FLEET if r.node in ("edge-001", "edge-002", "edge-003")]


def test_wait_exits_0_once_every_node_of_the_wave_applied(at_t0, said):
    pending = [CANARY_DONE[0], CANARY_DONE[1], rec("edge-003", "canary", "held", applied=R1, error="held: wave canary "
                                                    "opens at 2027-01-15T08:00:00Z")]
    code, calls, out = wait([pending, pending, CANARY_DONE])
    assert code == EXIT_OK and len(calls) == 3
    assert calls[1] - calls[0] == 2.0  # polled every 2s of the clock
    assert json.loads(wait([CANARY_DONE], output="json")[2])["applied"]["count"] == 3
    assert any("2 of 3 applied it; waiting for edge-003 (held: wave canary" in line for line in said.messages)


def test_wait_exits_1_as_soon_as_one_node_of_the_wave_failed(at_t0, said):
    code, calls, _ = wait([CANARY_DONE + [FLEET[7]]])
    assert code == EXIT_FAILED and len(calls) == 1
    assert any("edge-008 failed it (rolled-back: health check" in line for line in said.messages)
    # a failure in another wave, or of another revision, is not this gate's
    assert wait([CANARY_DONE + [rec("edge-020", "rest", "failed", applied=R1)]])[0] == EXIT_OK
    assert wait([CANARY_DONE + [rec("edge-021", "canary", "failed", applied=R1, attempted=R1),
                                rec("edge-021", "canary", "applied")]])[0] == EXIT_OK


def test_wait_exits_2_on_timeout_and_says_what_it_waited_for(at_t0, said):
    held = CANARY_DONE[:2] + [rec("edge-004", "canary", "held", applied=R1, error="paused: fleet.yaml's rollout.paused")]
    code, calls, out = wait([held], timeout=10.0)
    assert code == EXIT_TIMEOUT and out.startswith(f"Revision {R2[:12]}: 3 nodes reporting")
    assert clock.now() - T0 == 10.0 and len(calls) == 6  # at 0, 2, 4, 6, 8, 10
    assert "timed out after 10s: wave canary, revision 222222222222: 2 of 3 applied it; waiting for edge-004" in said.messages[-1]
    gone = CANARY_DONE[:2] + [rec("edge-003", "canary", "held", applied=R1, error="paused: x", t=T0 - 4 * 3600)]
    assert wait([gone], timeout=2.0)[0] == EXIT_TIMEOUT
    assert "waiting for edge-003 (paused: x; offline, last seen 2027-01-15T04:00:00Z)" in said.messages[-1]
    # no node of the wave at all is no pass either
    assert wait([[FLEET[3]]], wave="canary", timeout=4.0)[0] == EXIT_TIMEOUT
    assert "no node of the wave has reported yet" in said.messages[-1]


def test_an_unreachable_remote_is_retried_until_the_timeout(at_t0, said):
    code, calls, _ = wait(["fatal: unable to connect to 127.0.0.1"] * 3 + [CANARY_DONE])
    assert code == EXIT_OK and len(calls) == 4
    assert "file:///remote unreachable: fatal: unable to connect to 127.0.0.1; trying again" in said.messages[0]
    code, _, out = wait(["connection refused"], timeout=5.0)
    assert code == EXIT_TIMEOUT and out == "" and "timed out after 5s: file:///remote unreachable: connection refused" in said.messages[-1]


def test_wait_needs_a_revision_and_known_options():
    res = nftrec("fleet", "status", "file:///nowhere", "--wait", "canary")
    assert res.returncode == 64 and "--wait needs --revision R" in res.stderr
    res = nftrec("fleet", "status", "file:///nowhere", "--revision", R2, "--timeout", "soon")
    assert res.returncode == 64 and "'soon' is not a positive duration" in res.stderr
    res = nftrec("fleet", "status", "file:///nowhere", "-o", "yaml")
    assert res.returncode == 64


def test_an_inventory_keeps_the_gate_shut_for_a_node_that_never_pushed(at_t0, said, tmp_path):
    (tmp_path / "fleet.yaml").write_text("apiVersion: nftrec/v1alpha1\nkind: Fleet\nlayers: [{path: base}]\n"
                                         "rollout:\n  interval: 30m\n  waves:\n"
                                         "  - {name: canary, selector: {matchLabels: {ring: canary}}}\n"
                                         "  - {name: rest, percent: 100}\n")
    inv = tmp_path / "inventory.yaml"
    inv.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeInventory\nnodes:\n"
                   + "".join(f"- {{name: edge-00{i}, labels: {{ring: canary}}}}\n" for i in (1, 2, 3, 4))
                   + "- {name: edge-100, labels: {ring: main}}\n")
    code, _, _ = wait([CANARY_DONE], timeout=4.0, fleet_dir=tmp_path, inventory=inv)
    assert code == EXIT_TIMEOUT and "waiting for edge-004 (no record)" in said.messages[-1]
    late = CANARY_DONE + [rec("edge-004", "canary", "applied")]
    assert wait([CANARY_DONE, late], fleet_dir=tmp_path, inventory=inv)[0] == EXIT_OK
    # an applied record names no wave: the rollout places the node by the labels it pushed
    unnamed = CANARY_DONE[:2] + [rec("edge-003", "", "applied", labels=[("ring", "canary")]),
                                 rec("edge-004", "", "held", applied=R1, labels=[("ring", "canary")])]
    assert wait([unnamed], timeout=2.0, fleet_dir=tmp_path)[0] == EXIT_TIMEOUT
    assert said.messages[-1].endswith("3 of 4 applied it; waiting for edge-004 (held)")
    assert wait([unnamed], timeout=2.0)[0] == EXIT_OK  # without --fleet only the records' waves count
    assert said.messages[-1].endswith("all 2 nodes applied it")
    from reconciler.engine import CommandError

    with pytest.raises(CommandError, match="wave 'early' is not in the fleet's rollout; its waves: canary, rest"):
        wait([late], wave="early", fleet_dir=tmp_path)


# --- end to end: records on real git remotes, nftrec as a subprocess -------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bare(tmp_path):
    import subprocess

    base = tmp_path / "remotes"
    base.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", str(base / "fleet.git")], check=True, timeout=60)
    return base


@pytest.fixture
def daemon(bare):
    """`git daemon --enable=receive-pack` serving `bare` on 127.0.0.1: git://127.0.0.1:PORT/fleet.git."""
    import socket
    import subprocess
    import time

    port = _free_port()
    proc = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                             f"--base-path={bare}", "--listen=127.0.0.1", f"--port={port}", str(bare)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}/fleet.git"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def push(remote: str, records, state) -> None:
    """Each record pushed by its node's StatusChannel (one per node, as on the nodes),
    in order; returns once the remote holds every node's last one."""
    import time

    from reconciler.engine.statusrecords import StatusChannel, StatusSettings, fetch_records

    channels = {}
    for r in records:
        if r.node not in channels:
            channels[r.node] = StatusChannel(state / r.node, StatusSettings(remote))
        channels[r.node].enqueue(r)
    def key(r):
        return r.node, r.outcome, r.applied, r.attempted, round(r.time, 3)

    last = {r.node: key(r) for r in records}
    for ch in channels.values():
        ch.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got, _ = fetch_records(remote)
            if {g.node: key(g) for g in got if g.node in last} == last:
                return
            time.sleep(0.1)
        raise AssertionError(f"the records did not reach {remote}")
    finally:
        for ch in channels.values():
            ch.stop()


def nftrec(*args: str, offset: float = 0.0):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, NFTREC_CLOCK_OFFSET=str(offset))
    exe = Path(sys.executable).with_name("nftrec")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env)


def _at(records, base: float):
    """FLEET's records with times relative to `base` instead of T0."""
    from dataclasses import replace

    return [replace(r, time=base + (r.time - T0)) for r in records]


@pytest.mark.parametrize("kind", ["file", "daemon"])
def test_fleet_status_reads_every_state_from_a_real_remote(kind, bare, tmp_path, request):
    import time

    remote = f"file://{bare}/fleet.git" if kind == "file" else request.getfixturevalue("daemon")
    now = time.time()
    # edge-008 first applied R1, then failed R2: its ref's log holds both, the report its latest
    history = [rec("edge-008", "canary", "applied", applied=R1, attempted=R1, t=now - 3600)] + _at(FLEET, now)
    push(remote, history, tmp_path / "state")
    res = nftrec("fleet", "status", remote, "-o", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["revision"] == R2
    assert {s: doc[s]["count"] for s in ("applied", "held", "failed", "offline", "pending")} == \
        {"applied": 3, "held": 4, "failed": 1, "offline": 1, "pending": 1}
    text = nftrec("fleet", "status", remote, "--revision", R1[:12]).stdout
    assert "applied     6  edge-004…edge-008, edge-010" in text
    md = nftrec("fleet", "status", remote, "-o", "markdown").stdout
    assert "| failed | edge-008 | 1 | rolled-back: health check https://127.0.0.1/ failed\\nmore |" in md
    # the clock set 5h on: every node is offline
    late = json.loads(nftrec("fleet", "status", remote, "-o", "json", offset=5 * 3600).stdout)
    assert late["offline"]["count"] == 10


def test_wait_exit_codes_on_a_real_remote(daemon, tmp_path):
    import time

    now = time.time()
    canary = _at(CANARY_DONE, now)
    push(daemon, canary + _at([FLEET[3]], now), tmp_path / "state")
    assert nftrec("fleet", "status", daemon, "--revision", R2, "--wait", "canary", "--timeout", "30s").returncode == 0
    res = nftrec("fleet", "status", daemon, "--revision", R2, "--wait", "early", "--timeout", "3s")
    assert res.returncode == 2 and "waiting for edge-004 (held: wave early opens at" in res.stderr
    push(daemon, [rec("edge-005", "early", "failed", applied=R1, error="invalid: x.yaml:3:1: bad port", t=now)],
         tmp_path / "state")
    started = time.monotonic()
    res = nftrec("fleet", "status", daemon, "--revision", R2, "--wait", "early", "--timeout", "60s")
    assert res.returncode == 1 and time.monotonic() - started < 30
    assert "edge-005 failed it (failed: invalid: x.yaml:3:1: bad port)" in res.stderr
    # an unreachable remote: said, retried, then the timeout
    res = nftrec("fleet", "status", f"git://127.0.0.1:{_free_port()}/fleet.git", "--revision", R2, "--wait", "canary",
                 "--timeout", "3s")
    assert res.returncode == 2 and "unreachable" in res.stderr and "timed out after 3s" in res.stderr
