"""`nftrec watch` as a subprocess for tests: its JSON log lines collected by a thread,
bounded polls over them, metrics over HTTP, a clean stop. The one helper every test of
the daemon uses (tests/test_watch.py, tests/dataplane/*)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

NFTREC = str(Path(sys.executable).with_name("nftrec"))


class Watch:
    """`nftrec --log-format json watch MANIFESTS --config CONFIG --netns NS`.

    `metrics=True` serves metrics on a free port (read from the log: `self.port`);
    `extra` are more watch options (e.g. "--debounce", "0.05")."""

    def __init__(self, ns: str, manifests: Path, config: Path, state: Path, *extra: str, metrics: bool = True):
        self.ns, self.manifests, self.config, self.state = ns, manifests, config, state
        cmd = [NFTREC, "--state-dir", str(state), "--log-format", "json", "watch", str(manifests),
               "--config", str(config), "--netns", ns, "--metrics-address", "127.0.0.1:0" if metrics else "",
               *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict] = []
        self.raw: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self.port = None
        if metrics:
            self.port = self.wait(lambda: self.find("metrics"), what="the metrics line")["metricsPort"]

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.raw.append(line)
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"msg": line})

    def find(self, event: str, since: int = 0) -> dict | None:
        return next((x for x in self.lines[since:] if x.get("event") == event), None)

    def events(self, event: str, since: int = 0) -> list[dict]:
        return [x for x in self.lines[since:] if x.get("event") == event]

    def syncs(self, kind: str | None = None) -> list[dict]:
        return [x for x in self.events("sync") if x.get("ok", True) and (kind is None or x.get("kind") == kind)]

    def wait(self, pred, timeout: float = 15, what: str = "a condition", step: float = 0.02):
        """pred()'s first truthy value, polled every `step`; fails if watch exits or on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = pred()
            if v:
                return v
            if self.proc.poll() is not None:
                time.sleep(0.1)
                raise AssertionError(f"nftrec watch exited {self.proc.returncode} while waiting for {what}:\n"
                                     + "".join(self.raw))
            time.sleep(step)
        raise AssertionError(f"timed out waiting for {what}; log:\n" + "".join(self.raw))

    def wait_event(self, event: str, since: int = 0, timeout: float = 20, **match) -> dict:
        """The first successful (no `ok: false`) log line of `event` after line `since`."""
        def hit():
            return next((x for x in self.events(event, since)
                         if x.get("ok", True) and all(x.get(k) == v for k, v in match.items())), None)
        return self.wait(hit, timeout, what=f"{event} {match or ''}")

    def wait_sync(self, since: int, **match) -> dict:
        return self.wait_event("sync", since, timeout=15, **match)

    def status(self, until=lambda st: True, timeout: float = 15) -> dict:
        """`nftrec status -o json`, polled until `until(status)` holds: the daemon records a
        revision on its state-writer thread after the sync line (daemon/statewriter.py)."""
        def read():
            p = subprocess.run([NFTREC, "--state-dir", str(self.state), "status", "-o", "json", "--netns", self.ns,
                                "--config", str(self.config)], capture_output=True, text=True, timeout=60)
            # exit 1 with a document: the newest revision was not applied (an error has none)
            st = json.loads(p.stdout) if p.returncode in (0, 1) and p.stdout.strip() else None
            return st if st is not None and until(st) else None
        return self.wait(read, timeout, what="the state recorded", step=0.1)

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        """SIGTERM, then the exit code; a traceback anywhere in the log fails the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        rc = self.proc.wait(timeout=5)
        self._t.join(5)
        assert not any("Traceback" in line for line in self.raw), "".join(self.raw)
        return rc
