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
