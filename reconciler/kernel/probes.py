"""Readiness probes on the wire: tcpSocket, httpGet (HTTP/HTTPS) and grpc, as the kubelet
runs them, from inside the node's network namespace. `ProbeLoop` is one thread in the
namespace running one asyncio loop, so every probe socket lives there. Addresses are IP
literals: asyncio would resolve names on an executor thread, outside the namespace.
"""

# The kubelet's semantics per handler:
# - tcpSocket: the connection is established within timeoutSeconds, then closed;
# - httpGet: `GET path` with User-Agent kube-probe, Accept */* and the httpHeaders; 200-399
#   within timeoutSeconds succeeds (a 3xx is not followed and counts as success); HTTPS
#   skips certificate verification;
# - grpc: grpc.health.v1.Health/Check over cleartext HTTP/2 (h2c, prior knowledge); SERVING
#   succeeds. Raw HTTP/2 frames, because grpcio's I/O threads would be outside the namespace.

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import threading
from typing import Callable, Iterable

from reconciler.compat import within
from reconciler.compile import ProbeTarget
from reconciler.kernel.netns import enter_netns

USER_AGENT = "kube-probe/1.35"
MAX_RESPONSE_HEAD = 8192  # the status line must come within this many bytes


class ProbeFailed(Exception):
    """One probe's failure, its message as `nftrec status` shows it."""


def _sockaddr(address: str, port: int) -> tuple[int, tuple]:
    if ":" in address:
        return socket.AF_INET6, (address, port, 0, 0)
    return socket.AF_INET, (address, port)


async def _connect(address: str, port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    fam, addr = _sockaddr(address, port)
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        await loop.sock_connect(s, addr)
    except OSError as e:
        s.close()
        why = os.strerror(e.errno).lower() if e.errno else str(e)
        raise ProbeFailed(f"dial tcp {_hostport(address, port)}: connect: {why}") from None
    except BaseException:
        s.close()
        raise
    return s


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


async def _tcp(t: ProbeTarget) -> None:
    s = await _connect(t.address, t.port)
    s.close()


def _request(t: ProbeTarget) -> bytes:
    p = t.probe
    headers = {"Host": _hostport(t.address, t.port), "User-Agent": USER_AGENT, "Accept": "*/*"}
    for name, value in p.headers:  # the probe's headers replace the defaults, as the kubelet's do
        for k in [k for k in headers if k.lower() == name.lower()]:
            del headers[k]
    lines = [f"GET {p.path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()] + \
        [f"{k}: {v}" for k, v in p.headers] + ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _status(head: bytes) -> int:
    line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProbeFailed(f"not an HTTP response: {line[:60]!r}")
    return int(parts[1])


async def _http(t: ProbeTarget) -> None:
    s = await _connect(t.address, t.port)
    try:
        if t.probe.scheme == "HTTPS":
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates
            try:
                reader, writer = await asyncio.open_connection(sock=s, ssl=ctx, server_hostname="")
            except (OSError, ssl.SSLError) as e:
                raise ProbeFailed(f"TLS handshake with {_hostport(t.address, t.port)}: {e}") from None
            try:
                writer.write(_request(t))
                head = b""
                while b"\r\n" not in head and len(head) < MAX_RESPONSE_HEAD:
                    chunk = await reader.read(4096)
                    if not chunk:
                        break
                    head += chunk
            finally:
                writer.transport.abort()
        else:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(s, _request(t))
            head = b""
            while b"\r\n" not in head and len(head) < MAX_RESPONSE_HEAD:
                try:
                    chunk = await loop.sock_recv(s, 4096)
                except OSError as e:
                    raise ProbeFailed(f"reading the response: {e.strerror or e}") from None
                if not chunk:
                    break
                head += chunk
    finally:
        s.close()
    if not head:
        raise ProbeFailed("the connection closed before an HTTP response")
    code = _status(head)
    if not 200 <= code < 400:
        raise ProbeFailed(f"HTTP probe failed with statuscode: {code}")


# --- gRPC health checking over h2c -----------------------------------------------------------

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
GRPC_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    return bytes((first | limit,)) + _varint(value - limit)  # the rest: 7-bit groups, as protobuf's varint


def _hpack_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _hpack_int(len(raw), 7) + raw  # no Huffman coding


def _literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name (RFC 7541, section 6.2.2)."""
    return b"\x00" + _hpack_str(name) + _hpack_str(value)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _health_request(service: str) -> bytes:
    raw = service.encode("utf-8")
    msg = (b"\x0a" + _varint(len(raw)) + raw) if raw else b""  # HealthCheckRequest{service = 1}
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def _health_status(message: bytes) -> int:
    """HealthCheckResponse.status (field 1, varint) of one protobuf message; 0 if absent."""
    i, status = 0, 0
    while i < len(message):
        key, i = _read_varint(message, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(message, i)
            if field == 1:
                status = value
        elif wire == 2:
            n, i = _read_varint(message, i)
            i += n
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise ProbeFailed("the HealthCheckResponse is not valid protobuf")
    return status


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ProbeFailed("the HealthCheckResponse is not valid protobuf")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


async def _grpc(t: ProbeTarget) -> None:
    loop = asyncio.get_running_loop()
    s = await _connect(t.address, t.port)
    try:
        block = (b"\x83\x86"  # :method POST, :scheme http (static table 3, 6)
                 + _hpack_int(4, 4) + _hpack_str("/grpc.health.v1.Health/Check")  # :path, indexed name
                 + _hpack_int(1, 4) + _hpack_str(_hostport(t.address, t.port))  # :authority
                 + _literal("content-type", "application/grpc") + _literal("te", "trailers")
                 + _literal("user-agent", USER_AGENT))
        await loop.sock_sendall(s, _PREFACE + _frame(_SETTINGS, 0, 0)
                                + _frame(_HEADERS, _END_HEADERS, 1, block)
                                + _frame(_DATA, _END_STREAM, 1, _health_request(t.probe.grpc_service)))
        buf, data = b"", b""

        async def need(n: int) -> None:
            nonlocal buf
            while len(buf) < n:
                try:
                    chunk = await loop.sock_recv(s, 65536)
                except OSError as e:
                    raise ProbeFailed(f"gRPC: reading the response: {e.strerror or e}") from None
                if not chunk:
                    raise ProbeFailed("gRPC: the connection closed before a HealthCheckResponse "
                                      "(is this an HTTP/2 cleartext gRPC port?)")
                buf += chunk
                if len(buf) > 1 << 20:
                    raise ProbeFailed("gRPC: response too large")

        while True:
            await need(9)
            length = int.from_bytes(buf[:3], "big")
            ftype, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            await need(9 + length)
            payload, buf = buf[9:9 + length], buf[9 + length:]
            if ftype == _SETTINGS and not flags & _ACK:
                await loop.sock_sendall(s, _frame(_SETTINGS, _ACK, 0))
            elif ftype == _PING and not flags & _ACK:
                await loop.sock_sendall(s, _frame(_PING, _ACK, 0, payload))
            elif ftype == _GOAWAY:
                code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else -1
                raise ProbeFailed(f"gRPC: the server closed the connection (GOAWAY, error code {code})")
            elif ftype == _RST and stream == 1:
                code = int.from_bytes(payload[:4], "big") if len(payload) >= 4 else -1
                raise ProbeFailed(f"gRPC: the server reset the health check (error code {code})")
            elif ftype == _DATA and stream == 1:
                if flags & _PADDED and payload:
                    payload = payload[1:len(payload) - payload[0]]
                data += payload
                if len(data) >= 5:
                    n = int.from_bytes(data[1:5], "big")
                    if len(data) >= 5 + n:
                        status = _health_status(data[5:5 + n])
                        if status == 1:
                            return
                        raise ProbeFailed(f"gRPC: service unhealthy (responded with "
                                          f"{GRPC_STATUS.get(status, status)})")
            if stream == 1 and ftype in (_DATA, _HEADERS) and flags & _END_STREAM:
                raise ProbeFailed("gRPC: the server answered without a HealthCheckResponse (a grpc-status "
                                  "error: is grpc.health.v1.Health served, and the service name known?)")
    finally:
        s.close()


_HANDLERS = {"tcpSocket": _tcp, "httpGet": _http, "grpc": _grpc}


async def check(t: ProbeTarget) -> str | None:
    """Run one probe; None on success, else the failure as one line."""
    if t.error:
        return t.error
    try:
        await within(t.probe.timeout_seconds, _HANDLERS[t.probe.handler](t))
    except (asyncio.TimeoutError, TimeoutError):  # one class from Python 3.11; a socket's own timeout too
        return f"{t.probe.handler} probe of {_hostport(t.address, t.port)} timed out after {t.probe.timeout_seconds}s"
    except ProbeFailed as e:
        return str(e)
    except OSError as e:  # anything the handlers did not word themselves
        return f"{t.probe.handler} probe of {_hostport(t.address, t.port)}: {e.strerror or e}"
    return None


# --- the thread ---------------------------------------------------------------------------


def raise_fd_limit(want: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards `want` (up to the hard limit); the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class ProbeLoop:
    """One thread in `netns` (None: this process' namespace) running an asyncio loop."""

    def __init__(self, netns: str | None):
        self.loop = asyncio.new_event_loop()
        ready: list = []
        started = threading.Event()

        def main() -> None:
            try:
                if netns is not None:
                    enter_netns(netns)
            except BaseException as e:
                ready.append(e)
                started.set()
                return
            asyncio.set_event_loop(self.loop)
            started.set()
            self.loop.run_forever()
            self.loop.run_until_complete(self._cancel_all())
            self.loop.close()

        self._thread = threading.Thread(target=main, name=f"probes-{netns or 'host'}", daemon=True)
        self._thread.start()
        started.wait()
        if ready:
            raise ready[0]

    async def _cancel_all(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def call(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def run(self, coro, timeout: float | None = None):
        """Run `coro` on the loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def probe_all(netns: str | None, targets: Iterable[ProbeTarget], concurrency: int = 256) -> dict[tuple, str | None]:
    """Probe every target once (bounded concurrency); {target.key: None or the failure}."""
    targets = list(targets)
    if not targets:
        return {}
    raise_fd_limit(4 * concurrency + 256)
    pl = ProbeLoop(netns)
    try:
        async def all_once():
            sem = asyncio.Semaphore(concurrency)

            async def one(t):
                async with sem:
                    return t.key, await check(t)

            return dict(await asyncio.gather(*(one(t) for t in targets)))

        return pl.run(all_once())
    finally:
        pl.close()
check_probe = check
