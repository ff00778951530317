"""A real OCI registry on loopback for tests, and a pusher of Flux-format artifacts.

`registry` (plain HTTP) and `tls_registry` (a test CA's certificate plus htpasswd basic
auth) run Debian's docker-registry (distribution) on 127.0.0.1 and a free port, storage
in tmp_path, always killed afterwards. `push_artifact` builds exactly what `flux push
artifact` pushes; `push_blob`/`push_manifest` push anything else (hostile tarballs, lying
manifests). Imported by tests as `from ociregistry import ...`.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import pytest

REGISTRY_BIN = "/usr/bin/docker-registry"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
FLUX_CONFIG = "application/vnd.cncf.flux.config.v1+json"
FLUX_LAYER = "application/vnd.cncf.flux.content.v1.tar+gzip"
USER, PASSWORD = "nftrec", "s3cret-pw"
LOCK = ".lock"  # a store's lock file (intake.oci.LOCK): what a refused pull leaves


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Registry:
    """One running docker-registry: `host` ("127.0.0.1:PORT"), `http` (the push helpers'
    keyword options for it), its storage and log; stop() and start() for outages."""

    tmp: Path
    port: int
    tls: bool = False
    ca_file: str = ""
    username: str = ""
    password: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}"

    @property
    def storage(self) -> Path:
        return self.tmp / "storage"

    @property
    def log(self) -> Path:
        return self.tmp / "registry.log"

    @property
    def http(self) -> dict:
        return {"scheme": self.scheme, "ca_file": self.ca_file or None,
                "auth": (self.username, self.password) if self.username else None}

    def ref(self, repo: str, tag: str | None = None, digest: str | None = None) -> str:
        return f"oci://{self.host}/{repo}" + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")

    def credentials_file(self, path: Path, password: str | None = None, *, key: str | None = None) -> Path:
        """A docker config.json with this registry's credentials (another password: a wrong one)."""
        auth = base64.b64encode(f"{self.username}:{self.password if password is None else password}".encode()).decode()
        path.write_text(json.dumps({"auths": {key or self.host: {"auth": auth}}}))
        return path

    def start(self) -> None:
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(self.tmp / "config.yml")], stdin=subprocess.DEVNULL,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if _answers(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer on {self.host} in 30 s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def requests(self, method: str = "", path: str = "") -> list[str]:
        """The access log's request lines (`METHOD /v2/... HTTP/1.1`), filtered."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            start = line.find('"')
            if start < 0 or " HTTP/" not in line[start:]:
                continue
            req = line[start + 1:line.index('"', start + 1)]
            if req.startswith(method) and path in req:
                out.append(req)
        return out

    def blob_file(self, digest: str) -> Path:
        hex_ = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hex_[:2] / hex_ / "data"

    def corrupt_blob(self, digest: str, offset: int = -1) -> None:
        """Flip one byte of a stored blob (its length kept): the registry serves the bytes
        under the old digest, as a broken disk or a hostile mirror would."""
        path = self.blob_file(digest)
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x01
        path.write_bytes(bytes(data))

    def replace_blob(self, digest: str, data: bytes) -> None:
        """Store other bytes under `digest` (same length: the registry's size stays right)."""
        path = self.blob_file(digest)
        assert len(data) == path.stat().st_size, "replace_blob keeps the length"
        path.write_bytes(data)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    """Whether something answers HTTP (or a TLS handshake) on /v2/ at 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return bool(s.recv(16))
    except OSError:
        return False


def _config(reg: Registry, tls: dict | None, htpasswd: Path | None) -> str:
    http = {"addr": reg.host, "secret": "nftrec-test-secret", "headers": {"X-Content-Type-Options": ["nosniff"]}}
    if tls:
        http["tls"] = tls
    doc = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        # no blob descriptor cache: a test that alters a stored blob is served what is on disk
        "storage": {"filesystem": {"rootdirectory": str(reg.storage)}, "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": http,
    }
    if htpasswd:
        doc["auth"] = {"htpasswd": {"realm": "nftrec-test", "path": str(htpasswd)}}
    return json.dumps(doc)  # JSON is YAML


def _need_registry() -> None:
    if not os.access(REGISTRY_BIN, os.X_OK):
        pytest.skip(f"{REGISTRY_BIN} is missing: apt-get install docker-registry (scripts/setup does)")


def start_registry(tmp: Path, *, tls: bool = False) -> Registry:
    """Start a docker-registry (stop() it when done); the fixtures below and bench/oci_watch.py use it."""
    _need_registry()
    tmp.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):  # a free port may be taken between the probe and the bind
        reg = Registry(tmp, _free_port(), tls=tls)
        tls_conf = htpasswd = None
        if tls:
            ca, cert, key = make_certificates(tmp)
            reg.ca_file, reg.username, reg.password = str(ca), USER, PASSWORD
            tls_conf = {"certificate": str(cert), "key": str(key)}
            htpasswd = tmp / "htpasswd"
            htpasswd.write_text(htpasswd_line(USER, PASSWORD))
        (tmp / "config.yml").write_text(_config(reg, tls_conf, htpasswd))
        try:
            reg.start()
            return reg
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running_registry(tmp: Path, *, tls: bool = False):
    """start_registry(), stopped when the `with` ends, whatever happened."""
    reg = start_registry(tmp, tls=tls)
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture
def registry(tmp_path):
    """docker-registry over plain HTTP on 127.0.0.1 (clients need oci.insecure)."""
    with running_registry(tmp_path / "registry") as reg:
        yield reg


@pytest.fixture
def tls_registry(tmp_path):
    """docker-registry with TLS (a test CA: reg.ca_file) and basic auth (reg.username, reg.password)."""
    with running_registry(tmp_path / "tls-registry", tls=True) as reg:
        yield reg


def htpasswd_line(user: str, password: str) -> str:
    import bcrypt  # the registry accepts only bcrypt hashes

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1 and localhost, server key), PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nftrec test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


# --- pushing -----------------------------------------------------------------------------------


def _client(scheme: str = "http", ca_file: str | None = None, auth: tuple[str, str] | None = None):
    import ssl

    import httpx

    return httpx.Client(verify=ssl.create_default_context(cafile=ca_file) if ca_file else True, auth=auth, timeout=60.0, trust_env=False), scheme


def push_blob(host: str, repo: str, data: bytes | Path, **http) -> str:
    """Upload a blob (bytes, or a file streamed from disk) in one PUT; returns its digest."""
    if isinstance(data, Path):
        h = hashlib.sha256()
        with open(data, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest, size = "sha256:" + h.hexdigest(), data.stat().st_size
    else:
        digest, size = sha256(data), len(data)
    client, scheme = _client(**http)
    with client:
        base = f"{scheme}://{host}"
        r = client.post(f"{base}/v2/{repo}/blobs/uploads/")
        assert r.status_code == 202, (r.status_code, r.text)
        location = urljoin(base + "/", r.headers["Location"])
        sep = "&" if "?" in location else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(data, Path):
            with open(data, "rb") as f:
                r = client.put(f"{location}{sep}digest={digest}", content=iter(lambda: f.read(1 << 20), b""), headers=headers)
        else:
            r = client.put(f"{location}{sep}digest={digest}", content=data, headers=headers)
        assert r.status_code == 201, (r.status_code, r.text)
    return digest


def push_manifest(host: str, repo: str, reference: str, manifest: bytes | dict, media_type: str = OCI_MANIFEST, **http) -> str:
    """PUT a manifest under a tag or digest; returns the digest of its bytes."""
    raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    client, scheme = _client(**http)
    with client:
        r = client.put(f"{scheme}://{host}/v2/{repo}/manifests/{reference}", content=raw,
                       headers={"Content-Type": media_type})
        assert r.status_code == 201, (r.status_code, r.text)
    return sha256(raw)


def tar_gz(files: dict[str, bytes]) -> bytes:
    """A gzipped tarball as Flux builds it: relative paths, parent directories first."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        dirs = sorted({str(Path(p).parents[i]) for p in files for i in range(len(Path(p).parents) - 1)})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_gz_members(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A gzipped tarball of arbitrary (hostile) members, in order."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def flux_manifest(layer_digest: str, layer_size: int, *, revision: str = "", source: str = "", created: str = "",
                  layer_media_type: str = FLUX_LAYER, config_media_type: str = FLUX_CONFIG,
                  extra_layers: tuple[dict, ...] = (), annotations: dict | None = None) -> dict:
    """The manifest `flux push artifact` writes (annotations only when given)."""
    ann = {"org.opencontainers.image.created": created, "org.opencontainers.image.revision": revision,
           "org.opencontainers.image.source": source}
    ann = {k: v for k, v in ann.items() if v}
    ann.update(annotations or {})
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": config_media_type, "digest": sha256(b"{}"), "size": 2},
        "layers": [{"mediaType": layer_media_type, "digest": layer_digest, "size": layer_size}, *extra_layers],
    }
    if ann:
        doc["annotations"] = ann
    return doc


def push_artifact(host: str, repo: str, tag: str, files: dict[str, bytes] | None = None, *,
                  revision: str = "main@sha1:0123456789abcdef0123456789abcdef01234567",
                  source: str = "https://git.example/manifests.git", created: str = "2026-01-01T00:00:00Z",
                  layer: bytes | Path | None = None, layer_digest: str | None = None, layer_size: int | None = None,
                  **options) -> str:
    """Push a Flux-format artifact of `files` (or of the tarball `layer`, bytes or a file:
    anything, hostile included) under `tag`; returns the manifest's digest. `layer_digest`
    / `layer_size` make the manifest lie about its layer. Other keyword options go to
    flux_manifest (media types, extra layers, annotations) or are the http options."""
    http = {k: options.pop(k) for k in ("scheme", "ca_file", "auth") if k in options}
    push_blob(host, repo, b"{}", **http)
    data = tar_gz(files or {}) if layer is None else layer
    digest = push_blob(host, repo, data, **http)
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    manifest = flux_manifest(layer_digest or digest, size if layer_size is None else layer_size,
                             revision=revision, source=source, created=created, **options)
    return push_manifest(host, repo, tag, manifest, **http)


# --- asserting that nothing was left -----------------------------------------------------------


def listing(root: Path, *skip: Path) -> set[str]:
    """Every path under root (links not followed), except the trees `skip`."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        out.update(str((d / n).relative_to(root)) for n in dirnames + filenames)
    return out


def assert_refused(reason: str, ref, settings, state: Path, tmp_path: Path, *, skip: Path, says: str = ""):
    """oci.pull() fails with `reason` and nothing is left: the store holds nothing but its
    lock file, nothing else under tmp_path changed (the registry's own tree `skip` aside).
    Returns the error."""
    from reconciler.intake.oci import SourceError, pull, store_for

    before = listing(tmp_path, skip)
    store = store_for(state, ref)
    with pytest.raises(SourceError) as e:
        pull(ref, settings, store)
    assert e.value.reason == reason, e.value.message
    assert says in e.value.message
    after = listing(tmp_path, skip)
    assert after - before <= {str(p.relative_to(tmp_path)) for p in (store, *store.parents, store / LOCK)
                              if tmp_path in p.parents}
    assert not store.exists() or [p.name for p in store.iterdir()] == [LOCK]
    return e.value


def gzip_bomb(path: Path, size: int, name: str = "bomb.yaml") -> Path:
    """A .tar.gz of one file of `size` zero bytes, written by streaming (never held in memory)."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644
        gz.write(info.tobuf(format=tarfile.GNU_FORMAT))
        zeros = bytes(1 << 20)
        left = size
        while left:
            n = min(left, len(zeros))
            gz.write(zeros[:n])
            left -= n
        gz.write(bytes((-size) % 512))  # pad the member to a block
        gz.write(bytes(1024))  # end of archive
    return path
