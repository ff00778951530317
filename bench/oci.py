#!/usr/bin/env python3
"""What an OCI source costs: an unchanged tag's poll (resolve: one HEAD) against a full pull.

    .venv/bin/python bench/oci.py                    # 10,000 Services x 5 endpoints
    .venv/bin/python bench/oci.py --services 1000 --reps 20
    .venv/bin/python bench/oci.py --tls              # TLS (a test CA) and basic auth

Generates the benchmark's mix (bench/mix.py), pushes it as a Flux-format artifact to a
docker-registry started on 127.0.0.1 (tests/ociregistry.py; storage in a temp dir, killed
at the end), then times, each `--reps` times (ms, median and max printed):
  * resolve() of the tag on a kept client (what `watch` does every oci.interval), and the
    requests the registry logged for it;
  * resolve() on a new client (a one-shot command: connection set-up included);
  * pull() into an empty store (manifest + layer download, digests checked, unpacked);
  * pull() of the stored digest (metadata reread, no request).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import mix  # noqa: E402
from ociregistry import push_artifact, start_registry  # noqa: E402

from reconciler.intake.model import OciSettings  # noqa: E402
from reconciler.intake.oci import close_registries, parse_reference, pull, resolve, store_for  # noqa: E402


def timed(fn, reps: int) -> tuple[list[float], object]:
    out, result = [], None
    for _ in range(reps):
        t = time.perf_counter()
        result = fn()
        out.append((time.perf_counter() - t) * 1000)
    return out, result


def show(name: str, ms: list[float]) -> None:
    print(f"{name:<40} median {statistics.median(ms):9.2f} ms   max {max(ms):9.2f} ms   (n={len(ms)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tls", action="store_true", help="the registry with TLS (a test CA) and basic auth")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nftrec-bench-oci-") as tmp:
        tmp = Path(tmp)
        mix.generate(tmp / "tree", args.services, args.endpoints)
        files = {str(p.relative_to(tmp / "tree")): p.read_bytes() for p in sorted((tmp / "tree").rglob("*")) if p.is_file()}
        reg = start_registry(tmp / "registry", tls=args.tls)
        try:
            digest = push_artifact(reg.host, "bench/manifests", "main", files, **reg.http)
            ref = parse_reference(reg.ref("bench/manifests", "main"))
            settings = (OciSettings(ca_file=reg.ca_file, credentials_file=str(reg.credentials_file(tmp / "auth.json")))
                        if args.tls else OciSettings(insecure=True))
            layer = max(p.stat().st_size for p in reg.storage.rglob("data"))
            print(f"{args.services} Services x {args.endpoints}: {len(files)} files, "
                  f"{sum(map(len, files.values())) / 1e6:.1f} MB, layer {layer / 1e6:.2f} MB gzip")
            resolve(ref, settings)  # connect once
            before = len(reg.requests())
            ms, got = timed(lambda: resolve(ref, settings), args.reps)
            assert got == digest
            logged = reg.requests()[before:]
            show("resolve, kept client (watch's poll)", ms)
            print(f"{'':<40} registry saw {len(logged)} requests for {args.reps} polls: {sorted(set(logged))}")

            def cold():
                close_registries()
                return resolve(ref, settings)
            show("resolve, new client (one-shot)", timed(cold, args.reps)[0])
            stores = iter(range(args.reps))
            show("pull into an empty store", timed(lambda: pull(ref, settings, tmp / f"s{next(stores)}", digest=digest),
                                                   args.reps)[0])
            store = store_for(tmp / "state", ref)
            pull(ref, settings, store, digest=digest)
            before = len(reg.requests())
            show("pull of the stored digest", timed(lambda: pull(ref, settings, store, digest=digest), args.reps)[0])
            print(f"{'':<40} registry saw {len(reg.requests()) - before} requests")
        finally:
            close_registries()
            reg.stop()


if __name__ == "__main__":
    main()
