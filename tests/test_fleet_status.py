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

from reconciler import clock, logs
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
def said():
    """The lines nftrec logs (its logger does not propagate to pytest's)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    h = Keep()
    logs.log.addHandler(h)
    yield lines
    logs.log.removeHandler(h)


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
    assert any("2 of 3 applied it; waiting for edge-003 (held: held: wave canary" in line for line in said)


def test_wait_exits_1_as_soon_as_one_node_of_the_wave_failed(at_t0, said):
    code, calls, _ = wait([CANARY_DONE + [FLEET[7]]])
    assert code == EXIT_FAILED and len(calls) == 1
    assert any("edge-008 failed it (rolled-back: health check" in line for line in said)
    # a failure in another wave, or of another revision, is not this gate's
    assert wait([CANARY_DONE + [rec("edge-020", "rest", "failed", applied=R1)]])[0] == EXIT_OK
    assert wait([CANARY_DONE + [rec("edge-021", "canary", "failed", applied=R1, attempted=R1),
                                rec("edge-021", "canary", "applied")]])[0] == EXIT_OK


def test_wait_exits_2_on_timeout_and_says_what_it_waited_for(at_t0, said):
    held = CANARY_DONE[:2] + [rec("edge-004", "canary", "held", applied=R1, error="paused: fleet.yaml's rollout.paused")]
    code, calls, out = wait([held], timeout=10.0)
    assert code == EXIT_TIMEOUT and out == ""
    assert clock.now() - T0 == 10.0 and len(calls) == 6  # at 0, 2, 4, 6, 8, 10
    assert "timed out after 10s: wave canary, revision 222222222222: 2 of 3 applied it; waiting for edge-004" in said[-1]
    # no node of the wave at all is no pass either
    assert wait([[FLEET[3]]], wave="canary", timeout=4.0)[0] == EXIT_TIMEOUT
    assert "no node of the wave has reported yet" in said[-1]


def test_an_unreachable_remote_is_retried_until_the_timeout(at_t0, said):
    code, calls, _ = wait(["fatal: unable to connect to 127.0.0.1"] * 3 + [CANARY_DONE])
    assert code == EXIT_OK and len(calls) == 4
    assert "file:///remote unreachable: fatal: unable to connect to 127.0.0.1; trying again" in said[0]
    code, _, _ = wait(["connection refused"], timeout=5.0)
    assert code == EXIT_TIMEOUT and "timed out after 5s: file:///remote unreachable: connection refused" in said[-1]


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
    assert code == EXIT_TIMEOUT and "waiting for edge-004 (no record)" in said[-1]
    late = CANARY_DONE + [rec("edge-004", "canary", "applied")]
    assert wait([CANARY_DONE, late], fleet_dir=tmp_path, inventory=inv)[0] == EXIT_OK
    from reconciler.engine import CommandError

    with pytest.raises(CommandError, match="wave 'early' is not in the fleet's rollout; its waves: canary, rest"):
        wait([late], wave="early", fleet_dir=tmp_path)
