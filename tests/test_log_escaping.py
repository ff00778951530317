"""Diagnostics cannot forge log lines (issue 9 item 6): a file name or value with a
newline, ESC, C1 control, U+2028/2029 or a bidi override prints escaped, on its own
one line; JSON output keeps the raw value (JSON escapes it itself)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import logs
from reconciler.intake.problems import Problem

NFTREC = str(Path(sys.executable).with_name("nftrec"))
FORGED = "x\nnftrec: error: forged.yaml"  # a real, legal file name on Linux
SERVICE_ESC = """\
apiVersion: v1
kind: Service
metadata:
  name: "web\\e[31mred"
  namespace: default
  labels: {app: "b\\e]0;pwned\\a"}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"""


def nftrec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NFTREC, *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"})


@pytest.mark.parametrize("raw, shown", [
    ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\x00", "\\x00"), ("\x1b", "\\x1b"),
    ("\x7f", "\\x7f"), ("\x85", "\\x85"), ("\x9b", "\\x9b"), ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"), ("\u202e", "\\u202e"), ("\u2066", "\\u2066"), ("\u200f", "\\u200f"),
])
def test_escape_each_kind(raw, shown):
    assert logs.escape(f"a{raw}b") == f"a{shown}b"


def test_escape_keeps_printable_text_and_is_idempotent():
    text = "Service default/'web\\x1b[31m' in café/日本 \\ plain"  # already repr'd: unchanged
    assert logs.escape(text) == text
    once = logs.escape(FORGED + "\x1b[31m\u2028")
    assert "\n" not in once and "\x1b" not in once and logs.escape(once) == once


def test_escape_lines_indents_continuations():
    out = logs.escape_lines("Error: bad\nadd rule x\x1b\n    ^^^")
    assert out.splitlines() == ["Error: bad", "  add rule x\\x1b", "      ^^^"]


def test_problem_format_text_is_one_line():
    p = Problem(FORGED, 2, 1, "Service", "default/'a'", "spec", "bad\u2028value\x9b")
    text = p.format_text()
    assert text == "x\\nnftrec: error: forged.yaml:2:1: Service default/'a': spec: bad\\u2028value\\x9b"
    assert p.to_json()["file"] == FORGED  # JSON keeps the raw name


@pytest.mark.parametrize("lines, first", [
    (False, ["nftrec: warning: cannot read x\\nnftrec: error: forged.yaml\\x1b[2J"]),
    # a multi-line record (nft's error output) keeps its breaks, indented: never a record start
    (True, ["nftrec: warning: cannot read x", "  nftrec: error: forged.yaml\\x1b[2J"]),
])
def test_text_formatter_escapes_every_record(lines, first, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    logs.setup("text")
    logs.log.warning(f"cannot read {FORGED}\x1b[2J", extra={"lines": lines})
    logs.log.log(logging.ERROR, Problem(FORGED, 1, 1, "", "", "", "x").format_text(),
                 extra={"plain": True})
    out = err.getvalue().splitlines()
    assert out == first + ["x\\nnftrec: error: forged.yaml:1:1: x"]


def test_json_formatter_keeps_raw_values(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    logs.setup("json")
    try:
        logs.log.warning(f"cannot read {FORGED}")
    finally:
        logs.setup("text")
    [line] = err.getvalue().splitlines()
    assert json.loads(line)["msg"] == f"cannot read {FORGED}"


def test_validate_file_name_with_newline(tmp_path):
    """The issue's case: a file named `x<newline>nftrec: error: ...` with invalid YAML."""
    (tmp_path / FORGED).write_text("kind: [\n")
    proc = nftrec("validate", str(tmp_path))
    assert proc.returncode == 1
    out = proc.stdout.splitlines()
    assert len(out) == 2, proc.stdout  # the problem, the summary
    assert out[0].startswith(f"{tmp_path}/x\\nnftrec: error: forged.yaml:2:1: "), out
    assert "YAML syntax error" in out[0]
    assert out[1] == f"{tmp_path}: 0 objects, 1 error, 0 warnings"
    assert proc.stderr == ""
    js = json.loads(nftrec("validate", "-o", "json", str(tmp_path)).stdout)
    assert js["problems"][0]["file"] == f"{tmp_path}/{FORGED}"  # raw in JSON


def test_log_line_with_directory_name(tmp_path):
    """A log message (not a Problem) naming a user path: `render` of a directory that
    does not exist says so twice (a problem, then the summary error), each one line."""
    missing = tmp_path / FORGED
    proc = nftrec("render", str(missing))
    assert proc.returncode == 1
    err = proc.stderr.splitlines()
    assert len(err) == 2, proc.stderr
    assert err[0].startswith(f"{tmp_path}/x\\nnftrec: error: forged.yaml: "), err
    assert err[1].startswith("nftrec: error: ") and "x\\nnftrec: error: forged.yaml" in err[1], err
    assert not any(line.startswith("nftrec: error: forged") for line in err)


def test_esc_sequences_in_service_name_and_label(tmp_path):
    (tmp_path / "svc.yaml").write_text(SERVICE_ESC)
    (tmp_path / "c\x1b[31m.yaml").write_text("kind: [\n")
    proc = nftrec("validate", str(tmp_path))
    assert proc.returncode == 1
    for text in (proc.stdout, proc.stderr):
        assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert "'web\\x1b[31mred'" in proc.stdout
    assert "'b\\x1b]0;pwned\\x07'" in proc.stdout
    assert "c\\x1b[31m.yaml:2:1: " in proc.stdout
    assert len(proc.stdout.splitlines()) == 4  # name, label, YAML error, summary
