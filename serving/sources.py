"""Fetch a bundle from where a deploy job keeps it, so the server can verify and load it.

Sources, named by a URI:

- a local directory, or `file:///abs/dir`: used in place, nothing is copied;
- a local `.tar` file, or `file:///abs/x.tar`: extracted into a fresh directory under the cache;
- `http://` or `https://` URL of a `.tar`: streamed to a temporary file under the cache
  (never held in memory), then extracted;
- `s3://bucket/key.tar`: downloaded with boto3, then extracted; `s3://bucket/prefix/` (or any
  key that is not an archive): every object under the prefix is downloaded, keeping its path
  relative to the prefix. boto3 reads the standard `AWS_*` environment variables, including
  `AWS_ENDPOINT_URL` for S3-compatible servers.
- `oci://HOST[:PORT]/REPO@sha256:...` or `oci://HOST[:PORT]/REPO:TAG`: an OCI artifact pushed by
  `ortpack bundle push` (serving.oci, the `oci` extra): the manifest digest is checked when the
  reference is pinned, every layer's size and sha256 always.

A tar may hold the bundle files at its root or inside one top-level directory; the returned
directory is always the one holding `manifest.json`. This module does not verify the bundle:
the caller runs `verify_bundle` on what `fetch_bundle` returns.

Safety: an archive or a bucket is untrusted input. Before anything is written we refuse absolute
paths, paths with a `..` component, paths that resolve outside the target, symbolic and hard
links, devices and FIFOs, more than 10,000 entries and more than 20 GiB of declared content;
`tarfile`'s `data` filter then runs as a second line of defence. Everything is written into a
hidden temporary directory under the cache and renamed into place only when complete, so a
failure leaves nothing behind. Every failure is a one-line `BundleError` naming the URI.

Only the standard library is imported here; boto3 is imported when an `s3://` URI is fetched,
oras when an `oci://` one is.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Any

from serving.bundle import MANIFEST_NAME, BundleError

MAX_MEMBERS = 10_000
MAX_TOTAL_BYTES = 20 * 1024**3
HTTP_TIMEOUT_S = 60.0
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CHUNK = 1 << 20


def fetch_bundle(uri: str, cache_dir: Path) -> Path:
    """Return a local directory holding the bundle named by `uri` (not yet verified: the caller runs verify_bundle).

    Each call that has to download or extract creates a new directory under `cache_dir`.
    """
    cache_dir = Path(cache_dir)
    match = _SCHEME.match(uri)
    scheme = match.group(1).lower() if match else ""
    try:
        if scheme == "":
            return _fetch_local(Path(uri), uri, cache_dir)
        if scheme == "file":
            return _fetch_local(_file_uri_path(uri), uri, cache_dir)
        if scheme in ("http", "https"):
            return _fetch_http(uri, cache_dir)
        if scheme == "s3":
            return _fetch_s3(uri, cache_dir)
        if scheme == "oci":
            return _fetch_oci(uri, cache_dir)
    except OSError as exc:  # a safety net: the fetchers convert the errors they expect
        raise BundleError(f"cannot fetch {uri}: {_describe(exc)}") from None
    raise BundleError(
        f"unsupported bundle URI scheme {scheme!r} (use a directory, file://, http(s)://, s3:// or oci://): {uri}"
    )


# --- local files --------------------------------------------------------------------------


def _file_uri_path(uri: str) -> Path:
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise BundleError(f"file URIs must name a local path (file:///abs/path): {uri}")
    return Path(urllib.parse.unquote(parts.path))


def _fetch_local(path: Path, uri: str, cache_dir: Path) -> Path:
    if path.is_dir():
        return path
    if path.is_file():
        return _extract_archive(path, uri, cache_dir)
    raise BundleError(f"bundle not found: {uri}")


# --- http(s) ------------------------------------------------------------------------------


def _fetch_http(uri: str, cache_dir: Path) -> Path:
    with _staging_dir(cache_dir, ".download-") as tmp:
        archive = tmp / "bundle.tar"
        _download_url(uri, archive)
        return _extract_archive(archive, uri, cache_dir)


def _download_url(uri: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT_S) as response, open(dest, "wb") as out:
            _copy_limited(response, out, uri)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise BundleError(f"cannot download {uri}: HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        raise BundleError(f"cannot reach {uri}: {_describe(exc.reason)}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise BundleError(f"cannot download {uri}: {_describe(exc)}") from None


def _copy_limited(src: IO[bytes], dst: IO[bytes], uri: str) -> None:
    """Copy in chunks, refusing a download larger than the extraction limit."""
    total = 0
    while block := src.read(_CHUNK):
        total += len(block)
        if total > MAX_TOTAL_BYTES:
            raise BundleError(f"bundle archive too large: more than {_gib(MAX_TOTAL_BYTES)} from {uri}")
        dst.write(block)


# --- s3 -----------------------------------------------------------------------------------


def _fetch_s3(uri: str, cache_dir: Path) -> Path:
    bucket, key = _parse_s3_uri(uri)
    try:
        import boto3
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise BundleError(f"fetching {uri} needs boto3: install the s3 extra (pip install ortpack[s3])") from None
    try:
        client = boto3.client("s3")
        if key.endswith(ARCHIVE_SUFFIXES):
            with _staging_dir(cache_dir, ".download-") as tmp:
                archive = tmp / "bundle.tar"
                _download_object(client, bucket, key, archive, uri)
                return _extract_archive(archive, uri, cache_dir)
        return _download_prefix(client, bucket, key, uri, cache_dir)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "")) or "error"
        if code in ("404", "NoSuchKey"):
            raise BundleError(f"bundle not found: {uri}") from None
        raise BundleError(f"{uri}: {code}") from None
    except (BotoCoreError, Boto3Error) as exc:
        raise BundleError(f"{uri}: {_describe(exc)}") from None


def _parse_s3_uri(uri: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(uri)
    if not parts.netloc:
        raise BundleError(f"s3 URI has no bucket: {uri}")
    return parts.netloc, parts.path.lstrip("/")


def _download_object(client: Any, bucket: str, key: str, dest: Path, uri: str) -> None:
    """Stream one object to `dest` (GetObject, unlike HeadObject, says which of bucket or key is missing)."""
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    with body, open(dest, "wb") as out:
        _copy_limited(body, out, uri)


def _download_prefix(client: Any, bucket: str, key: str, uri: str, cache_dir: Path) -> Path:
    prefix = key if key == "" or key.endswith("/") else key + "/"
    with _staging_dir(cache_dir, ".extract-") as staging:
        root = staging.resolve()
        count = total = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if rel == "" or rel.endswith("/"):  # the prefix itself, or a "directory" marker
                    continue
                count, total = count + 1, total + int(obj.get("Size", 0))
                _check_limits(count, total, uri)
                target = _safe_target(rel, root, uri, "s3 prefix")
                target.parent.mkdir(parents=True, exist_ok=True)
                _download_object(client, bucket, obj["Key"], target, uri)
        if count == 0:
            raise BundleError(f"bundle not found: {uri}")
        return _publish(staging, uri, cache_dir)


# --- oci -----------------------------------------------------------------------------------


def _fetch_oci(uri: str, cache_dir: Path) -> Path:
    """Pull an OCI artifact (serving.oci checks the manifest digest when pinned and every layer's digest)."""
    from serving.oci import pull_bundle

    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / f"bundle-{uuid.uuid4().hex[:16]}"
    pull_bundle(uri, final)
    return _bundle_root(final, uri)


# --- extraction and publishing ------------------------------------------------------------


def _extract_archive(archive: Path, uri: str, cache_dir: Path) -> Path:
    with _staging_dir(cache_dir, ".extract-") as staging:
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = _checked_members(tar, staging.resolve(), uri)
                tar.extractall(staging, members=members, filter="data")
        except tarfile.ReadError:
            raise BundleError(f"not a tar archive: {uri}") from None
        except (tarfile.TarError, OSError) as exc:
            raise BundleError(f"cannot extract {uri}: {_describe(exc)}") from None
        return _publish(staging, uri, cache_dir)


def _checked_members(tar: tarfile.TarFile, root: Path, uri: str) -> list[tarfile.TarInfo]:
    """Every member of `tar`, after checking each against the safety rules and the limits."""
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in tar:
        members.append(member)
        total += member.size
        _check_limits(len(members), total, uri)
        _safe_target(member.name, root, uri, "bundle archive")
        if member.issym() or member.islnk():
            raise BundleError(f"links are not allowed in bundle archives: {member.name} -> {member.linkname} ({uri})")
        if not (member.isfile() or member.isdir()):
            raise BundleError(f"special files are not allowed in bundle archives: {member.name} ({uri})")
    return members


def _safe_target(name: str, root: Path, uri: str, where: str) -> Path:
    """`root / name`, refusing absolute paths, `..` components and anything resolving outside `root`."""
    pure = PurePosixPath(name)
    target = root / pure
    if pure.is_absolute() or ".." in pure.parts or not target.resolve().is_relative_to(root):
        raise BundleError(f"unsafe path in {where}: {name} ({uri})")
    return target


def _check_limits(count: int, total_bytes: int, uri: str) -> None:
    if count > MAX_MEMBERS:
        raise BundleError(f"too many entries in bundle: more than {MAX_MEMBERS} ({uri})")
    if total_bytes > MAX_TOTAL_BYTES:
        raise BundleError(f"bundle too large: more than {_gib(MAX_TOTAL_BYTES)} declared ({uri})")


def _bundle_root(staging: Path, uri: str) -> Path:
    """The directory holding the manifest: `staging` itself or its one top-level directory that has one."""
    if (staging / MANIFEST_NAME).is_file():
        return staging
    candidates = [p for p in staging.iterdir() if p.is_dir() and (p / MANIFEST_NAME).is_file()]
    if len(candidates) == 1:
        return candidates[0]
    raise BundleError(f"not a bundle: {uri} has no {MANIFEST_NAME} at its root or in one top-level directory")


def _publish(staging: Path, uri: str, cache_dir: Path) -> Path:
    """Rename the complete `staging` directory into place; return the bundle directory inside it."""
    rel = _bundle_root(staging, uri).relative_to(staging)
    final = cache_dir / f"bundle-{uuid.uuid4().hex[:16]}"
    os.chmod(staging, 0o755)  # mkdtemp makes it 0700: a server running as another user could not read it
    os.rename(staging, final)
    return final / rel


@contextmanager
def _staging_dir(cache_dir: Path, prefix: str) -> Iterator[Path]:
    """A fresh hidden directory under `cache_dir`, removed on exit unless it was renamed away."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=cache_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- messages -----------------------------------------------------------------------------


def _describe(err: object) -> str:
    """A one-line reason: an OSError's strerror when it has one, else its text, else its type."""
    text = getattr(err, "strerror", None) if isinstance(err, OSError) else None
    text = text or str(err) or type(err).__name__
    return " ".join(text.split())


def _gib(n: int) -> str:
    return f"{n / 1024**3:g} GiB"
