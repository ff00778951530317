"""The health checks of a confirmed apply, run in a network namespace. Commands come from
the operator (command line, node config), never from manifests.
"""

# - `cmd`: `sh -c CMD` through `ip netns exec NAME` (which also binds /etc/netns/NAME);
#   exit status 0 passes. It runs in its own process group, killed when time is up.
# - `url`: an HTTP GET from a thread in the namespace; any 2xx passes, redirects are not
#   followed, environment proxies are ignored, and an https:// certificate is not
#   verified (a check wants the data path, not the PKI, as kubelet's httpGet probes).
# - `tcp`: a TCP connect from a thread in the namespace.

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from reconciler.intake import HealthCheck, split_host_port
from reconciler.kernel.netns import NamespaceThread

OUTPUT_SHOWN = 300  # characters of a failing command's output kept in its error


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _http(url: str, timeout: float) -> str | None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect,
                                         urllib.request.HTTPSHandler(context=ctx))
    req = urllib.request.Request(url, headers={"User-Agent": "nftrec-health-check"})
    try:
        with opener.open(req, timeout=timeout) as resp:
            code = resp.status
    except urllib.error.HTTPError as e:
        code = e.code
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"GET {url}: {reason}"
    return None if 200 <= code < 300 else f"GET {url}: HTTP {code}"


def _tcp(target: str, timeout: float) -> str | None:
    host, port = split_host_port(target)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"connect {target}: {e.strerror or e}"


def _cmd(command: str, netns: str | None, timeout: float, cancelled=lambda: False) -> str | None:
    argv = ["sh", "-c", command]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns] + argv
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as e:
        return f"cannot run {argv[0]}: {e.strerror or e}"
    end = time.monotonic() + max(0.05, timeout)
    while True:
        try:  # in short steps, so that a confirmation or a signal need not wait for it
            out, _ = proc.communicate(timeout=max(0.01, min(0.2, end - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            stop = cancelled()
            if not stop and time.monotonic() < end:
                continue
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
            if stop:
                return f"`{command}` was cut short"
            return f"`{command}` did not finish within {timeout:.1f}s (killed)"
    if proc.returncode == 0:
        return None
    text = out.decode("utf-8", "replace").strip()
    if len(text) > OUTPUT_SHOWN:
        text = "..." + text[-OUTPUT_SHOWN:]
    how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
           else f"exited {proc.returncode}")
    return f"`{command}` {how}" + (f": {text}" if text else "")


class HealthChecker:
    """Runs checks in one namespace; `check(c, timeout)` is None (passed) or why it failed."""

    def __init__(self, netns: str | None):
        self.netns = netns
        self._thread: NamespaceThread | None = None

    def _in_ns(self, fn):
        if self._thread is None:
            self._thread = NamespaceThread(self.netns)
        return self._thread.call(fn)

    def check(self, c: HealthCheck, timeout: float, cancelled=lambda: False) -> str | None:
        """`cancelled()` (polled while a command runs) cuts a command short."""
        timeout = max(0.05, timeout)
        if c.kind == "cmd":
            return _cmd(c.target, self.netns, timeout, cancelled)
        if c.kind == "url":
            return self._in_ns(lambda: _http(c.target, timeout))
        if c.kind == "tcp":
            return self._in_ns(lambda: _tcp(c.target, timeout))
        raise ValueError(f"unknown health check kind {c.kind!r}")

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None
