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

Transport: ortpack.kernel.registry (the `oras` library's registry client, the `oci` extra; HTTP
for registries on this machine, HTTPS for others; credentials from `ORTPACK_REGISTRY_USERNAME` /
`ORTPACK_REGISTRY_PASSWORD` or the Docker config).

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
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import BUNDLE_RULES, BundleError, sha256_file, verify_bundle
from ortpack.kernel.registry import (
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    MAX_MANIFEST_BYTES,
    SCHEME,
    SHA256,
    Layer,
    OciReference,
    RegistryClient,
    open_client,
    sha256_digest,
)

ARTIFACT_TYPE = "application/vnd.ortpack.bundle.v1+json"
EMPTY_CONFIG_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # of b"{}"
EMPTY_CONFIG = {"mediaType": "application/vnd.oci.empty.v1+json", "digest": EMPTY_CONFIG_DIGEST, "size": 2}
TITLE = "org.opencontainers.image.title"
ANNOTATION_PREFIX = "dev.ortpack.bundle."


def is_oci_reference(uri: str) -> bool:
    return uri.startswith(SCHEME)


# --- push ---------------------------------------------------------------------------------


def push_bundle(bundle_dir: Path, reference: str) -> str:
    """Push every file of `bundle_dir` to `oci://HOST[:PORT]/REPO:TAG`; return `oci://HOST[:PORT]/REPO@sha256:...`.

    The bundle is verified first (`verify_bundle`); the registry checks each upload against its
    digest. Without a tag the manifest is pushed by digest only.
    """

    bundle_dir = Path(bundle_dir)
    target = OciReference.parse(reference)
    if target.digest:
        raise BundleError(f"push to a tag (oci://HOST/REPO:TAG), not a digest: {reference}")
    manifest = verify_bundle(bundle_dir)
    layers = _bundle_layers(bundle_dir, manifest.files)
    body = _encode_manifest(layers, _annotations(manifest))
    digest = sha256_digest(body)
    with open_client(target) as client:
        for layer in layers:
            client.upload(bundle_dir / layer.path, layer)
        client.upload_bytes(b"{}", EMPTY_CONFIG_DIGEST)
        client.put_manifest(target.tag or digest, body, digest)
    return str(target.pinned(digest))


def _bundle_layers(bundle_dir: Path, listed: Mapping[str, Any]) -> list[Layer]:
    """One layer per regular file; digests from manifest.json where listed (verified just before), else hashed."""

    layers: list[Layer] = []
    for dirpath, dirnames, filenames in os.walk(bundle_dir):
        for name in [*dirnames, *filenames]:
            if (Path(dirpath) / name).is_symlink():
                raise BundleError(f"links cannot be pushed: {(Path(dirpath) / name).relative_to(bundle_dir)}")
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(bundle_dir).as_posix()
            entry = listed.get(rel)
            sha = entry.sha256 if entry is not None else sha256_file(path)
            layers.append(Layer(path=rel, digest=f"sha256:{sha}", size=path.stat().st_size))
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


def _encode_manifest(layers: list[Layer], annotations: dict[str, str]) -> bytes:
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

    bundle_dir = Path(bundle_dir)
    target = OciReference.parse(reference)
    if target.digest:
        raise BundleError(f"push to a tag (oci://HOST/REPO:TAG), not a digest: {reference}")
    manifest = verify_bundle(bundle_dir)
    files = _bundle_layers(bundle_dir, manifest.files)
    base_layers: list[dict[str, Any]] = []
    config: dict[str, Any] = {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers"}}
    diff_ids: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ortpack-modelcar-") as tmp, open_client(target) as client:
        if base:
            base_ref = OciReference.parse(base)
            with open_client(base_ref) as source:
                base_manifest, config = _image_manifest(source, base_ref)
                diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
                for layer in base_manifest.get("layers") or []:
                    _copy_blob(source, client, layer, Path(tmp))
                    base_layers.append(layer)
        layers = []
        for tar_path, digest, size in _modelcar_layers(bundle_dir, files, Path(tmp)):
            client.upload(tar_path, Layer(path=tar_path.name, digest=digest, size=size), TAR_LAYER_MEDIA_TYPE)
            layers.append({"mediaType": TAR_LAYER_MEDIA_TYPE, "digest": digest, "size": size})
            diff_ids.append(digest)  # uncompressed: the layer's digest is its diff_id
        config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
        config.setdefault("config", {}).setdefault("Labels", {})
        config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **_annotations(manifest)}
        config_body = json.dumps(config, sort_keys=True).encode()
        config_digest = sha256_digest(config_body)
        client.upload_bytes(config_body, config_digest)
        document = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": IMAGE_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config_body)},
            "layers": [*base_layers, *layers],
            "annotations": _annotations(manifest),
        }
        body = json.dumps(document, indent=2).encode()
        digest = sha256_digest(body)
        client.put_manifest(target.tag or digest, body, digest)
    return str(target.pinned(digest))


def _modelcar_layers(bundle_dir: Path, files: list[Layer], tmp: Path) -> Iterator[tuple[Path, str, int]]:
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


def _image_manifest(client: RegistryClient, ref: OciReference) -> tuple[dict[str, Any], dict[str, Any]]:
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
    if not SHA256.match(str(config_digest)):
        raise BundleError(f"base image {ref} has no config")
    return document, json.loads(client.get_blob(config_digest, MAX_MANIFEST_BYTES))


def _copy_blob(source: RegistryClient, target: RegistryClient, layer: dict[str, Any], tmp: Path) -> None:
    """Copy one blob between repositories (registries), through a file, digest-checked."""
    digest, size = str(layer.get("digest", "")), layer.get("size")
    if not SHA256.match(digest) or not isinstance(size, int):
        raise BundleError(f"base image layer without a sha256 digest and size: {layer}")
    path = tmp / digest.replace(":", "-")
    blob = Layer(path=path.name, digest=digest, size=size)
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
    with open_client(source) as client:
        body = client.get_manifest(source.reference)
        digest = sha256_digest(body)
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


def _parse_manifest(body: bytes, reference: str) -> list[Layer]:
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
    layers: list[Layer] = []
    seen: set[str] = set()
    for raw in document.get("layers") or []:
        if not isinstance(raw, dict):
            raise BundleError(f"malformed layer in {reference}")
        path = (raw.get("annotations") or {}).get(TITLE)
        digest, size = raw.get("digest"), raw.get("size")
        if not isinstance(path, str) or not path:
            raise BundleError(f"layer without a {TITLE} annotation in {reference}")
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise BundleError(f"layer {path} in {reference} has no sha256 digest: {digest!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BundleError(f"layer {path} in {reference} has no valid size: {size!r}")
        if path in seen:
            raise BundleError(f"duplicate path in OCI manifest: {path} ({reference})")
        seen.add(path)
        layers.append(Layer(path=path, digest=digest, size=size))
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
