"""Health checks for a confirmed apply: `apply --health-cmd/--health-url/
--health-tcp` and the node config's `healthChecks`, parsed into `model.HealthCheck`.

Commands come from the operator (the command line, or the node config, which is
root's file on the node), never from manifests: manifests come from a repository and
may not run anything on the node (see docs/probes.md for the same rule on probes).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from reconciler.intake.model import HealthCheck

KINDS = ("cmd", "url", "tcp")
MAX_LEN = 4096


def split_host_port(text: str) -> tuple[str, int]:
    """`10.0.0.1:80`, `[fd00::1]:80`, `web.local:80` -> (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 172.30.0.10:80 or [fd00::10]:80, port 1-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, [{host}]:{port}")
    return host, int(port)


def parse_health_check(kind: str, value: object) -> HealthCheck:
    """One check; ValueError with a sentence that says what to write instead."""
    if kind not in KINDS:
        raise ValueError(f"unknown health check kind {kind!r}; use one of {', '.join(KINDS)}")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"a {kind} health check needs a non-empty string")
    if len(value) > MAX_LEN or any(ord(c) < 32 and c != "\t" for c in value):
        raise ValueError(f"a {kind} health check must be one line of at most {MAX_LEN} characters")
    if kind == "url":
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"{value!r} has a bad port") from None
    elif kind == "tcp":
        split_host_port(value)
    return HealthCheck(kind, value)
