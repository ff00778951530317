"""Shell completion (typer's): the scripts, the completion protocol they call back, and
that enabling it left usage errors at exit 64."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NFTREC = Path(sys.executable).parent / "nftrec"  # the console script: completion keys on its name


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    if not NFTREC.exists():
        pytest.skip("the nftrec console script is not installed next to this Python")
    return subprocess.run([str(NFTREC), *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))


def test_show_completion_bash_prints_the_bash_script():
    r = run("--show-completion", "bash")
    assert r.returncode == 0, r.stderr
    assert "_NFTREC_COMPLETE=complete_bash" in r.stdout
    assert "complete -o default -F _nftrec_completion nftrec" in r.stdout


@pytest.mark.parametrize("shell,marker", [("zsh", "#compdef nftrec"), ("fish", "complete --command nftrec")])
def test_a_named_shell_is_honoured_whatever_shell_runs_the_command(shell, marker):
    r = run("--show-completion", shell)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(marker) or marker in r.stdout.splitlines()[0]
    assert r.stdout == run(f"--show-completion={shell}").stdout


def test_install_completion_bash_writes_the_script_and_sources_it(tmp_path):
    r = run("--install-completion", "bash", env={"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    script = tmp_path / ".bash_completions" / "nftrec.sh"
    assert "_nftrec_completion" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()


def test_the_scripts_callback_completes_commands_and_options():
    words = run(env={"_NFTREC_COMPLETE": "complete_bash", "COMP_WORDS": "nftrec d", "COMP_CWORD": "1"})
    assert words.stdout.split() == ["diff", "doctor"]
    opts = run(env={"_NFTREC_COMPLETE": "complete_bash", "COMP_WORDS": "nftrec diff --det", "COMP_CWORD": "2"})
    assert opts.stdout.split() == ["--detailed-exitcode"]


@pytest.mark.parametrize("args", [["plan", "--bogus"], ["--no-such-global"], ["no-such-command"],
                                  ["diff", "only-old"]])
def test_usage_errors_still_exit_64(args):
    r = run(*args)
    assert r.returncode == 64, (r.stdout, r.stderr)
