"""The OCI distribution API, as ortpack speaks it to a registry: references, and a client with
timeouts and one-line errors.

`OciReference` parses `oci://HOST[:PORT]/REPO[:TAG][@sha256:...]`. `client(ref)` opens a
`RegistryClient`: the `oras` library's registry client (the `oci` extra) does the HTTP, the token
or basic authentication and the blob uploads; manifests are written and read byte for byte, so
their digests are known. Registries on 127.0.0.1/localhost are spoken to over plain HTTP, all
others over HTTPS. Credentials: `ORTPACK_REGISTRY_USERNAME` / `ORTPACK_REGISTRY_PASSWORD`, else the
Docker config (`~/.docker/config.json` or `$DOCKER_CONFIG`, as `docker login` writes it).

Errors are one line: `BundleError` for content (a bad digest, a blob too large), `RegistryError`
(an `OSError`) for a registry that cannot be reached, refuses the credentials or fails.
What is pushed and pulled (a bundle, a modelcar image) is ortpack.kernel.oci's.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import BundleError

SCHEME = "oci://"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.ortpack.bundle.file.v1"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0
CHUNKED_UPLOAD_BYTES = 16 * 1024 * 1024  # larger files go up in chunks, never whole in memory
USERNAME_ENV = "ORTPACK_REGISTRY_USERNAME"
PASSWORD_ENV = "ORTPACK_REGISTRY_PASSWORD"

_HOST = r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?)"
_REPO = r"(?P<repo>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
_TAG = r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?"
_DIGEST = r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
_REFERENCE = re.compile(f"^{_HOST}/{_REPO}{_TAG}{_DIGEST}$")
SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class RegistryError(OSError):
    """The registry cannot be reached, refuses the credentials, or answers with an error."""


@dataclass(frozen=True, kw_only=True)
class OciReference:
    """`oci://HOST[:PORT]/REPO[:TAG][@sha256:...]`, parsed."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, uri: str) -> OciReference:
        if not uri.startswith(SCHEME):
            raise BundleError(f"not an OCI reference (oci://HOST[:PORT]/REPO:TAG or @sha256:...): {uri}")
        match = _REFERENCE.match(uri[len(SCHEME) :])
        if match is None:
            raise BundleError(
                f"bad OCI reference {uri!r}: expected oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:<hex>"
            )
        return cls(host=match["host"], repository=match["repo"], tag=match["tag"], digest=match["digest"])

    @property
    def reference(self) -> str:
        """What goes after `/manifests/`: the digest when pinned, else the tag."""
        ref = self.digest or self.tag
        if ref is None:
            raise BundleError(f"OCI reference names no tag or digest: {self}")
        return ref

    @property
    def insecure(self) -> bool:
        """Plain HTTP for a registry on this machine, HTTPS for every other."""
        return self.host.rsplit(":", 1)[0].strip("[]") in _LOCAL_HOSTS

    def pinned(self, digest: str) -> OciReference:
        return OciReference(host=self.host, repository=self.repository, digest=digest)

    def __str__(self) -> str:
        text = f"{SCHEME}{self.host}/{self.repository}"
        if self.digest:
            return f"{text}@{self.digest}"
        return f"{text}:{self.tag}" if self.tag else text


@dataclass(frozen=True, kw_only=True)
class Layer:
    path: str
    digest: str
    size: int


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- the client --------------------------------------------------------------------------


@contextmanager
def open_client(ref: OciReference) -> Iterator[RegistryClient]:
    try:
        import oras.provider  # noqa: F401
    except ImportError:
        raise RegistryError(
            "OCI registries need the oras library: install the oci extra (pip install ortpack[oci])"
        ) from None
    client = RegistryClient(ref)
    try:
        yield client
    finally:
        client.close()


class RegistryClient:
    """The OCI distribution API through oras' registry client, with timeouts and one-line errors."""

    def __init__(self, ref: OciReference) -> None:
        import oras.container
        import requests

        self.ref = ref
        self.base = f"{'http' if ref.insecure else 'https'}://{ref.host}/v2/{ref.repository}"
        self._requests = requests
        probe = self._probe()
        self.registry = _registry(ref, auth_backend="basic" if probe.lower().startswith("basic") else "token")
        self.container = oras.container.Container("placeholder", registry=ref.host)
        namespace, _, name = ref.repository.rpartition("/")
        self.container.namespace, self.container.repository = namespace or None, name
        self.container.tag, self.container.digest = ref.tag or "latest", ref.digest
        self._login(probe)

    def close(self) -> None:
        self.registry.session.close()

    # -- set-up

    def _probe(self) -> str:
        """GET /v2/ once, fast: an unreachable registry fails here, in one line; returns WWW-Authenticate."""
        url = f"{'http' if self.ref.insecure else 'https'}://{self.ref.host}/v2/"
        try:
            response = self._requests.get(url, timeout=(CONNECT_TIMEOUT_S, 30))
        except self._requests.RequestException as exc:
            raise RegistryError(f"cannot reach registry {self.ref.host}: {_reason(exc)}") from None
        if response.status_code not in (200, 401):
            raise RegistryError(
                f"{self.ref.host} is not an OCI registry: GET /v2/ answered HTTP {response.status_code}"
            )
        return response.headers.get("WWW-Authenticate", "") if response.status_code == 401 else ""

    def _login(self, challenge: str) -> None:
        username, password = os.environ.get(USERNAME_ENV, ""), os.environ.get(PASSWORD_ENV, "")
        if username and password:
            self.registry.auth.set_basic_auth(username, password)
        else:
            self.registry.auth.load_configs(self.container)  # docker config / credential helpers
        if challenge.lower().startswith("basic") and not getattr(self.registry.auth, "_basic_auth", None):
            raise RegistryError(
                f"registry {self.ref.host} needs credentials: set {USERNAME_ENV} and {PASSWORD_ENV} (or docker login)"
            )

    # -- requests

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        try:
            response = self.registry.do_request(url, method, **kwargs)
        except self._requests.RequestException as exc:
            raise RegistryError(f"registry {self.ref.host}: {method} failed: {_reason(exc)}") from None
        except ValueError as exc:  # oras: "Cannot respond to request for authentication."
            raise RegistryError(f"registry {self.ref.host}: {_reason(exc)}") from None
        if response.status_code in (401, 403):
            raise RegistryError(
                f"registry {self.ref.host} refused access to {self.ref.repository} (HTTP {response.status_code}): "
                f"check {USERNAME_ENV}/{PASSWORD_ENV} or the docker config"
            )
        return response

    def _fail(self, response: Any, what: str) -> RegistryError:
        return RegistryError(
            f"registry {self.ref.host}: {what} failed: HTTP {response.status_code} {_oci_error(response)}"
        )

    # -- blobs

    def upload(self, path: Path, layer: Layer, media_type: str = LAYER_MEDIA_TYPE) -> None:
        if self._blob_exists(layer.digest):
            return
        descriptor = {"digest": layer.digest, "size": layer.size, "mediaType": media_type}
        try:
            if layer.size > CHUNKED_UPLOAD_BYTES:
                response = self.registry.chunked_upload(str(path), self.container, descriptor)
            else:
                response = self.registry.put_upload(str(path), self.container, descriptor)
        except self._requests.RequestException as exc:
            raise RegistryError(f"registry {self.ref.host}: upload of {layer.path} failed: {_reason(exc)}") from None
        except ValueError as exc:
            raise RegistryError(f"registry {self.ref.host}: upload of {layer.path} failed: {_reason(exc)}") from None
        if response.status_code == 400 and "DIGEST_INVALID" in response.text:
            raise BundleError(f"{layer.path} changed while it was pushed (its sha256 is no longer {layer.digest})")
        if response.status_code not in (201, 202, 204):
            raise self._fail(response, f"upload of {layer.path}")

    def upload_bytes(self, data: bytes, digest: str) -> None:
        if self._blob_exists(digest):
            return
        started = self.request("POST", f"{self.base}/blobs/uploads/", headers={"Content-Length": "0"})
        location = started.headers.get("Location", "")
        if started.status_code != 202 or not location:
            raise self._fail(started, "starting an upload")
        if not location.startswith("http"):
            location = f"{'http' if self.ref.insecure else 'https'}://{self.ref.host}{location}"
        separator = "&" if "?" in location else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))}
        done = self.request("PUT", f"{location}{separator}digest={digest}", data=data, headers=headers)
        if done.status_code not in (201, 204):
            raise self._fail(done, "config upload")

    def _blob_exists(self, digest: str) -> bool:
        return int(self.request("HEAD", f"{self.base}/blobs/{digest}").status_code) == 200

    def download(self, layer: Layer, target: Path, reference: str) -> None:
        response = self.request("GET", f"{self.base}/blobs/{layer.digest}", stream=True)
        with response:
            if response.status_code == 404:
                raise BundleError(f"layer {layer.path} ({layer.digest}) is missing from the registry: {reference}")
            if response.status_code != 200:
                raise self._fail(response, f"download of {layer.path}")
            digest, received = hashlib.sha256(), 0
            try:
                with open(target, "wb") as out:
                    for block in response.iter_content(chunk_size=1 << 20):
                        received += len(block)
                        if received > layer.size:
                            raise BundleError(f"layer {layer.path} is larger than its manifest says ({reference})")
                        digest.update(block)
                        out.write(block)
            except self._requests.RequestException as exc:
                raise RegistryError(
                    f"registry {self.ref.host}: download of {layer.path} failed: {_reason(exc)}"
                ) from None
        if received != layer.size:
            raise BundleError(f"layer {layer.path} is {received} bytes, its manifest says {layer.size} ({reference})")
        if f"sha256:{digest.hexdigest()}" != layer.digest:
            raise BundleError(f"layer digest mismatch for {layer.path}: the registry sent other bytes ({reference})")

    # -- manifests

    def put_manifest(self, reference: str, body: bytes, digest: str) -> None:
        headers = {"Content-Type": MANIFEST_MEDIA_TYPE}
        response = self.request("PUT", f"{self.base}/manifests/{reference}", data=body, headers=headers)
        if response.status_code not in (200, 201):
            raise self._fail(response, "manifest upload")
        echoed = response.headers.get("Docker-Content-Digest")
        if echoed and echoed != digest:
            raise RegistryError(f"registry {self.ref.host} stored the manifest as {echoed}, expected {digest}")

    def get_manifest(self, reference: str, accept: tuple[str, ...] = (MANIFEST_MEDIA_TYPE,)) -> bytes:
        headers = {"Accept": ", ".join(accept)}
        response = self.request("GET", f"{self.base}/manifests/{reference}", headers=headers, stream=True)
        with response:
            if response.status_code == 404:
                raise BundleError(f"bundle not found: {self.ref}")
            if response.status_code != 200:
                raise self._fail(response, "manifest download")
            body = b""
            for block in response.iter_content(chunk_size=65536):
                body += block
                if len(body) > MAX_MANIFEST_BYTES:
                    raise BundleError(f"OCI manifest larger than {MAX_MANIFEST_BYTES} bytes: {self.ref}")
        return body

    def get_blob(self, digest: str, limit: int) -> bytes:
        """A small blob (an image config), at most `limit` bytes, checked against its digest."""
        response = self.request("GET", f"{self.base}/blobs/{digest}", stream=True)
        with response:
            if response.status_code != 200:
                raise self._fail(response, f"download of {digest}")
            body = b""
            for block in response.iter_content(chunk_size=65536):
                body += block
                if len(body) > limit:
                    raise BundleError(f"blob {digest} is larger than {limit} bytes: {self.ref}")
        if sha256_digest(body) != digest:
            raise BundleError(f"blob digest mismatch for {digest}: the registry sent other bytes ({self.ref})")
        return body


def _registry(ref: OciReference, auth_backend: str) -> Any:
    """oras' registry client, with default timeouts and without its retry-with-sleeps loop."""
    import oras.provider
    from requests.adapters import HTTPAdapter

    class _TimeoutAdapter(HTTPAdapter):
        def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
            return super().send(request, **kwargs)

    class _Registry(oras.provider.Registry):  # type: ignore[misc]
        # oras retries every failed request 5 times with sleeps of 3 to 83 s; a deploy job's
        # restart policy is the retry here, and an error should arrive in seconds.
        def do_request(self, *args: Any, **kwargs: Any) -> Any:
            unwrapped = getattr(oras.provider.Registry.do_request, "__wrapped__", None)
            if unwrapped is None:
                return super().do_request(*args, **kwargs)
            return unwrapped(self, *args, **kwargs)

    registry = _Registry(hostname=ref.host, insecure=ref.insecure, auth_backend=auth_backend)
    adapter = _TimeoutAdapter()
    registry.session.mount("http://", adapter)
    registry.session.mount("https://", adapter)
    return registry


def _oci_error(response: Any) -> str:
    """The first OCI error code and message of a failed response, if it has one."""
    try:
        errors = response.json().get("errors") or []
        first = errors[0]
        return f"{first.get('code', '')}: {first.get('message', '')}".strip(": ")
    except (ValueError, AttributeError, IndexError, TypeError):
        return (response.reason or "").strip()


def _reason(exc: BaseException) -> str:
    """A one-line reason for a requests error (the innermost cause, without urllib3's noise)."""
    cause: BaseException | None = exc
    while cause is not None and cause.__context__ is not None and len(str(cause)) > 200:
        cause = cause.__context__
    text = " ".join(str(cause or exc).split()) or type(exc).__name__
    if "Connection refused" in text:
        return "connection refused"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return text[:300]
