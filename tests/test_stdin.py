"""`-` reads manifests from standard input (`helm template ... | nftrec validate -`), as
kubectl and kubeconform do; positions are `<stdin>:line:col`. Real subprocesses with
input, as a pipe gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "edge-small"
CONFIG = ROOT / "examples" / "edge-small.config.yaml"


def nftrec(*args: str, input: str | bytes) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "reconciler.cli", *args], input=input, capture_output=True,
                          timeout=120, env=env, text=not isinstance(input, bytes))


BAD = """\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  ports:
    - port: 70000
---
apiVersion: v1
kind: Service
metadata:
  name: api
spec:
  clusterIP: 010.96.0.11
  ports:
    - port: 443
"""


def test_validate_stdin_valid():
    text = (EXAMPLE / "services.yaml").read_text()
    r = nftrec("validate", "-", input=text)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "<stdin>: 8 objects, 0 errors, 0 warnings\n"


def test_validate_stdin_reports_every_problem_at_stdin_line_col():
    r = nftrec("validate", "-", input=BAD)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith("<stdin>:7:13: Service default/web: spec.ports[0].port: 70000 is out of range")
    assert lines[1].startswith("<stdin>:14:14: Service default/api: spec.clusterIP: '010.96.0.11'")
    assert lines[2] == "<stdin>: 2 objects, 2 errors, 0 warnings"
    js = nftrec("validate", "-", "-o", "json", input=BAD)
    doc = json.loads(js.stdout)
    assert [(p["file"], p["line"]) for p in doc["problems"]] == [("<stdin>", 7), ("<stdin>", 14)]


def test_validate_stdin_syntax_error_and_binary_are_positioned():
    r = nftrec("validate", "-", input="apiVersion: v1\nkind: Service\n\tbad: tab\n")
    assert r.returncode == 1
    assert r.stdout.startswith("<stdin>:3:1: YAML does not allow tabs")
    r = nftrec("validate", "-", input=b"apiVersion: v1\x00\n")
    assert r.returncode == 1
    assert r.stdout.decode().startswith("<stdin>: this file contains NUL bytes")


def test_render_stdin_equals_render_of_the_same_files(tmp_path):
    parts = [(EXAMPLE / n).read_text() for n in ("services.yaml", "endpointslices.yaml")]
    (tmp_path / "all.yaml").write_text("\n---\n".join(parts))
    from_dir = nftrec("render", str(tmp_path), "--config", str(CONFIG), input="")
    assert from_dir.returncode == 0, from_dir.stderr
    piped = nftrec("render", "-", "--config", str(CONFIG), input="\n---\n".join(parts))
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == from_dir.stdout
    assert "10.244.0.11" in piped.stdout


def test_render_stdin_json_document():
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "j"},
           "spec": {"clusterIP": "10.96.0.77", "ports": [{"port": 80}]}}
    r = nftrec("render", "-", "--config", str(CONFIG), input=json.dumps(svc, indent=1))
    assert r.returncode == 0, r.stderr
    assert "10.96.0.77" in r.stdout
    bad = nftrec("render", "-", "--config", str(CONFIG), input='{\n "apiVersion": "v1",\n "kind": "Service",\n'
                 ' "metadata": {"name": "j"},\n "spec": {"ports": [{"port": -1}]}\n}\n')
    assert bad.returncode == 1
    assert "<stdin>:5:" in bad.stderr
    assert "Run `nftrec validate -` with the same input" in bad.stderr  # stdin is not there to read again


def test_watch_refuses_stdin_as_usage_error():
    r = nftrec("watch", "-", "--metrics-address", "", input="")
    assert r.returncode == 64
    assert "standard input" in r.stderr
