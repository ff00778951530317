"""The entry point's reading of a plain `plan`/`apply` command line (reconciler/cli.py):
whatever it does not read exactly as the typer command line would must be left to it."""

from __future__ import annotations

import pytest

from reconciler.cli import parse_plain


def test_plain_command_lines_are_read():
    assert parse_plain(["plan"]) == {"command": "plan"}
    assert parse_plain(["--state-dir", "s", "--log-format=json", "plan", "m", "--config", "c.yaml", "--netns=ns1",
                        "--strict", "-o", "json", "--detailed-exitcode", "-v"]) == {
        "state_dir": "s", "log_format": "json", "command": "plan", "dir": "m", "config": "c.yaml",
        "netns": "ns1", "strict": True, "output": "json", "detailed": True, "verbose": True}
    assert parse_plain(["apply", "--verify", "full", "m"]) == {"command": "apply", "verify": "full", "dir": "m"}


@pytest.mark.parametrize("argv", [
    [], ["status"], ["--version"], ["plan", "--help"], ["plan", "--refresh"], ["plan", "--out", "p.json"],
    ["plan", "--probe"], ["apply", "--plan", "p.json"], ["apply", "--rollback"], ["apply", "--confirm-timeout", "9s"],
    ["apply", "-o", "json"],  # apply has no -o
    ["plan", "a", "b"], ["plan", "-"], ["plan", "--", "m"], ["plan", "--config"], ["plan", "--config", ""],
    ["plan", "--config", "--strict"], ["plan", "--config", "a", "--config", "b"], ["plan", "--strict", "--strict"],
    ["plan", "-v", "--verbose"], ["plan", "-o", "yaml"], ["plan", "-ojson"], ["plan", "-o=json"],
    ["--log-format", "xml", "plan"], ["apply", "--verify", "none"], ["plan", "--state-dir", "s"],
    ["m", "plan"], ["plan", "--strict=true"], ["--show-completion", "bash"],
])
def test_everything_else_is_left_to_the_typer_command_line(argv):
    assert parse_plain(argv) is None


def test_the_version_read_without_importlib_metadata_is_importlib_metadatas(tmp_path, monkeypatch):
    import importlib.metadata
    import sys

    from reconciler import _installed_version

    try:
        expected = importlib.metadata.version("nftrec")
    except importlib.metadata.PackageNotFoundError:
        expected = "0.0.0+checkout"
    assert _installed_version() == expected
    # a dist-info earlier on sys.path wins, as with importlib.metadata
    (tmp_path / "nftrec-9.1.dist-info").mkdir()
    (tmp_path / "nftrec-9.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: nftrec\nVersion: 9.1\n\nVersion: 0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    assert _installed_version() == "9.1" == importlib.metadata.version("nftrec")


def test_read_frozen_pauses_the_gc_and_freezes_what_the_read_left():
    """engine.entry.read_frozen (cli.py's plain apply): no collection during the read, none
    that rescans its objects after it, and the GC as it was before."""
    import gc

    from reconciler.engine import read_frozen

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with read_frozen():
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(kept)
        assert not any(gc.is_tracked(x) and any(x is y for y in gc.get_objects(0)) for x in kept[:3])
        gc.disable()
        with read_frozen():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()
        gc.unfreeze()  # the rest of this test process collects as usual
