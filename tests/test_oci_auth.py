"""The Bearer token flow and redirects, against a small in-test registry (docker-registry
itself does Basic auth only, and never redirects): the token fetched with the credentials
file's Basic credentials and reused, no Authorization sent to a storage host, no https ->
http downgrade, credentials never shown."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ociregistry import flux_manifest, make_certificates, sha256, tar_gz

from reconciler.intake.model import OciSettings
from reconciler.intake.oci import SourceError, close_registries, parse_reference, pull, resolve, store_for
from reconciler.intake.registry import read_credentials

FILES = {"a.yaml": b"kind: Service\n"}
LAYER = tar_gz(FILES)
MANIFEST = json.dumps(flux_manifest(sha256(LAYER), len(LAYER), revision="main@sha1:" + "c" * 40)).encode()
TOKEN = "tok-" + "z" * 40
USER, PASSWORD = "robot", "hunter2-secret"
LOCK = ".lock"  # the store's lock file (intake.oci.LOCK)


@pytest.fixture(autouse=True)
def _fresh_clients():
    yield
    close_registries()


class Fake:
    """A registry that wants a Bearer token from its /token realm, and whose blobs are
    redirected to `storage` (another server) when set."""

    def __init__(self, tls_dir=None):
        fake = self
        self.seen: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        self.storage: Fake | None = None
        self.realm_scheme = None
        self.challenge = False  # its /storage/ asks for a Bearer token from its own /token realm

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def send(self, code, body=b"", headers=None, send_body=True):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def answer(self, body):
                auth = self.headers.get("Authorization", "")
                fake.seen.append((self.command, self.path, auth))
                if self.path.startswith("/token"):
                    good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                    if auth != good or "scope=repository:m:pull" not in self.path:
                        return self.send(401, b"{}")
                    return self.send(200, json.dumps({"access_token": TOKEN}).encode(), send_body=body)
                if self.path.startswith("/storage/"):
                    if fake.challenge:
                        realm = f"http://127.0.0.1:{fake.port}/token"
                        return self.send(401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}",service="evil"'})
                    return self.send(200, LAYER, send_body=body)
                if auth != f"Bearer {TOKEN}":
                    realm = f"{fake.realm_scheme or fake.scheme}://127.0.0.1:{fake.port}/token"
                    return self.send(401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake",'
                                                                      f'scope="repository:m:pull"'})
                if self.path in ("/v2/m/manifests/v1", f"/v2/m/manifests/{sha256(MANIFEST)}"):
                    return self.send(200, MANIFEST, {"Content-Type": "application/vnd.oci.image.manifest.v1+json",
                                                     "Docker-Content-Digest": sha256(MANIFEST)}, send_body=body)
                if self.path == f"/v2/m/blobs/{sha256(LAYER)}":
                    if fake.storage is not None:
                        s = fake.storage
                        return self.send(307, headers={"Location": f"{s.scheme}://127.0.0.1:{s.port}/storage/x?sig=1"})
                    return self.send(200, LAYER, send_body=body)
                return self.send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no"}]}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.scheme = "http"
        self.ca_file = ""
        if tls_dir is not None:
            ca, cert, key = make_certificates(tls_dir)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme, self.ca_file = "https", str(ca)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fakes(tmp_path):
    made = []

    def make(tls=False):
        d = tmp_path / f"tls{len(made)}"
        d.mkdir()
        made.append(Fake(d if tls else None))
        return made[-1]

    yield make
    for f in made:
        f.close()


def creds_file(tmp_path, host, password=PASSWORD):
    p = tmp_path / "docker-config.json"
    p.write_text(json.dumps({"auths": {host: {"username": USER, "password": password}}}))
    return str(p)


def test_bearer_token_flow(fakes, tmp_path):
    reg = fakes()
    settings = OciSettings(insecure=True, credentials_file=creds_file(tmp_path, reg.host))
    ref = parse_reference(f"oci://{reg.host}/m:v1")
    art = pull(ref, settings, store_for(tmp_path / "state", ref))
    assert art.digest == sha256(MANIFEST) and (art.path / "a.yaml").read_bytes() == FILES["a.yaml"]
    tokens = [s for s in reg.seen if s[1].startswith("/token")]
    assert len(tokens) == 1 and tokens[0][2].startswith("Basic ")
    # the token is kept: the next resolve is one HEAD, with it
    n = len(reg.seen)
    assert resolve(ref, settings) == sha256(MANIFEST)
    assert reg.seen[n:] == [("HEAD", "/v2/m/manifests/v1", f"Bearer {TOKEN}")]


def test_bearer_wrong_password(fakes, tmp_path):
    reg = fakes()
    path = creds_file(tmp_path, reg.host, password="not-the-password")
    with pytest.raises(SourceError) as e:
        resolve(parse_reference(f"oci://{reg.host}/m:v1"), OciSettings(insecure=True, credentials_file=path))
    assert e.value.reason == "auth" and reg.host in e.value.message and path in e.value.message
    assert "not-the-password" not in e.value.message and TOKEN not in e.value.message


def test_redirect_to_storage_gets_no_authorization(fakes, tmp_path):
    reg, storage = fakes(), fakes()
    reg.storage = storage
    settings = OciSettings(insecure=True, credentials_file=creds_file(tmp_path, reg.host))
    ref = parse_reference(f"oci://{reg.host}/m:v1")
    art = pull(ref, settings, store_for(tmp_path / "state", ref))
    assert (art.path / "a.yaml").exists()
    assert storage.seen == [("GET", "/storage/x?sig=1", "")]


def test_a_challenge_from_a_redirect_target_is_not_answered(fakes, tmp_path):
    """The registry redirects a blob to another host, which answers 401 with a Bearer realm
    of its own: the registry's credentials never go to that realm, or anywhere there."""
    reg, evil = fakes(), fakes()
    reg.storage, evil.challenge = evil, True
    settings = OciSettings(insecure=True, credentials_file=creds_file(tmp_path, reg.host))
    ref = parse_reference(f"oci://{reg.host}/m:v1")
    store = store_for(tmp_path / "state", ref)
    with pytest.raises(SourceError) as e:
        pull(ref, settings, store)
    assert [s for s in evil.seen if s[2]] == [], evil.seen  # no Authorization at all, Basic or Bearer
    assert not [s for s in evil.seen if s[1].startswith("/token")], evil.seen
    assert e.value.reason == "auth" and evil.host in e.value.message and "redirected" in e.value.message
    assert [p.name for p in store.iterdir()] == [LOCK]


def test_https_to_http_redirect_refused(fakes, tmp_path):
    reg, storage = fakes(tls=True), fakes()
    reg.storage = storage
    settings = OciSettings(ca_file=reg.ca_file, credentials_file=creds_file(tmp_path, reg.host))
    ref = parse_reference(f"oci://{reg.host}/m:v1")
    store = store_for(tmp_path / "state", ref)
    with pytest.raises(SourceError) as e:
        pull(ref, settings, store)
    assert e.value.reason == "insecure-refused" and "https to plain http" in e.value.message
    assert storage.seen == [] and [p.name for p in store.iterdir()] == [LOCK]


def test_plain_http_token_realm_refused_over_tls(fakes, tmp_path):
    reg = fakes(tls=True)
    reg.realm_scheme = "http"
    settings = OciSettings(ca_file=reg.ca_file, credentials_file=creds_file(tmp_path, reg.host))
    with pytest.raises(SourceError) as e:
        resolve(parse_reference(f"oci://{reg.host}/m:v1"), settings)
    assert e.value.reason == "insecure-refused"
    assert not [s for s in reg.seen if s[1].startswith("/token")]  # the credentials never left


def test_credentials_file_forms(tmp_path):
    p = tmp_path / "c.json"
    auth = base64.b64encode(b"u:p:with:colons").decode()
    p.write_text(json.dumps({"auths": {"https://reg.example:5000/v1/": {"auth": auth}, "other": {"auth": "x"}}}))
    assert read_credentials(str(p), "reg.example:5000") == ("u", "p:with:colons")
    assert read_credentials(str(p), "reg.example") is None
    with pytest.raises(SourceError) as e:
        read_credentials(str(p), "other")
    assert e.value.reason == "auth" and "no usable credentials" in e.value.message
    p.write_text("not json")
    with pytest.raises(SourceError) as e:
        read_credentials(str(p), "x")
    assert "not JSON" in e.value.message
    with pytest.raises(SourceError) as e:
        read_credentials(str(tmp_path / "missing.json"), "x")
    assert "cannot read oci.credentialsFile" in e.value.message


def test_silent_and_garbage_servers(monkeypatch):
    """A registry that accepts and never answers times out (unreachable); one that answers
    garbage is a bad-response. Raw sockets on loopback."""
    import socket

    from reconciler.intake import registry as registry_module

    monkeypatch.setattr(registry_module, "READ_TIMEOUT", 0.5)
    for reply, reason in ((None, "unreachable"), (b"SSH-2.0-OpenSSH_9.2\r\n" * 50, "bad-response")):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        conns = []

        def serve():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                conns.append(c)
                if reply:
                    c.recv(65536)
                    c.sendall(reply)
                    c.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            with pytest.raises(SourceError) as e:
                resolve(parse_reference(f"oci://127.0.0.1:{srv.getsockname()[1]}/m:v1"), OciSettings(insecure=True))
            assert e.value.reason == reason, e.value.message
        finally:
            srv.close()
            for c in conns:
                c.close()
            close_registries()
