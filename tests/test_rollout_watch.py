"""`nftrec watch` under a fleet's rollout and the local hold, on the real kernel in a network
namespace: a new revision of a node in a later wave is held (compiled and checked at once,
so an invalid one is reported then), the kernel keeps the last applied revision through a
full sync and the repair of a flushed table, status, /readyz and the metrics say "held",
and the daemon applies the revision when its wave opens (an interval of a few seconds),
without polling for it. `nftrec hold` / `release` reach a running watch within a second.
"""

from __future__ import annotations

import re
import time

import pytest

from nsutil import in_ns, throwaway_netns
from rolloutfleet import make_fleet, nftrec, node_config, set_endpoint
from watchproc import Watch

pytestmark = pytest.mark.kernel

INTERVAL = 4.0  # seconds: wave `rest` opens this long after the revision was first seen (+ up to 10 % jitter)


def table(ns: str) -> str:
    return in_ns(ns, "nft", "list", "table", "ip", "nftrec").stdout


def metric(w: Watch, name: str, labels: str = "") -> float | None:
    _, text = w.http("/metrics")
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_a_later_wave_holds_the_revision_keeps_and_repairs_the_applied_one_and_applies_when_it_opens(tmp_path):
    root = make_fleet(tmp_path / "fleet", interval=f"{INTERVAL:g}s", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")  # no ring label: wave `rest` (index 1)
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            first = w.wait_sync(0)["revision"]  # nothing applied yet: at once
            assert "10.244.0.1" in table(ns)
            mark = len(w.lines)
            set_endpoint(root, "10.244.0.2")
            seen = time.monotonic()
            held = w.wait_event("rollout", mark, state="held")
            second = held["revision"]
            assert second != first and held["wave"] == "rest"
            assert "10.244.0.2" not in table(ns) and "10.244.0.1" in table(ns)
            code, text = w.http("/readyz")
            assert code == 503 and "held: wave rest opens" in text and f"{first[:19]}" in text, text
            assert w.http("/healthz")[0] == 200  # a held revision never turns the data plane red
            assert metric(w, "nftrec_rollout_held", '{state="held"}') == 1
            assert metric(w, "nftrec_rollout_wave", '{wave="rest"}') == 1
            opens = metric(w, "nftrec_rollout_opens_timestamp_seconds")
            assert opens and opens > time.time()
            st = w.status(lambda st: st.get("lastAttemptedRevision") == second)
            assert st["lastAppliedRevision"] == first and st["rollout"]["state"] == "held"

            # an invalid revision is reported at once, not when the wave opens
            mark = len(w.lines)
            (root / "base" / "broken.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {bogus: 1}\n")
            w.wait(lambda: w.find("invalid", mark), timeout=5, what="the invalid revision reported")
            assert time.monotonic() - seen < INTERVAL
            (root / "base" / "broken.yaml").unlink()

            # the applied revision is repaired while the new one is held
            mark = len(w.lines)
            in_ns(ns, "nft", "flush", "table", "ip", "nftrec")
            repair = w.wait_sync(mark, kind="full")
            assert repair["revision"] == first and "10.244.0.1" in table(ns)

            # the wave opens: applied without anything else happening
            mark = len(w.lines)
            done = w.wait_event("sync", mark, timeout=3 * INTERVAL, revision=second)
            assert "10.244.0.2" in table(ns) and "10.244.0.1" not in table(ns)
            assert time.monotonic() - seen >= INTERVAL * 0.9, done
            assert metric(w, "nftrec_rollout_held", '{state="held"}') == 0
            w.wait(lambda: w.http("/readyz")[0] == 200, timeout=5, what="ready")
            st = w.status(lambda st: st.get("lastAppliedRevision") == second and st.get("lastError") is None)
            assert "rollout" not in st
        finally:
            assert w.stop() == 0


def test_a_running_watch_sees_hold_and_release_within_a_second(tmp_path):
    root = make_fleet(tmp_path / "plain", plain=True, address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "n1")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            w.wait_sync(0)
            assert nftrec(state, "hold", "--netns", ns, "--reason", "site window").returncode == 0
            mark = len(w.lines)
            set_endpoint(root, "10.244.0.2")
            held = w.wait_event("rollout", mark, timeout=5, state="local-hold")
            assert "held locally: site window" in held["msg"]
            code, text = w.http("/readyz")
            assert code == 503 and "site window" in text
            assert metric(w, "nftrec_rollout_held", '{state="local-hold"}') == 1
            assert "10.244.0.2" not in table(ns)
            mark = len(w.lines)
            released = time.monotonic()
            assert nftrec(state, "release", "--netns", ns).returncode == 0
            w.wait_event("sync", mark, timeout=5, revision=held["revision"])
            assert time.monotonic() - released < 2.5  # the hold file is stat'ed twice a second
            assert "10.244.0.2" in table(ns)

            # a hold with --until ends by itself: the daemon wakes then
            assert nftrec(state, "hold", "--netns", ns, "--until", "3s").returncode == 0
            time.sleep(0.7)  # the daemon has seen the hold file (HOLD_POLL 0.5 s)
            mark = len(w.lines)
            set_endpoint(root, "10.244.0.3")
            held = w.wait_event("rollout", mark, timeout=5, state="local-hold")
            assert "10.244.0.3" not in table(ns)
            w.wait_event("sync", mark, timeout=8, revision=held["revision"])
            assert "10.244.0.3" in table(ns)
        finally:
            assert w.stop() == 0


def _remote(tmp_path) -> str:
    import subprocess

    bare = tmp_path / "status.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    return f"file://{bare}"


def test_outcomes_are_pushed_and_a_failed_canary_halts_a_later_wave(tmp_path):
    """status.remote is a file:// bare repository. The node's outcomes arrive as records
    (applied, then held); a canary node's record that it rolled back the revision halts
    this node (maxFailures: 0) when its wave opens, and the halt is reported too."""
    from reconciler.engine import StatusChannel, fetch_records
    from reconciler.intake import Record, StatusSettings

    remote = _remote(tmp_path)
    root = make_fleet(tmp_path / "fleet", interval=f"{INTERVAL:g}s", address="10.244.0.1")
    fleet = root / "fleet.yaml"
    fleet.write_text(fleet.read_text().replace("rollout:\n", "rollout:\n  maxFailures: 0\n"))
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    cfg.write_text(cfg.read_text() + f"status: {{remote: '{remote}'}}\n")
    state = tmp_path / "state"

    def latest(node: str):
        records, error = fetch_records(remote)
        return next((r for r in records if r.node == node), None)

    with throwaway_netns() as ns:
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            first = w.wait_sync(0)["revision"]
            rec = w.wait(lambda: (r := latest("edge-2")) and r.outcome == "applied" and r, timeout=15,
                         what="the applied record", step=0.2)
            assert rec.applied == first and rec.wave == "rest"
            mark = len(w.lines)
            set_endpoint(root, "10.244.0.2")
            second = w.wait_event("rollout", mark, state="held")["revision"]
            canary = StatusChannel(tmp_path / "canary-state", StatusSettings(remote))
            canary.start()
            try:
                canary.enqueue(Record("canary-1", (("ring", "canary"),), "canary", first, second, "rolled-back",
                                      "health check: tcp 10.96.0.10:80 refused", time.time()))
                w.wait(lambda: latest("canary-1"), timeout=10, what="the canary's record", step=0.1)
            finally:
                canary.stop()
            halted = w.wait_event("rollout", mark, timeout=3 * INTERVAL, state="halted")
            assert "canary-1 (health check)" in halted["msg"] and second in halted["msg"], halted
            assert "10.244.0.2" not in table(ns)
            assert metric(w, "nftrec_rollout_held", '{state="halted"}') == 1
            rec = w.wait(lambda: (r := latest("edge-2")) and r.outcome == "halted" and r, timeout=15,
                         what="the halted record", step=0.2)
            assert rec.attempted == second and rec.applied == first
        finally:
            assert w.stop() == 0


def test_an_unchanged_outcome_is_sent_again_once_per_full_sync_period():
    """fleet status calls a node offline when its latest record is older than 3 x
    max(interval, fullSyncPeriod): an idle node's unchanged outcome goes out again after
    each fullSyncPeriod (its full sync), and not on every sync in between."""
    from types import SimpleNamespace

    from reconciler import clock
    from reconciler.daemon.rollout import RolloutWatch

    sent = []
    now = [1_000_000.0]
    config = SimpleNamespace(node_name="edge-1", node_labels=(("site", "paris"),), full_sync_period=3600.0)
    daemon = SimpleNamespace(config=config, applied=SimpleNamespace(inventory=SimpleNamespace(revision="r1")))
    watch = RolloutWatch.__new__(RolloutWatch)  # no Gate, store or threads: report() alone
    watch.daemon, watch.rollout, watch.pushed = daemon, None, None
    watch.channel = SimpleNamespace(enqueue=sent.append)
    clock.set_clock(lambda: now[0])
    try:
        watch.report("applied", "r1", "")
        now[0] += 60
        watch.report("applied", "r1", "")  # a partial sync a minute later: nothing new
        assert len(sent) == 1
        now[0] += 3600
        watch.report("applied", "r1", "")  # the next full sync: sent again, with its time
        assert [r.time for r in sent] == [1_000_000.0, 1_003_660.0]
        watch.report("failed", "r2", "boom")  # another outcome: at once
        assert [r.outcome for r in sent] == ["applied", "applied", "failed"]
    finally:
        clock.set_clock(None)



RESTART_INTERVAL = 10.0  # seconds: the restarted daemon's checks run before the wave opens


def delete_rule(ns: str, text: str) -> None:
    """Delete, by its handle, the first rule of table ip nftrec whose text holds `text`
    (what an admin's `nft delete rule` does)."""
    chain = None
    for line in in_ns(ns, "nft", "-a", "list", "table", "ip", "nftrec").stdout.splitlines():
        m = re.match(r"\s*chain (\S+) \{", line)
        chain = m.group(1) if m else chain
        h = re.search(r"# handle (\d+)$", line)
        if h and text in line and not re.match(r"\s*(chain|set|map|type) ", line):
            in_ns(ns, "nft", "delete", "rule", "ip", "nftrec", chain, "handle", h.group(1))
            return
    raise AssertionError(f"no rule with {text!r} in table ip nftrec")


def applied_then_stopped(ns: str, root, cfg, state) -> str:
    """A watch that applies the first revision (nothing applied yet: at once), then stops;
    the revision it applied."""
    w = Watch(ns, root, cfg, state, "--debounce", "0.05")
    try:
        first = w.wait_sync(0)["revision"]
        w.status(lambda st: st.get("lastAppliedRevision") == first)
    finally:
        assert w.stop() == 0
    return first


def test_a_watch_restarted_while_a_revision_is_held_keeps_and_repairs_the_applied_one(tmp_path):
    """Revision A applied, the daemon stopped, B published in a wave not open yet: the
    restarted daemon keeps A from the state's last applied ruleset (no manifests of A are
    left), repairs a rule deleted by hand, stays healthy, says "held", and applies B when
    its wave opens."""
    root = make_fleet(tmp_path / "fleet", interval=f"{RESTART_INTERVAL:g}s", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")  # wave `rest` (index 1)
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        first = applied_then_stopped(ns, root, cfg, state)
        set_endpoint(root, "10.244.0.2")
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            seen = time.monotonic()
            held = w.wait_event("rollout", 0, state="held")
            second = held["revision"]
            assert second != first and held["wave"] == "rest"
            w.wait_sync(0, revision=first, kind="full")  # the restored ruleset, compared with the kernel
            code, text = w.http("/readyz")
            assert code == 503 and "held: wave rest opens" in text and first[:19] in text, text
            st = w.status(lambda st: st.get("lastAttemptedRevision") == second)
            assert st["lastAppliedRevision"] == first and st["rollout"]["state"] == "held", st

            mark = len(w.lines)
            delete_rule(ns, "10.244.0.1")
            repair = w.wait_sync(mark, kind="full")
            assert repair["revision"] == first and repair["driftObjects"] >= 1, repair
            assert "10.244.0.1" in table(ns) and "10.244.0.2" not in table(ns)
            code, text = w.http("/healthz")
            assert code == 200, text
            assert w.http("/readyz")[0] == 503
            st = w.status(lambda st: st.get("lastAttemptedRevision") == second)  # the repair kept the attempt
            assert st["lastAppliedRevision"] == first and st["rollout"]["state"] == "held", st
            assert time.monotonic() - seen < RESTART_INTERVAL, "the checks ran past the wave's opening"

            mark = len(w.lines)
            w.wait_event("sync", mark, timeout=3 * RESTART_INTERVAL, revision=second)
            assert "10.244.0.2" in table(ns) and "10.244.0.1" not in table(ns)
            w.wait(lambda: w.http("/readyz")[0] == 200, timeout=5, what="ready")
            w.status(lambda st: st.get("lastAppliedRevision") == second and st.get("lastError") is None)
        finally:
            assert w.stop() == 0


def test_a_restart_while_held_with_no_applied_ruleset_in_the_state_touches_nothing_and_says_so(tmp_path):
    """The state names A as applied but its ruleset is gone from the history: the held
    revision stays held (a local fault does not jump the wave), the kernel is left as it
    is (nothing guessed), the log says why, and /healthz fails with it: drift is not
    repaired."""
    import shutil

    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        applied_then_stopped(ns, root, cfg, state)
        histories = list(state.rglob("history"))
        assert histories, list(state.rglob("*"))
        for h in histories:
            shutil.rmtree(h)
        set_endpoint(root, "10.244.0.2")
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            held = w.wait_event("rollout", 0, state="held")
            said = w.wait(lambda: next((x for x in w.events("rollout") if x.get("ok") is False), None),
                          what="the restore refused")
            assert f"cannot keep the applied revision while revision {held['revision'][:19]}" in said["msg"], said
            code, text = w.http("/healthz")
            assert code == 503 and "cannot keep the applied revision" in text, text
            code, text = w.http("/readyz")
            assert code == 503 and "held: wave rest opens" in text, text
            assert "10.244.0.1" in table(ns) and "10.244.0.2" not in table(ns)
            assert not w.syncs()
        finally:
            assert w.stop() == 0


def test_sighup_starts_moves_and_stops_the_status_channel(tmp_path):
    """`status` in the node config, re-read on SIGHUP: added, the node's outcome arrives
    at the remote; moved to another remote, the next records arrive there (the queue is
    the state directory's, so nothing is lost); removed, nothing more is queued."""
    import signal

    from reconciler.engine import fetch_records

    root = make_fleet(tmp_path / "plain", plain=True, address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-1")
    plain = cfg.read_text()
    state = tmp_path / "state"
    one, two = _remote(tmp_path / "one"), _remote(tmp_path / "two")

    def latest(remote: str):
        records, error = fetch_records(remote)
        assert error is None, error
        return next((r for r in records if r.node == "edge-1"), None)

    def hup(w: Watch, text: str) -> None:
        cfg.write_text(text)
        mark = len(w.lines)
        w.proc.send_signal(signal.SIGHUP)
        w.wait_sync(mark, kind="full")  # the config re-read: a full sync, its outcome reported

    with throwaway_netns() as ns:
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            first = w.wait_sync(0)["revision"]
            hup(w, plain + f"status: {{remote: '{one}'}}\n")
            rec = w.wait(lambda: latest(one), timeout=15, what="a record at the first remote", step=0.2)
            assert (rec.outcome, rec.applied) == ("applied", first)

            hup(w, plain + f"status: {{remote: '{two}'}}\n")
            mark = len(w.lines)
            set_endpoint(root, "10.244.0.2")
            second = w.wait_sync(mark)["revision"]
            rec = w.wait(lambda: (r := latest(two)) and r.applied == second and r, timeout=15,
                         what="the next record at the second remote", step=0.2)
            assert rec.outcome == "applied"
            assert latest(one).applied == first  # the first remote got nothing more

            hup(w, plain)
            mark = len(w.lines)
            set_endpoint(root, "10.244.0.3")
            w.wait_sync(mark)
            queue = state.rglob("status-queue/*.json")
            assert not list(queue) and latest(two).applied == second
        finally:
            assert w.stop() == 0


class Silent:
    """A git:// remote that accepts each connection and says nothing for `hold` seconds,
    then closes it: git waits on it until then (a hung host), then fails."""

    def __init__(self, hold: float):
        import socket
        import threading

        self.hold, self.conns = hold, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"git://127.0.0.1:{self.sock.getsockname()[1]}/status.git"
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._close, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append((time.monotonic() + self.hold, conn))

    def _close(self) -> None:
        while not self.done.wait(0.1):
            for item in [c for c in self.conns if c[0] <= time.monotonic()]:
                self.conns.remove(item)
                item[1].close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()
        for _, conn in self.conns:
            conn.close()


@pytest.mark.parametrize("halt_on_unreachable", [True, False])
def test_a_hung_status_remote_delays_no_repair_and_its_answer_halts_or_opens(tmp_path, halt_on_unreachable):
    """maxFailures: 0 and a status remote that hangs for HUNG seconds. When the wave
    opens the node reads the earlier waves' records in the background: the revision is
    held meanwhile, saying so; a rule deleted by hand is repaired at once (not after the
    read); the read's answer (git fails when the remote hangs up) halts the revision, or
    with haltOnUnreachable: false applies it, without anything else happening."""
    hung = 8.0
    silent = Silent(hung)
    root = make_fleet(tmp_path / "fleet", interval=f"{INTERVAL:g}s", address="10.244.0.1")
    fleet = root / "fleet.yaml"
    fleet.write_text(fleet.read_text().replace("rollout:\n", "rollout:\n  maxFailures: 0\n" + (
        "" if halt_on_unreachable else "  haltOnUnreachable: false\n")))
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    cfg.write_text(cfg.read_text() + f"status: {{remote: '{silent.url}'}}\n")
    state = tmp_path / "state"
    try:
        with throwaway_netns() as ns:
            w = Watch(ns, root, cfg, state, "--debounce", "0.05")
            try:
                first = w.wait_sync(0)["revision"]
                mark = len(w.lines)
                set_endpoint(root, "10.244.0.2")
                second = w.wait_event("rollout", mark, state="held")["revision"]
                checking = w.wait(lambda: next((x for x in w.events("rollout", mark) if "halt check" in x["msg"]),
                                               None), timeout=3 * INTERVAL, what="the halt check")
                assert f"held: halt check: reading the earlier waves' records from {silent.url}" in checking["msg"]
                code, text = w.http("/readyz")
                assert code == 503 and "halt check: reading" in text, text
                mark = len(w.lines)
                delete_rule(ns, "10.244.0.1")
                repair = w.wait_sync(mark, kind="full")
                assert repair["revision"] == first, repair
                assert w.http("/healthz")[0] == 200
                if halt_on_unreachable:
                    answer = w.wait_event("rollout", mark, timeout=2 * hung, state="halted")
                    assert "cannot read the status records" in answer["msg"], answer
                    assert "10.244.0.1" in table(ns) and "10.244.0.2" not in table(ns)
                else:
                    answer = w.wait_event("sync", mark, timeout=2 * hung, revision=second)
                    assert "10.244.0.2" in table(ns) and "10.244.0.1" not in table(ns)
                # the repair went in while the read hung, not after its answer (log order, not timing)
                at = {id(x): i for i, x in enumerate(w.lines)}
                assert at[id(checking)] < at[id(repair)] < at[id(answer)], "".join(w.raw)
            finally:
                assert w.stop() == 0
    finally:
        silent.close()


def test_a_watch_started_after_cleanup_applies_at_once(tmp_path):
    """`nftrec cleanup` removed the tables on purpose: the node has applied nothing, so
    a revision in a wave not open yet goes in at once, as on a new node."""
    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        first = applied_then_stopped(ns, root, cfg, state)
        p = nftrec(state, "cleanup", "--netns", ns, "--config", str(cfg))
        assert p.returncode == 0, p.stderr
        set_endpoint(root, "10.244.0.2")
        w = Watch(ns, root, cfg, state, "--debounce", "0.05")
        try:
            second = w.wait_sync(0)["revision"]
            assert second != first and "10.244.0.2" in table(ns)
            assert not w.events("rollout")
        finally:
            assert w.stop() == 0


def _git_children() -> list[int]:
    import os
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        if rest.split()[1] == str(os.getpid()) and comm.endswith("(git"):
            found.append(int(stat.parent.name))
    return found


def test_the_halt_check_answers_in_the_background_and_stop_kills_its_read():
    """HaltCheck (watch's Gate.fetch) against a remote that hangs: the reason at once, the
    answer later with a wake-up; stopped during a read, its git is killed at once."""
    import threading

    from reconciler.daemon.haltcheck import HaltCheck
    from reconciler.intake import StatusSettings

    silent = Silent(1.0)
    woken = threading.Event()
    try:
        check = HaltCheck(lambda: StatusSettings(silent.url), woken.set, timeout=20)
        t0 = time.monotonic()
        said = check()
        assert said == f"held: halt check: reading the earlier waves' records from {silent.url}"
        assert check() == said and time.monotonic() - t0 < 0.5  # one read at a time, never waited for
        assert woken.wait(10)
        records, error = check()
        assert records == () and "cannot read the status records" in error, error

        silent.hold = 60.0
        check.reset()
        assert isinstance(check(), str)
        deadline = time.monotonic() + 5
        while not _git_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _git_children(), "the read's git did not start"
        t0 = time.monotonic()
        check.stop()
        assert time.monotonic() - t0 < 2.5 and not _git_children()
    finally:
        silent.close()
