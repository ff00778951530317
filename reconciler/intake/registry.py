"""A client of the OCI distribution API, just what pulling an artifact needs: HEAD and GET
of manifests, GET of blobs streamed to a file while hashed, every digest and size checked
by the caller's rules. TLS trusts the system CAs plus oci.caFile; plain HTTP only with
oci.insecure. Credentials come from a docker-style config.json (oci.credentialsFile) and
answer a Basic or Bearer challenge; they and the tokens are never logged or shown.
"""

# httpx (not requests): it takes an ssl.SSLContext as `verify`, so the trust store is
# exactly ssl.create_default_context() (the system's CAs) plus caFile, with no certifi
# bundle substituted. Redirects are followed here, not by httpx: a blob GET may be sent
# to storage elsewhere (pre-signed URLs), never from https down to http, and the
# registry's Authorization header never goes to another host. trust_env is off: no
# credentials from ~/.netrc or proxies from the environment.

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import ssl
import threading
from pathlib import Path
from typing import Callable
from urllib.parse import urljoin, urlsplit

from reconciler.intake.model import OciSettings
from reconciler.intake.oci_reference import SourceError, is_digest

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
MAX_MANIFEST_BYTES = 4 << 20  # distribution's own limit on a manifest
MAX_REDIRECTS = 5
API_VERSION_HEADER = "Docker-Distribution-Api-Version"  # every registry answer has it
MAX_TOKEN_BYTES = 1 << 20
CONNECT_TIMEOUT = 10.0  # seconds
READ_TIMEOUT = 30.0  # seconds without a byte, per read

_PARAM_RE = re.compile(r'(\w+)="([^"]*)"')


def _timeout():
    import httpx

    return httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, pool=CONNECT_TIMEOUT)


def ssl_context(ca_file: str = "") -> ssl.SSLContext:
    """The system's CAs (ssl.create_default_context()) plus `ca_file`'s."""
    ctx = ssl.create_default_context()
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise SourceError("tls", f"cannot load oci.caFile {ca_file} ({getattr(e, 'strerror', None) or e}); "
                                     f"give a readable PEM file of CA certificates") from None
    return ctx


def read_credentials(path: str, host: str) -> tuple[str, str] | None:
    """(username, password) for `host` from a docker config.json's `auths` (keys "host:port",
    "https://host:port/..." ...); None when the file has none for it."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(MAX_MANIFEST_BYTES))
    except OSError as e:
        raise SourceError("auth", f"cannot read oci.credentialsFile {path} ({e.strerror})") from None
    except ValueError:
        raise SourceError("auth", f"oci.credentialsFile {path} is not JSON; write a docker config.json "
                                  f'({{"auths": {{"{host}": {{"auth": "<base64 user:password>"}}}}}})') from None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    for key, entry in (auths.items() if isinstance(auths, dict) else ()):
        name = urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
        if name != host or not isinstance(entry, dict):
            continue
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return entry["username"], entry["password"]
        try:
            user, sep, password = base64.b64decode(str(entry.get("auth", "")), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise SourceError("auth", f"oci.credentialsFile {path}: the entry of {host} has no usable credentials "
                                      f'("auth": base64 of user:password, or "username" and "password")')
        return user, password
    return None


def _ssl_cause(exc: BaseException) -> ssl.SSLError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class Registry:
    """One registry host: a connection pool, its scheme, and the auth it asked for.
    Thread-safe enough for one fetcher and one-shot commands (the auth state is locked)."""

    def __init__(self, host: str, settings: OciSettings, *, on_request: Callable | None = None):
        import httpx

        self.host = host
        self.settings = settings
        self.scheme = "http" if settings.insecure else "https"
        self._lock = threading.Lock()
        self._authorization: str | None = None  # the header that last answered a challenge
        hooks = {"request": [on_request]} if on_request else {}
        verify = ssl_context(settings.ca_file) if self.scheme == "https" else False
        self._client = httpx.Client(verify=verify, timeout=_timeout(), follow_redirects=False, trust_env=False,
                                    event_hooks=hooks)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the API ---------------------------------------------------------------------------

    def head_manifest(self, repository: str, tag: str) -> str:
        """The digest `tag` points at: ONE HEAD request (its Docker-Content-Digest). A
        registry that sends no digest costs a GET, whose bytes are hashed instead."""
        with self._send("HEAD", f"/v2/{repository}/manifests/{tag}", {"Accept": MANIFEST_ACCEPT},
                        what=f"the tag {tag} of {repository}") as r:
            digest = r.headers.get("Docker-Content-Digest", "")
        if digest:
            if not is_digest(digest):
                raise SourceError("bad-response", f"{self.host} answered the tag {tag} of {repository} with the "
                                                  f"digest {digest[:100]!r}, not sha256:<64 hex>")
            return digest
        raw, _ = self.get_manifest(repository, tag)
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    def get_manifest(self, repository: str, reference: str, digest: str | None = None) -> tuple[bytes, str]:
        """(the manifest's bytes, its media type); with `digest`, the bytes' sha256 must be it
        (SourceError digest-mismatch). Bounded at MAX_MANIFEST_BYTES."""
        what = f"the manifest {reference} of {repository}"
        with self._send("GET", f"/v2/{repository}/manifests/{reference}", {"Accept": MANIFEST_ACCEPT}, what=what) as r:
            raw = self._read_bounded(r, MAX_MANIFEST_BYTES, what)
            media_type = r.headers.get("Content-Type", "").split(";", 1)[0].strip()
            sent = r.headers.get("Docker-Content-Digest", "")
        actual = "sha256:" + hashlib.sha256(raw).hexdigest()
        expected = digest or (reference if is_digest(reference) else sent if is_digest(sent) else None)
        if expected and actual != expected:
            raise SourceError("digest-mismatch", f"{self.host} served {what} as {len(raw)} bytes whose digest is "
                                                 f"{actual}, not {expected}: refused (a broken or hostile registry)")
        return raw, media_type

    def get_blob(self, repository: str, digest: str, size: int, dest: Path, limit: int) -> None:
        """Stream the blob `digest` of `size` bytes into `dest` (created), hashing as it
        comes; more than `size` bytes, or another digest or size at the end: SourceError
        digest-mismatch (dest is left for the caller to remove). `size` over `limit`:
        too-large, before any download."""
        what = f"the blob {digest} of {repository}"
        if size > limit:
            raise SourceError("too-large", f"{what} is {size} bytes, over the {limit}-byte limit: refused")
        h = hashlib.sha256()
        got = 0
        with self._send("GET", f"/v2/{repository}/blobs/{digest}", {}, what=what) as r, open(dest, "xb") as f:
            for chunk in self._chunks(r, what):
                got += len(chunk)
                if got > size:
                    raise SourceError("digest-mismatch", f"{self.host} sent more than the {size} bytes of {what}: refused")
                h.update(chunk)
                f.write(chunk)
        actual = "sha256:" + h.hexdigest()
        if got != size or actual != digest:
            raise SourceError("digest-mismatch", f"{self.host} sent {what} as {got} bytes with the digest {actual}; "
                                                 f"the manifest says {size} bytes, {digest}: refused")

    def get_small_blob(self, repository: str, digest: str, size: int, limit: int) -> bytes:
        """A small blob in memory, its size and digest checked."""
        what = f"the blob {digest} of {repository}"
        if size > limit:
            raise SourceError("too-large", f"{what} is {size} bytes, over the {limit}-byte limit: refused")
        with self._send("GET", f"/v2/{repository}/blobs/{digest}", {}, what=what) as r:
            raw = self._read_bounded(r, size, what)
        actual = "sha256:" + hashlib.sha256(raw).hexdigest()
        if len(raw) != size or actual != digest:
            raise SourceError("digest-mismatch", f"{self.host} sent {what} as {len(raw)} bytes with the digest "
                                                 f"{actual}; the manifest says {size} bytes, {digest}: refused")
        return raw

    # --- requests, redirects, auth --------------------------------------------------------

    @contextlib.contextmanager
    def _send(self, method: str, path: str, headers: dict, *, what: str):
        """The streamed response to METHOD path, after auth and redirects, closed when the
        `with` ends; SourceError for every failure, a status other than 2xx included."""
        r = self._authorized(method, path, headers)
        try:
            self._check_status(r, what)
            yield r
        finally:
            r.close()

    def _authorized(self, method: str, path: str, headers: dict):
        with self._lock:
            authorization = self._authorization
        r = self._follow(method, path, headers, authorization)
        if r.status_code != 401:
            return r
        challenge = r.headers.get("WWW-Authenticate", "")
        r.close()
        where = urlsplit(str(r.url)).netloc
        if where != self.host:  # only the registry's own challenge is answered with its credentials
            raise SourceError("auth", f"{self.host} redirected {path} to {where}, which asks for credentials (401): "
                                      f"refused, {self.host}'s credentials are never sent to another host")
        authorization = self._answer(challenge, path)
        with self._lock:
            self._authorization = authorization
        r = self._follow(method, path, headers, authorization)
        if r.status_code == 401:
            r.close()
            raise SourceError("auth", f"{self.host} refused the credentials {self._credentials_said()}; "
                                      f"check the user and password there")
        return r

    def _follow(self, method: str, path: str, headers: dict, authorization: str | None):
        """Send, following redirects ourselves: never https -> http, and the registry's
        Authorization only to the registry's own host."""
        url = f"{self.scheme}://{self.host}{path}"
        for _ in range(MAX_REDIRECTS + 1):
            hdrs = dict(headers)
            if authorization and urlsplit(url).netloc == self.host:
                hdrs["Authorization"] = authorization
            r = self._send_once(method, url, hdrs)
            if r.status_code not in (301, 302, 303, 307, 308) or "Location" not in r.headers:
                return r
            r.close()
            nxt = urljoin(url, r.headers["Location"])
            if urlsplit(nxt).scheme not in ("http", "https"):
                raise SourceError("bad-response", f"{self.host} redirected to a {urlsplit(nxt).scheme or 'schemeless'} "
                                                  f"URL: refused")
            if urlsplit(url).scheme == "https" and urlsplit(nxt).scheme == "http":
                raise SourceError("insecure-refused", f"{self.host} redirected {path} from https to plain http "
                                                      f"({urlsplit(nxt).netloc}): refused, a download never loses TLS")
            url = nxt
        raise SourceError("bad-response", f"{self.host} redirected {path} more than {MAX_REDIRECTS} times: refused")

    def _send_once(self, method: str, url: str, headers: dict):
        import httpx

        where = urlsplit(url).netloc
        try:
            return self._client.send(self._client.build_request(method, url, headers=headers), stream=True)
        except httpx.TimeoutException:
            raise SourceError("unreachable", f"{where} did not answer within {READ_TIMEOUT:.0f} s "
                                             f"({method} {urlsplit(url).path})") from None
        except httpx.HTTPError as e:
            cause = _ssl_cause(e)
            if cause is not None:
                raise self._tls_error(where, cause) from None
            if isinstance(e, (httpx.ConnectError, httpx.NetworkError)):
                raise SourceError("unreachable", f"cannot connect to the registry {where} ({_reason(e)}); "
                                                 f"is it up, and is the host right?") from None
            raise SourceError("bad-response", f"{where} broke the HTTP exchange ({type(e).__name__}: {_reason(e)})") from None

    def _tls_error(self, where: str, cause: ssl.SSLError) -> SourceError:
        text = str(cause)
        if isinstance(cause, ssl.SSLCertVerificationError):
            return SourceError("tls", f"the TLS certificate of {where} is not trusted ({cause.verify_message}); "
                                      f"add its CA to oci.caFile (the system CAs are trusted too)")
        if any(s in text for s in ("WRONG_VERSION_NUMBER", "wrong version number", "record layer failure",
                                   "RECORD_LAYER_FAILURE", "packet length too long", "http request")):
            return SourceError("insecure-refused", f"{where} speaks plain HTTP, not TLS; nftrec refuses plain HTTP "
                                                   f"unless the node config sets oci.insecure: true")
        return SourceError("tls", f"TLS with {where} failed ({text[:200]})")

    def _check_status(self, r, what: str) -> None:
        code = r.status_code
        if 200 <= code < 300:
            return
        if code == 404:
            raise SourceError("not-found", f"{self.host} has no {what} (404)")
        if code == 403:
            raise SourceError("auth", f"{self.host} denied access to {what} (403) {self._credentials_said()}")
        body = self._peek(r)
        # Go's TLS server answers plain HTTP with a bare 400 (its text only to a GET)
        if code == 400 and self.scheme == "http" and (b"HTTPS server" in body or not r.headers.get(API_VERSION_HEADER)):
            raise SourceError("tls", f"{self.host} answered plain HTTP with 400, as a TLS server does; if it speaks "
                                     f"TLS, remove oci.insecure (and set oci.caFile if its CA is private)")
        raise SourceError("bad-response", f"{self.host} answered {code} for {what}{_errors_of(body)}")

    def _answer(self, challenge: str, path: str) -> str:
        """The Authorization header answering a WWW-Authenticate challenge."""
        scheme, _, params = challenge.strip().partition(" ")
        fields = dict(_PARAM_RE.findall(params))
        creds = read_credentials(self.settings.credentials_file, self.host) if self.settings.credentials_file else None
        if scheme.lower() == "basic":
            if creds is None:
                raise SourceError("auth", f"{self.host} asks for credentials (Basic); "
                                          f"{self._no_credentials()}")
            return _basic(creds)
        if scheme.lower() == "bearer" and fields.get("realm"):
            return "Bearer " + self._token(fields, creds, path)
        raise SourceError("auth", f"{self.host} asks for an authentication nftrec does not speak "
                                  f"({challenge[:80]!r}); Basic and Bearer are supported")

    def _token(self, fields: dict, creds: tuple[str, str] | None, path: str) -> str:
        """The Bearer token flow: GET realm?service=..&scope=.. (with Basic credentials when
        the credentials file has some for this host) -> `token` or `access_token`."""
        realm = fields["realm"]
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or (parts.scheme == "http" and not self.settings.insecure):
            raise SourceError("insecure-refused", f"{self.host} sends for tokens to {realm[:200]}, not an https URL; "
                                                  f"refused unless oci.insecure: true")
        params = {k: fields[k] for k in ("service", "scope") if fields.get(k)}
        m = re.match(r"/v2/(.+?)/(?:manifests|blobs)/", path)
        if "scope" not in params and m:
            params["scope"] = f"repository:{m.group(1)}:pull"
        headers = {}
        if creds is not None:
            headers["Authorization"] = _basic(creds)
        url = realm + ("&" if "?" in realm else "?") + "&".join(f"{k}={_quote(v)}" for k, v in params.items())
        r = self._send_once("GET", url, headers)
        try:
            if r.status_code in (401, 403):
                raise SourceError("auth", f"the token service of {self.host} ({parts.netloc}) refused the credentials "
                                          f"{self._credentials_said() if creds else '(none: ' + self._no_credentials() + ')'}")
            if r.status_code != 200:
                raise SourceError("bad-response", f"the token service of {self.host} ({parts.netloc}) answered {r.status_code}")
            raw = self._read_bounded(r, MAX_TOKEN_BYTES, "a token")
        finally:
            r.close()
        try:
            doc = json.loads(raw)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
            raise SourceError("bad-response", f"the token service of {self.host} ({parts.netloc}) sent no token")
        return token

    def _credentials_said(self) -> str:
        f = self.settings.credentials_file
        return f"for {self.host} in oci.credentialsFile {f}" if f else "(no oci.credentialsFile is set)"

    def _no_credentials(self) -> str:
        f = self.settings.credentials_file
        if f:
            return f"oci.credentialsFile {f} has none for {self.host}; add an auths entry \"{self.host}\""
        return "set oci.credentialsFile to a docker config.json whose auths hold them"

    # --- bodies ---------------------------------------------------------------------------

    def _chunks(self, r, what: str):
        import httpx

        try:
            # decoded: a Content-Encoding a proxy added is undone; the bound counts decoded bytes
            yield from r.iter_bytes(1 << 20)
        except httpx.TimeoutException:
            raise SourceError("unreachable", f"{self.host} stopped sending {what} (nothing for {READ_TIMEOUT:.0f} s)") from None
        except httpx.HTTPError as e:
            raise SourceError("bad-response", f"{self.host} broke off {what} ({type(e).__name__}: {_reason(e)})") from None

    def _read_bounded(self, r, limit: int, what: str) -> bytes:
        out = bytearray()
        for chunk in self._chunks(r, what):
            out += chunk
            if len(out) > limit:
                raise SourceError("too-large", f"{self.host} sent more than {limit} bytes for {what}: refused")
        return bytes(out)

    def _peek(self, r) -> bytes:
        try:
            return self._read_bounded(r, 4096, "an error")
        except SourceError:
            return b""



def _errors_of(body: bytes) -> str:
    """The registry's own error codes (distribution's {"errors": [{"code", "message"}]})."""
    try:
        doc = json.loads(body)
        codes = [f"{str(e['code'])[:50]}: {str(e.get('message', ''))[:100]}" for e in doc["errors"][:3]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""
    return " (" + "; ".join(codes) + ")" if codes else ""


def _basic(creds: tuple[str, str]) -> str:
    """The Basic Authorization header of (user, password)."""
    return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text[:200]


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe=":/")
