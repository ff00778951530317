"""`nftrec watch oci://...:TAG` against a real registry on loopback (tests/ociregistry.py)
and the real kernel in a throwaway namespace: a re-pushed tag is followed within
oci.interval plus the sync, the same digest is never synced again, a registry outage
changes nothing in the kernel (counted, in `status`, logged once) and the daemon recovers;
a restart with the registry down serves the artifact already in the store.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from ociregistry import push_artifact, registry  # noqa: F401 (fixture)
from test_cli_kernel import listing
from test_oci_cli import EDGE, name_of, node_config, tree_files, without_service
from watchproc import NFTREC, Watch

pytestmark = pytest.mark.kernel

REV2 = "main@sha1:89abcdef0123456789abcdef0123456789abcdef"
OCI = "oci:\n  insecure: true\n  interval: 1s\n"


def metric(w: Watch, name: str, labels: str = "") -> float:
    _, text = w.http("/metrics")
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def synced(w: Watch, revision: str) -> list[dict]:
    return [s for s in w.syncs() if s.get("revision") == revision]


def watching(registry, tmp_path, netns) -> tuple[dict, str, Watch]:  # noqa: F811
    """edge-small pushed as team/edge:prod and `watch` on it, once it has synced."""
    files = tree_files(EDGE)
    v1 = push_artifact(registry.host, "team/edge", "prod", files)
    w = Watch(netns, registry.ref("team/edge", "prod"), node_config(tmp_path, OCI), tmp_path / "state")
    try:
        w.wait(lambda: synced(w, name_of(v1)), 30, what="the first sync of v1")
    except BaseException:
        w.stop()
        raise
    return files, v1, w


def test_watch_follows_a_repushed_tag_and_never_resyncs_a_digest(registry, tmp_path, netns):  # noqa: F811
    files, v1, w = watching(registry, tmp_path, netns)
    try:
        assert "dns" in listing(netns)
        v2 = push_artifact(registry.host, "team/edge", "prod", without_service(files, "dns"), revision=REV2)
        pushed = time.monotonic()
        w.wait(lambda: synced(w, name_of(v2, REV2)), 30, what="the sync of the re-pushed tag")
        took = time.monotonic() - pushed
        assert "dns" not in listing(netns)
        assert took < 1 + 10, took  # interval 1 s + the sync, with a wide margin for a busy machine
        # the same digest: polled (one HEAD each), never pulled or synced again
        polls = metric(w, "nftrec_source_polls_total")
        w.wait(lambda: metric(w, "nftrec_source_polls_total") >= polls + 3, 20, what="three more polls")
        assert metric(w, "nftrec_source_pulls_total") == 2
        assert len(synced(w, name_of(v2, REV2))) == 1
        assert len(synced(w, name_of(v1))) == 1
        heads = registry.requests("HEAD", "/v2/team/edge/manifests/prod")
        gets = registry.requests("GET", "/v2/team/edge/manifests/")
        assert len(heads) >= 5 and len(gets) == 2, (heads, gets)
        st = w.status(lambda s: s.get("source", {}).get("digest") == v2)
        assert st["lastAppliedRevision"] == name_of(v2, REV2)
        assert st["source"]["reference"] == registry.ref("team/edge", "prod") and st["source"]["lastError"] is None
    finally:
        assert w.stop() == 0


def test_a_registry_outage_changes_nothing_and_the_daemon_recovers(registry, tmp_path, netns):  # noqa: F811
    files, v1, w = watching(registry, tmp_path, netns)
    try:
        before = listing(netns)
        registry.stop()
        errors = 'nftrec_source_errors_total'
        w.wait(lambda: metric(w, errors, '{reason="unreachable"}') >= 3, 30, what="three failed polls")
        assert listing(netns) == before
        failing = [x for x in w.events("source") if x.get("ok") is False]
        assert len(failing) == 1, failing  # one log line for the outage, not one per retry
        st = w.status(lambda s: (s.get("source") or {}).get("lastErrorReason") == "unreachable")
        assert st["source"]["failures"] >= 1 and st["source"]["digest"] == v1
        code, text = w.http("/healthz")
        assert code == 200 and "failing" in text, text  # the ruleset is served; the source is a separate matter

        registry.start()  # same port, same storage
        v2 = push_artifact(registry.host, "team/edge", "prod", without_service(files, "dns"), revision=REV2)
        w.wait(lambda: synced(w, name_of(v2, REV2)), 30, what="the sync after the outage")
        assert "dns" not in listing(netns)
        assert any("reachable again" in x.get("msg", "") for x in w.events("source"))
        code, text = w.http("/healthz")
        assert code == 200 and "failing" not in text, text
    finally:
        assert w.stop() == 0


def test_a_restart_with_the_registry_down_serves_the_stored_artifact(registry, tmp_path, netns):  # noqa: F811
    _, v1, w = watching(registry, tmp_path, netns)
    assert w.stop() == 0
    state, cfg = tmp_path / "state", node_config(tmp_path, OCI)
    registry.stop()
    in_kernel = listing(netns)
    w = Watch(netns, registry.ref("team/edge", "prod"), cfg, state)
    try:
        [sync] = w.wait(lambda: synced(w, name_of(v1)), 30, what="the sync of the stored artifact")
        assert sync["operations"] == 0  # the kernel already holds it
        w.wait(lambda: metric(w, "nftrec_source_errors_total", '{reason="unreachable"}') >= 1, 20,
               what="a failed poll")
        assert listing(netns) == in_kernel
    finally:
        assert w.stop() == 0


def test_nothing_happens_before_the_first_fetch(registry, tmp_path, netns):  # noqa: F811
    state = tmp_path / "state"
    w = Watch(netns, registry.ref("team/edge", "prod"), node_config(tmp_path, OCI), state)
    try:
        w.wait(lambda: metric(w, "nftrec_source_errors_total", '{reason="not-found"}') >= 2, 20,
               what="two polls of a tag that is not there yet")
        assert w.syncs() == [] and not [x for x in w.events("invalid")]
        p = subprocess.run([NFTREC, "--state-dir", str(state), "status", "--netns", netns, "--config",
                            str(w.config)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "nothing fetched yet" in p.stderr and "(not-found)" in p.stderr, p.stderr
        v1 = push_artifact(registry.host, "team/edge", "prod", tree_files(EDGE))
        w.wait(lambda: synced(w, name_of(v1)), 30, what="the first sync once pushed")
        assert "dns" in listing(netns)
    finally:
        assert w.stop() == 0


# --- the fetcher's logic, with the registry replaced (fast; the tests above use the real one) ----


class FakeRegistry:
    """resolve/pull for daemon.fetcher: `digest` is what the tag points at, `error` a
    SourceError to raise instead; pulls write a real tree and metadata into the store."""

    def __init__(self):
        self.digest, self.error, self.heads, self.pulls = None, None, 0, 0

    def resolve(self, ref, settings):
        self.heads += 1
        if self.error is not None:
            raise self.error
        return self.digest

    def pull(self, ref, settings, store, *, digest=None, signatures=False, check=None, publish=False):
        from reconciler.intake import artifact_at
        from reconciler.intake.oci import publish as publish_it, write_metadata

        self.pulls += 1
        tree = store / digest.replace(":", "-")
        tree.mkdir(parents=True)
        (tree / "svc.yaml").write_text("# empty\n")
        write_metadata(tree, ref, digest, {"org.opencontainers.image.revision": "main@sha1:" + "0" * 40}, ())
        artifact = artifact_at(tree)
        if publish:
            publish_it(store, artifact)
        return artifact


@pytest.fixture
def fake_fetcher(tmp_path, monkeypatch):
    from reconciler.daemon import fetcher as module
    from reconciler.engine import Target
    from reconciler.intake import NodeConfig, OciSettings

    fake = FakeRegistry()
    monkeypatch.setattr(module, "resolve", fake.resolve)
    monkeypatch.setattr(module, "pull", fake.pull)
    cfg = NodeConfig(node_name="n", oci=OciSettings(interval=30.0))

    def make():
        f = module.Fetcher("oci://127.0.0.1:5000/team/edge:prod", Target(None, "nftrec", tmp_path / "state"))
        f.config = lambda: cfg
        return f

    return fake, make


def test_fetcher_pulls_a_new_digest_once_backs_off_and_recovers(fake_fetcher, caplog):
    from reconciler.intake import SourceError

    fake, make = fake_fetcher
    f = make()
    fake.digest = "sha256:" + "a" * 64
    assert not f.ready()
    assert f.poll() == 30.0 and f.ready() and fake.pulls == 1
    assert f.link.resolve().name == "sha256-" + "a" * 64
    swapped = f.link.lstat().st_mtime_ns
    for _ in range(3):  # unchanged: one resolve each, no pull, the link left alone
        assert f.poll() == 30.0
    assert fake.heads == 4 and fake.pulls == 1 and f.link.lstat().st_mtime_ns == swapped
    fake.error = SourceError("unreachable", "cannot connect to 127.0.0.1:5000")
    caplog.clear()
    delays = [f.poll() for _ in range(7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]  # exponential, capped at oci.interval
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
    assert f.ready() and f.link.resolve().name == "sha256-" + "a" * 64  # the last good one stays published
    assert "failing" in f.health_note()
    fake.error, fake.digest = None, "sha256:" + "b" * 64
    assert f.poll() == 30.0 and fake.pulls == 2 and f.failures == 0 and f.health_note() is None
    assert any("reachable again after 7 failed attempt(s)" in r.getMessage() for r in caplog.records)


def test_fetcher_at_start_keeps_its_own_published_artifact_only(fake_fetcher):
    from reconciler.engine import Target, read_source_state

    fake, make = fake_fetcher
    fake.digest = "sha256:" + "c" * 64
    f = make()
    f.poll()
    st = read_source_state(Target(None, "nftrec", f.target.state_root).store())
    assert st["digest"] == fake.digest and st["reference"] == "oci://127.0.0.1:5000/team/edge:prod"
    assert make().ready()  # a restart: this reference published it
    other = type(f)("oci://127.0.0.1:5000/team/edge:staging", f.target)
    assert not other.ready()  # another tag of the same repository: not used before its own fetch


def test_the_watcher_sees_only_the_link_swap_in_an_oci_store(tmp_path):
    """What the fetcher and prune do beside `current` (a .tmp- unpack, metadata files,
    another tree coming and going) triggers nothing; publish's swap triggers a sync."""
    import os
    import shutil
    import threading

    from reconciler.daemon.watcher import Watcher
    from reconciler.intake import artifact_at, parse_reference, publish
    from reconciler.intake.oci import METADATA, write_metadata

    store = tmp_path / "oci" / "127.0.0.1_5000" / "team+edge"
    store.mkdir(parents=True)
    ref = parse_reference("oci://127.0.0.1:5000/team/edge:prod")

    def tree(ch: str):
        t = store / ("sha256-" + ch * 64)
        t.mkdir()
        (t / "svc.yaml").write_text("kind: Service\n")
        write_metadata(t, ref, "sha256:" + ch * 64, {}, ())
        return artifact_at(t)

    publish(store, tree("a"))
    fired = threading.Event()
    w = Watcher(store / "current", fired.set, debounce=0.01, debounce_max=0.1)
    w.start()
    try:
        w.follow(str((store / "current").resolve()))
        (store / ".tmp-unpack").mkdir()
        (store / ".tmp-unpack" / "x.yaml").write_text("kind: Service\n")
        shutil.rmtree(store / ".tmp-unpack")
        b = tree("b")  # a pull: its tree (and metadata) beside the published one
        os.utime(store / ("sha256-" + "a" * 64) / METADATA)  # the published one's signatures rewritten
        tree("c")  # a prune: an old tree and its metadata removed
        shutil.rmtree(store / ("sha256-" + "c" * 64))
        assert not fired.wait(0.5)
        publish(store, b)
        assert fired.wait(5), "the swap of current was not seen"
    finally:
        w.stop()
