"""kube-proxy's nftables object names, byte for byte (an operator can compare a listing
with a kube-proxy node's): `<prefix><HASH>-<ns>/<svc>/<proto>/<port>[__<ip>/<port>]`,
HASH the first 8 characters of the base32 of the sha256 of the un-prefixed, untruncated
name, which keeps names unique when the 240-character cap truncates them."""

from __future__ import annotations

import base64
import hashlib

NAME_LENGTH_MAX = 256  # knftables.NameLengthMax
COMMENT_LENGTH_MAX = 128  # knftables.CommentLengthMax
CHAIN_NAME_PREFIX_LENGTH_MAX = 16
CHAIN_NAME_BASE_LENGTH_MAX = NAME_LENGTH_MAX - CHAIN_NAME_PREFIX_LENGTH_MAX  # 240

SERVICE_PREFIX = "service-"  # cluster traffic policy chain
LOCAL_PREFIX = "local-"  # local traffic policy chain
EXTERNAL_PREFIX = "external-"
ENDPOINT_PREFIX = "endpoint-"  # only for ClientIP affinity (new layout)
AFFINITY_PREFIX = "affinity-"  # per-endpoint affinity set
FIREWALL_PREFIX = "firewall-"


def hash_and_truncate(name: str) -> str:
    """`HASH8-name`, cut to 240 characters (the last three being "...")."""
    # The first 8 base32 characters encode exactly the digest's first 5 bytes (base32
    # works in 5-byte groups), and CPython's b32encode is a Python loop over the input.
    encoded = base64.b32encode(hashlib.sha256(name.encode("utf-8")).digest()[:5]).decode("ascii")
    name = f"{encoded}-{name}"
    # Go's len() counts bytes; inputs are ASCII after validation, so bytes == chars,
    # but slice the encoded form so non-ASCII could never exceed the byte limit.
    raw = name.encode("utf-8")
    if len(raw) > CHAIN_NAME_BASE_LENGTH_MAX:
        name = raw[: CHAIN_NAME_BASE_LENGTH_MAX - 3].decode("utf-8", "ignore") + "..."
    return name


def service_port_chain_base(namespace: str, service: str, port_name: str, protocol: str) -> str:
    """`ULMVA6XW-ns1/svc1/tcp/p80`; `protocol` is lower-cased like kube-proxy does."""
    return hash_and_truncate(f"{namespace}/{service}/{protocol.lower()}/{port_name}")


def split_host_port(endpoint: str) -> tuple[str, str]:
    """`10.0.0.1:80` / `[fd00::1]:80` → (ip, port), brackets removed."""
    if endpoint.startswith("["):
        host, sep, rest = endpoint[1:].partition("]:")
        if not sep:
            raise ValueError(f"bad endpoint {endpoint!r}")
        return host, rest
    host, sep, port = endpoint.rpartition(":")
    if not sep or ":" in host:
        raise ValueError(f"bad endpoint {endpoint!r}")
    return host, port


def join_host_port(ip: str, port: int | str) -> str:
    """Go's net.JoinHostPort: IPv6 addresses are bracketed."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def endpoint_chain_base(
    namespace: str, service: str, port_name: str, protocol: str, endpoint: str
) -> str:
    """`5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80`; IPv6 colons become dots (chain
    names cannot hold ':'). `endpoint` is `ip:port` in JoinHostPort form."""
    ip, port = split_host_port(endpoint)
    ip = ip.replace(":", ".")
    return hash_and_truncate(f"{namespace}/{service}/{protocol.lower()}/{port_name}__{ip}/{port}")


def service_chain(base: str) -> str:
    return SERVICE_PREFIX + base


def local_chain(base: str) -> str:
    return LOCAL_PREFIX + base


def external_chain(base: str) -> str:
    return EXTERNAL_PREFIX + base


def firewall_chain(base: str) -> str:
    return FIREWALL_PREFIX + base


def endpoint_chain(endpoint_base: str) -> str:
    return ENDPOINT_PREFIX + endpoint_base


def affinity_set(endpoint_base: str) -> str:
    return AFFINITY_PREFIX + endpoint_base


def service_port_name(namespace: str, service: str, port_name: str) -> str:
    """ServicePortName.String(): `ns/svc:port`, or `ns/svc` for an unnamed port."""
    return f"{namespace}/{service}:{port_name}" if port_name else f"{namespace}/{service}"


def truncate_comment(comment: str) -> str:
    """Cut to 128 bytes, as kube-proxy's truncateNFTablesComment."""
    raw = comment.encode("utf-8")
    if len(raw) > COMMENT_LENGTH_MAX:
        return raw[:COMMENT_LENGTH_MAX].decode("utf-8", "ignore")
    return comment
