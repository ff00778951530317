"""A small fleet root for the rollout tests (tests/test_hold.py, tests/test_rollout_watch.py):
fleet.yaml with a canary wave by label and the rest by percent, one Service in base/
whose endpoint address a test moves to make a new revision, and a node config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NFTREC = str(Path(sys.executable).with_name("nftrec"))

FLEET = """apiVersion: nftrec/v1alpha1
kind: Fleet
layers:
- path: base
rollout:
  salt: "t"
  interval: {interval}
  waves:
  - {{name: canary, selector: {{matchLabels: {{ring: canary}}}}}}
  - {{name: rest, percent: 100}}
"""

SERVICE = """apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {{name: http, port: 80, targetPort: 8080}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web
  namespace: default
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports:
- {{name: http, port: 8080}}
endpoints:
- addresses: [{address}]
"""


def make_fleet(root: Path, interval: str = "1h", address: str = "10.244.0.1", plain: bool = False) -> Path:
    """The fleet root (or, `plain`, the same Service in a directory without fleet.yaml)."""
    (root / "base").mkdir(parents=True, exist_ok=True)
    if not plain:
        (root / "fleet.yaml").write_text(FLEET.format(interval=interval))
    set_endpoint(root, address)
    return root


def set_endpoint(root: Path, address: str) -> None:
    """A new revision: the Service's endpoint moves to `address` (written whole, then renamed)."""
    tmp = root / "base" / ".web.yaml.tmp"
    tmp.write_text(SERVICE.format(address=address))
    tmp.rename(root / "base" / "web.yaml")


def node_config(path: Path, name: str, labels: str = "{}") -> Path:
    path.write_text(f"apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: {name}\nnodeLabels: {labels}\n"
                    "nodeIPs: [192.168.1.2]\nclusterCIDRs: [10.244.0.0/16]\nserviceCIDRs: [10.96.0.0/16]\n"
                    "minSyncPeriod: 0.1s\n")
    return path


def nftrec(state: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([NFTREC, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def status(state: Path, ns: str, config: Path) -> dict:
    p = nftrec(state, "status", "-o", "json", "--netns", ns, "--config", str(config))
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)
