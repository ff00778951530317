"""Load + validate + model time for 10,000 documents (5,000 Services + 5,000
EndpointSlices in 100 files). A script, not a test: `python bench/bench_load.py [N]`."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.intake.build import build_inventory  # noqa: E402
from reconciler.intake.inventory import load_manifests  # noqa: E402
from reconciler.intake.parse import FAST  # noqa: E402
from reconciler.intake.validate import check  # noqa: E402

SVC = """\
apiVersion: v1
kind: Service
metadata:
  name: svc-{i}
  namespace: ns-{ns}
  labels: {{app: svc-{i}, tier: backend}}
spec:
  type: {type}
  clusterIP: 10.{a}.{b}.{c}
  selector: {{app: svc-{i}}}
  ports:
    - name: http
      protocol: TCP
      port: 80
      targetPort: 8080{np}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-{i}-abcde
  namespace: ns-{ns}
  labels:
    kubernetes.io/service-name: svc-{i}
addressType: IPv4
ports:
  - name: http
    protocol: TCP
    port: 8080
endpoints:
"""
EP = """\
  - addresses: [10.244.{x}.{y}]
    conditions: {{ready: true, serving: true, terminating: false}}
    nodeName: node-{n}
"""


def generate(root: Path, services: int, files: int = 100) -> None:
    per = services // files
    for f in range(files):
        chunks = []
        for i in range(f * per, (f + 1) * per):
            np = f"\n      nodePort: {30000 + i}" if i % 10 == 0 else ""
            text = SVC.format(i=i, ns=i % 20, type="NodePort" if np else "ClusterIP", a=96 + i // 65000,
                              b=(i // 250) % 256, c=i % 250 + 1, np=np)
            text += "".join(EP.format(x=(i * 5 + e) // 250 % 256, y=(i * 5 + e) % 250 + 1, n=e) for e in range(5))
            chunks.append(text)
        (root / f"part-{f:03d}.yaml").write_text("---\n".join(chunks))


def main() -> None:
    services = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        generate(root, services)
        t0 = time.perf_counter()
        loaded = load_manifests(root)
        t1 = time.perf_counter()
        checked = check(loaded)
        t2 = time.perf_counter()
        inv = build_inventory(checked.objects, loaded.revision)
        t3 = time.perf_counter()
    assert checked.ok, checked.problems[:5]
    print(f"libyaml C loader: {FAST}")
    print(f"documents: {len(loaded.documents)} in {loaded.files} files "
          f"-> {len(inv.services)} services, {len(inv.endpoint_slices)} slices")
    print(f"load      {t1 - t0:7.3f} s")
    print(f"validate  {t2 - t1:7.3f} s")
    print(f"model     {t3 - t2:7.3f} s")
    print(f"total     {t3 - t0:7.3f} s")


if __name__ == "__main__":
    main()
