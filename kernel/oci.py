"""An OCI registry as a bundle store: push a bundle directory as an OCI artifact, pull it back.

One layer per bundle file (manifest.json and model.sig included), the raw bytes, with its sha256
as the layer digest (so the same digest manifest.json records) and its path in the bundle as the
`org.opencontainers.image.title` annotation. The OCI image manifest has artifactType
`application/vnd.ortpack.bundle.v1+json`, the empty config, and annotations naming the bundle
(name, version, task, variants, created). `push_bundle` returns the pinned reference
`oci://HOST[:PORT]/REPO@sha256:<digest of the OCI manifest>`.

`pull_bundle` takes `oci://HOST[:PORT]/REPO@sha256:...` (pinned: the manifest's bytes must hash to
that digest) or `...:TAG`, refuses a manifest that is not an ortpack bundle, a layer path that is
absolute, has `..` or repeats, and more than a fetched bundle's limits (`ortpack.kernel.bundle.BUNDLE_RULES`,
ortpack.kernel.archive's rules); then downloads each layer, checking its size and sha256 while streaming,
into a hidden directory renamed into place when complete. The caller then verifies the bundle as
usual (`verify_bundle`, `verify_signature`).

Transport: the `oras` library's registry client (the `oci` extra) does the HTTP, the token or
basic authentication and the blob uploads; manifests are written and read here, byte for byte, so
their digests are known. Registries on 127.0.0.1/localhost are spoken to over plain HTTP, all others
over HTTPS. Credentials: `ORTPACK_REGISTRY_USERNAME` / `ORTPACK_REGISTRY_PASSWORD`, else the Docker
config (`~/.docker/config.json` or `$DOCKER_CONFIG`, as `docker login` writes it).

`push_modelcar` writes the same bundle as a container image for KServe's modelcars
(`storageUri: oci://...`): the files under /models, one uncompressed tar layer per file (a
byte-identical push gives the same digests), written directly with no build step. KServe runs the
image as a sidecar with `sh -c "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"`, so it
needs a shell: `base` names an image (in any registry this client can read, e.g. busybox) whose
layers and config come first.

Errors are one line: `BundleError` for content (not found, bad digest, not a bundle, unsafe path),
`RegistryError` (an `OSError`) for a registry that cannot be reached, refuses the credentials or
fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import BUNDLE_RULES, BundleError

SCHEME = "oci://"
ARTIFACT_TYPE = "application/vnd.ortpack.bundle.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.ortpack.bundle.file.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
EMPTY_CONFIG_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # of b"{}"
EMPTY_CONFIG = {"mediaType": "application/vnd.oci.empty.v1+json", "digest": EMPTY_CONFIG_DIGEST, "size": 2}
TITLE = "org.opencontainers.image.title"
ANNOTATION_PREFIX = "dev.ortpack.bundle."
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
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
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
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
class _Layer:
    path: str
    digest: str
    size: int


def is_oci_reference(uri: str) -> bool:
    return uri.startswith(SCHEME)


# --- push ---------------------------------------------------------------------------------


def push_bundle(bundle_dir: Path, reference: str) -> str:
    """Push every file of `bundle_dir` to `oci://HOST[:PORT]/REPO:TAG`; return `oci://HOST[:PORT]/REPO@sha256:...`.

    The bundle is verified first (`verify_bundle`); the registry checks each upload against its
    digest. Without a tag the manifest is pushed by digest only.
    """
    from ortpack.kernel.bundle import verify_bundle

    bundle_dir = Path(bundle_dir)
    target = OciReference.parse(reference)
    if target.digest:
        raise BundleError(f"push to a tag (oci://HOST/REPO:TAG), not a digest: {reference}")
    manifest = verify_bundle(bundle_dir)
    layers = _bundle_layers(bundle_dir, manifest.files)
    body = _encode_manifest(layers, _annotations(manifest))
    digest = _sha256_digest(body)
    with _client(target) as client:
        for layer in layers:
            client.upload(bundle_dir / layer.path, layer)
        client.upload_bytes(b"{}", EMPTY_CONFIG_DIGEST)
        client.put_manifest(target.tag or digest, body, digest)
    return str(target.pinned(digest))


def _bundle_layers(bundle_dir: Path, listed: Mapping[str, Any]) -> list[_Layer]:
    """One layer per regular file; digests from manifest.json where listed (verified just before), else hashed."""
    from ortpack.kernel.bundle import sha256_file

    layers: list[_Layer] = []
    for dirpath, dirnames, filenames in os.walk(bundle_dir):
        for name in [*dirnames, *filenames]:
            if (Path(dirpath) / name).is_symlink():
                raise BundleError(f"links cannot be pushed: {(Path(dirpath) / name).relative_to(bundle_dir)}")
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(bundle_dir).as_posix()
            entry = listed.get(rel)
            sha = entry.sha256 if entry is not None else sha256_file(path)
            layers.append(_Layer(path=rel, digest=f"sha256:{sha}", size=path.stat().st_size))
    return sorted(layers, key=lambda layer: layer.path)


def _annotations(manifest: Any) -> dict[str, str]:
    variants = ",".join(v.id for v in manifest.variants)
    return {
        "org.opencontainers.image.title": manifest.name,
        "org.opencontainers.image.version": manifest.version,
        "org.opencontainers.image.created": manifest.created_at,
        f"{ANNOTATION_PREFIX}name": manifest.name,
        f"{ANNOTATION_PREFIX}version": manifest.version,
        f"{ANNOTATION_PREFIX}task": manifest.task,
        f"{ANNOTATION_PREFIX}variants": variants,
        f"{ANNOTATION_PREFIX}schema-version": str(manifest.schema_version),
    }


def _encode_manifest(layers: list[_Layer], annotations: dict[str, str]) -> bytes:
    document = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": EMPTY_CONFIG,
        "layers": [
            {
                "mediaType": LAYER_MEDIA_TYPE,
                "digest": layer.digest,
                "size": layer.size,
                "annotations": {TITLE: layer.path},
            }
            for layer in layers
        ],
        "annotations": annotations,
    }
    return json.dumps(document, indent=2).encode()


# --- modelcar -----------------------------------------------------------------------------

IMAGE_CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
TAR_LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
INDEX_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
DOCKER_MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
MODELCAR_DIR = "models"  # KServe links /proc/<pid>/root/models to /mnt/models


def push_modelcar(bundle_dir: Path, reference: str, *, base: str | None = None) -> str:
    """Push `bundle_dir` as a KServe modelcar image (files under /models) to `oci://HOST/REPO:TAG`;
    return the pinned reference. `base`: `oci://...` of an image with a shell (its layers first,
    its config kept: the sidecar runs `sh -c ...`); without one the image holds only /models."""
    from ortpack.kernel.bundle import verify_bundle

    bundle_dir = Path(bundle_dir)
    target = OciReference.parse(reference)
    if target.digest:
        raise BundleError(f"push to a tag (oci://HOST/REPO:TAG), not a digest: {reference}")
    manifest = verify_bundle(bundle_dir)
    files = _bundle_layers(bundle_dir, manifest.files)
    base_layers: list[dict[str, Any]] = []
    config: dict[str, Any] = {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers"}}
    diff_ids: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ortpack-modelcar-") as tmp, _client(target) as client:
        if base:
            base_ref = OciReference.parse(base)
            with _client(base_ref) as source:
                base_manifest, config = _image_manifest(source, base_ref)
                diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
                for layer in base_manifest.get("layers") or []:
                    _copy_blob(source, client, layer, Path(tmp))
                    base_layers.append(layer)
        layers = []
        for tar_path, digest, size in _modelcar_layers(bundle_dir, files, Path(tmp)):
            client.upload(tar_path, _Layer(path=tar_path.name, digest=digest, size=size), TAR_LAYER_MEDIA_TYPE)
            layers.append({"mediaType": TAR_LAYER_MEDIA_TYPE, "digest": digest, "size": size})
            diff_ids.append(digest)  # uncompressed: the layer's digest is its diff_id
        config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
        config.setdefault("config", {}).setdefault("Labels", {})
        config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **_annotations(manifest)}
        config_body = json.dumps(config, sort_keys=True).encode()
        config_digest = _sha256_digest(config_body)
        client.upload_bytes(config_body, config_digest)
        document = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": IMAGE_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config_body)},
            "layers": [*base_layers, *layers],
            "annotations": _annotations(manifest),
        }
        body = json.dumps(document, indent=2).encode()
        digest = _sha256_digest(body)
        client.put_manifest(target.tag or digest, body, digest)
    return str(target.pinned(digest))


def _modelcar_layers(bundle_dir: Path, files: list[_Layer], tmp: Path) -> Iterator[tuple[Path, str, int]]:
    """One reproducible tar per bundle file at models/<path> (root-owned, 0644 files, 0755
    directories, mtime 0), the first also holding models/ itself; yields (tar, digest, size)."""
    import tarfile

    def entry(name: str, *, directory: bool = False, size: int = 0) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
        info.mode, info.size, info.mtime = (0o755 if directory else 0o644), size, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    for index, layer in enumerate(files):
        tar_path = tmp / f"layer-{index}.tar"
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            parents = [MODELCAR_DIR] if index == 0 else []
            parts = Path(layer.path).parts
            parents += [f"{MODELCAR_DIR}/{'/'.join(parts[:i])}" for i in range(1, len(parts))]
            for directory in parents:
                tar.addfile(entry(directory, directory=True))
            with open(bundle_dir / layer.path, "rb") as fh:
                tar.addfile(entry(f"{MODELCAR_DIR}/{layer.path}", size=layer.size), fh)
        digest = hashlib.sha256()
        with open(tar_path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        yield tar_path, f"sha256:{digest.hexdigest()}", tar_path.stat().st_size


def _image_manifest(client: _Client, ref: OciReference) -> tuple[dict[str, Any], dict[str, Any]]:
    """The linux/amd64 image manifest at `ref` (through an index if it is one) and its config."""
    document = json.loads(
        client.get_manifest(ref.reference, accept=(MANIFEST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, *INDEX_MEDIA_TYPES))
    )
    if document.get("mediaType") in INDEX_MEDIA_TYPES or "manifests" in document:
        wanted = [
            m
            for m in document.get("manifests") or []
            if (m.get("platform") or {}).get("os") == "linux"
            and (m.get("platform") or {}).get("architecture") == "amd64"
        ]
        if not wanted:
            raise BundleError(f"base image {ref} has no linux/amd64 image")
        document = json.loads(
            client.get_manifest(wanted[0]["digest"], accept=(MANIFEST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE))
        )
    config_digest = (document.get("config") or {}).get("digest", "")
    if not _SHA256.match(str(config_digest)):
        raise BundleError(f"base image {ref} has no config")
    return document, json.loads(client.get_blob(config_digest, MAX_MANIFEST_BYTES))


def _copy_blob(source: _Client, target: _Client, layer: dict[str, Any], tmp: Path) -> None:
    """Copy one blob between repositories (registries), through a file, digest-checked."""
    digest, size = str(layer.get("digest", "")), layer.get("size")
    if not _SHA256.match(digest) or not isinstance(size, int):
        raise BundleError(f"base image layer without a sha256 digest and size: {layer}")
    path = tmp / digest.replace(":", "-")
    blob = _Layer(path=path.name, digest=digest, size=size)
    if target._blob_exists(digest):
        return
    source.download(blob, path, str(source.ref))
    target.upload(path, blob, str(layer.get("mediaType") or TAR_LAYER_MEDIA_TYPE))
    path.unlink()


# --- pull ---------------------------------------------------------------------------------


def pull_bundle(reference: str, dest_dir: Path) -> str:
    """Pull the bundle at `reference` into `dest_dir` (which must not exist); return the pinned reference.

    Checks the manifest digest when `reference` is pinned, and every layer's size and sha256; a
    failure leaves nothing at `dest_dir`. The bundle itself is not verified here: the caller runs
    `verify_bundle` (and `verify_signature` with a trust key) on `dest_dir`.
    """
    source = OciReference.parse(reference)
    dest_dir = Path(dest_dir)
    if dest_dir.exists():
        raise BundleError(f"output directory exists: {dest_dir}")
    with _client(source) as client:
        body = client.get_manifest(source.reference)
        digest = _sha256_digest(body)
        if source.digest and digest != source.digest:
            raise BundleError(f"manifest digest mismatch for {reference}: the registry sent {digest}")
        layers = _parse_manifest(body, reference)
        dest_dir.parent.mkdir(parents=True, exist_ok=True)
        with _staging_beside(dest_dir) as staging:
            root = staging.resolve()
            total = 0
            for count, layer in enumerate(layers, start=1):
                total += layer.size
                BUNDLE_RULES.check_limits(count, total, reference)
                target = BUNDLE_RULES.safe_target(layer.path, root, reference, "OCI manifest")
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download(layer, target, reference)
            os.chmod(staging, 0o755)
            os.rename(staging, dest_dir)
    return str(source.pinned(digest))


def _parse_manifest(body: bytes, reference: str) -> list[_Layer]:
    try:
        document = json.loads(body)
    except ValueError:
        raise BundleError(f"not an OCI manifest (invalid JSON): {reference}") from None
    if not isinstance(document, dict):
        raise BundleError(f"not an OCI manifest: {reference}")
    media_type = document.get("mediaType")
    if media_type != MANIFEST_MEDIA_TYPE:
        raise BundleError(f"not an ortpack bundle: {reference} is a {media_type or 'manifest without mediaType'}")
    kind = document.get("artifactType") or (document.get("config") or {}).get("mediaType")
    if kind != ARTIFACT_TYPE:
        raise BundleError(f"not an ortpack bundle: {reference} has artifactType {kind!r} (expected {ARTIFACT_TYPE})")
    layers: list[_Layer] = []
    seen: set[str] = set()
    for raw in document.get("layers") or []:
        if not isinstance(raw, dict):
            raise BundleError(f"malformed layer in {reference}")
        path = (raw.get("annotations") or {}).get(TITLE)
        digest, size = raw.get("digest"), raw.get("size")
        if not isinstance(path, str) or not path:
            raise BundleError(f"layer without a {TITLE} annotation in {reference}")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise BundleError(f"layer {path} in {reference} has no sha256 digest: {digest!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BundleError(f"layer {path} in {reference} has no valid size: {size!r}")
        if path in seen:
            raise BundleError(f"duplicate path in OCI manifest: {path} ({reference})")
        seen.add(path)
        layers.append(_Layer(path=path, digest=digest, size=size))
    if not layers:
        raise BundleError(f"OCI manifest has no layers: {reference}")
    return layers


@contextmanager
def _staging_beside(dest_dir: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.pull-", dir=dest_dir.parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- transport ----------------------------------------------------------------------------


@contextmanager
def _client(ref: OciReference) -> Iterator[_Client]:
    try:
        import oras.provider  # noqa: F401
    except ImportError:
        raise RegistryError(
            "OCI registries need the oras library: install the oci extra (pip install ortpack[oci])"
        ) from None
    client = _Client(ref)
    try:
        yield client
    finally:
        client.close()


class _Client:
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

    def upload(self, path: Path, layer: _Layer, media_type: str = LAYER_MEDIA_TYPE) -> None:
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

    def download(self, layer: _Layer, target: Path, reference: str) -> None:
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
        if _sha256_digest(body) != digest:
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
