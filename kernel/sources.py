"""Fetch a bundle from where a deploy job keeps it, so the server can verify and load it.

Sources, named by a URI:

- a local directory, or `file:///abs/dir`: used in place, nothing is copied;
- a local `.tar` file, or `file:///abs/x.tar`: extracted into a fresh directory under the cache;
- `http://` or `https://` URL of a `.tar`: streamed to a temporary file under the cache
  (never held in memory), then extracted;
- `s3://bucket/key.tar`: downloaded with boto3, then extracted; `s3://bucket/prefix/` (or any
  key that is not an archive): every object under the prefix is downloaded, keeping its path
  relative to the prefix. boto3 reads the standard `AWS_*` environment variables, including
  `AWS_ENDPOINT_URL` for S3-compatible servers. `minio://bucket/...` (what Kubeflow Pipelines
  calls its artifact store) is the same, and needs `AWS_ENDPOINT_URL` (the MinIO service).
- `oci://HOST[:PORT]/REPO@sha256:...` or `oci://HOST[:PORT]/REPO:TAG`: an OCI artifact pushed by
  `ortpack bundle push` (ortpack.kernel.oci, the `oci` extra): the manifest digest is checked when the
  reference is pinned, every layer's size and sha256 always.

A tar may hold the bundle files at its root or inside one top-level directory; the returned
directory is always the one holding `manifest.json`. This module does not verify the bundle:
the caller runs `verify_bundle` on what `fetch_bundle` returns.

Safety: an archive or a bucket is untrusted input. Before anything is written we refuse absolute
paths, paths with a `..` component, paths that resolve outside the target, symbolic and hard
links, devices and FIFOs, more than 10,000 entries, more than 20 GiB of declared content (the rules
and limits are ortpack.kernel.archive's, worded by `ortpack.kernel.bundle.BUNDLE_RULES`), and more declared
content than the cache's filesystem has free; `tarfile`'s `data` filter then runs as a second line
of defence. Everything is written into a hidden temporary directory under the cache and renamed
into place only when complete, so a failed fetch leaves nothing behind. Every failure is a
one-line `BundleError` naming the URI.

The cache: an extraction is named by what it came from (`bundle-<sha256 of the archive>`,
`bundle-s3-<sha256 of the listing>`, `bundle-oci-<manifest digest>`), so repeated starts find
it. `fetch` returns a `Fetched` holding the cache directory's lock; the server verifies the
bundle, then calls `keep()` (which marks the extraction verified: the next start reuses it, and
still checks every file's sha256 before loading) or `discard()` (a failed start removes what it
extracted). An extraction never marked verified is redone. `fetch_bundle` is the plain form:
fetch, release the lock, return the directory.

The transport (http, s3, tar extraction within the rules) is ortpack.kernel.fetch's, shared with
the pipeline's model checkpoints; this module adds the cache, its lock and what a bundle is. Only
the standard library is imported here; boto3 is imported when an `s3://` URI is fetched, oras
when an `oci://` one is.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import BUNDLE_RULES, MANIFEST_NAME, BundleError, sha256_file
from ortpack.kernel.fetch import (
    BucketObject,
    Wording,
    bucket_objects,
    bucket_parts,
    download_objects,
    download_url,
    extract_archive,
    is_archive,
    listing_version,
    uri_scheme,
)
from ortpack.kernel.oci import OciReference, pull_bundle

# How a bundle fetch words its refusals (the transport is ortpack.kernel.fetch's, shared with the
# pipeline's model checkpoints)
WORDING = Wording(
    rules=BUNDLE_RULES,
    not_found=BundleError,
    unreachable=BundleError,
    missing="bundle not found: {uri} ({detail})",
    refused="{uri}: {code}",
    http_refused="cannot download {uri}: HTTP {code}",
    broken="cannot download {uri}: {detail}",
)
VERIFIED = ".verified"  # `<extraction>.verified`: the server checked every file of it
SPACE_MARGIN = 64 * 1024**2  # free space kept beyond what a bundle declares
STALE_STAGING_S = 24 * 3600  # hidden staging directories older than this were left by a killed process


@dataclass
class Fetched:
    """A fetched bundle: its directory, and the cache entry it lives in (None when used in place).

    Holds the cache directory's lock until `keep`, `discard` or `release`."""

    path: Path
    extraction: Path | None = None
    reused: bool = False  # a verified extraction from an earlier start
    lock: int | None = None

    def keep(self) -> None:
        """The bundle verified: mark the extraction so later starts reuse it."""
        if self.extraction is not None:
            _marker(self.extraction).touch()
        self.release()

    def discard(self) -> None:
        """The start failed: remove the extraction (and its mark), whatever it was."""
        if self.extraction is not None:
            _marker(self.extraction).unlink(missing_ok=True)
            shutil.rmtree(self.extraction, ignore_errors=True)
        self.release()

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)  # closing the descriptor drops the flock
            self.lock = None


def fetch_bundle(uri: str, cache_dir: Path) -> Path:
    """Return a local directory holding the bundle named by `uri` (not yet verified: the caller
    runs verify_bundle). Archives and downloads are extracted under `cache_dir` (see `fetch`)."""
    fetched = fetch(uri, cache_dir)
    fetched.release()
    return fetched.path


def fetch(uri: str, cache_dir: Path) -> Fetched:
    """The bundle named by `uri`: a directory in place, or an extraction under `cache_dir`, reused
    when an earlier start verified it. The caller verifies, then calls `keep` or `discard`."""
    cache_dir = Path(cache_dir)
    scheme = uri_scheme(uri)
    try:
        if scheme == "":
            return _fetch_local(Path(uri), uri, cache_dir)
        if scheme == "file":
            return _fetch_local(_file_uri_path(uri), uri, cache_dir)
        if scheme in ("http", "https"):
            return _locked(cache_dir, lambda: _fetch_http(uri, cache_dir))
        if scheme in ("s3", "minio"):
            return _locked(cache_dir, lambda: _fetch_s3(uri, cache_dir))
        if scheme == "oci":
            return _locked(cache_dir, lambda: _fetch_oci(uri, cache_dir))
    except OSError as exc:  # a safety net: the fetchers convert the errors they expect
        raise BundleError(f"cannot fetch {uri}: {_describe(exc)}") from None
    raise BundleError(
        f"unsupported bundle URI scheme {scheme!r} (use a directory, file://, http(s)://, s3://, minio:// or "
        f"oci://): {uri}"
    )


def _locked(cache_dir: Path, fetcher: Any) -> Fetched:
    """Run `fetcher` holding the cache directory's lock (two servers starting on one cache take
    turns: the second reuses what the first verified); the lock goes to the `Fetched`."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _remove_stale_staging(cache_dir)
        fetched: Fetched = fetcher()
    except BaseException:
        os.close(fd)
        raise
    fetched.lock = fd
    return fetched


def _marker(extraction: Path) -> Path:
    return extraction.with_name(extraction.name + VERIFIED)


def _cached(final: Path, uri: str) -> Fetched | None:
    """A verified extraction at `final`, or None (an unverified one is removed: a failed start's)."""
    if final.is_dir() and _marker(final).is_file():
        return Fetched(_bundle_root(final, uri), final, reused=True)
    _marker(final).unlink(missing_ok=True)
    shutil.rmtree(final, ignore_errors=True)
    return None


def _remove_stale_staging(cache_dir: Path) -> None:
    now = time.time()
    for entry in cache_dir.glob(".*-*"):
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def check_space(cache_dir: Path, needed: int, uri: str) -> None:
    """Refuse (one line) to write `needed` bytes where fewer are free, with a margin."""
    free = shutil.disk_usage(cache_dir).free
    if needed + SPACE_MARGIN > free:
        raise BundleError(
            f"not enough space in {cache_dir} for {uri}: {needed / 1024**2:.0f} MiB declared, "
            f"{free / 1024**2:.0f} MiB free (keeping {SPACE_MARGIN // 1024**2} MiB spare)"
        )


# --- local files --------------------------------------------------------------------------


def _file_uri_path(uri: str) -> Path:
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise BundleError(f"file URIs must name a local path (file:///abs/path): {uri}")
    return Path(urllib.parse.unquote(parts.path))


def _fetch_local(path: Path, uri: str, cache_dir: Path) -> Fetched:
    if path.is_dir():
        return Fetched(path)
    if path.is_file():
        return _locked(cache_dir, lambda: _extract_archive(path, uri, cache_dir))
    raise BundleError(f"bundle not found: {uri}")


# --- http(s) and s3 ------------------------------------------------------------------------


def _fetch_http(uri: str, cache_dir: Path) -> Fetched:
    with _staging_dir(cache_dir, ".download-") as tmp:
        archive = tmp / "bundle.tar"
        download_url(uri, archive, WORDING, before=lambda size: check_space(cache_dir, size, uri))
        return _extract_archive(archive, uri, cache_dir)


def _fetch_s3(uri: str, cache_dir: Path) -> Fetched:
    """An archive's key: downloaded, then extracted; any other key: every object under it as a
    prefix, the cache entry named by the listing (keys, sizes, ETags)."""
    if not bucket_parts(uri)[1]:
        raise BundleError(f"s3 URI has no bucket: {uri}")
    if is_archive(uri):
        objects = [BucketObject("", 0, "", bucket_parts(uri)[2])]
        with _staging_dir(cache_dir, ".download-") as tmp:
            archive = tmp / "bundle.tar"
            download_objects(uri, objects, archive, WORDING)
            return _extract_archive(archive, uri, cache_dir)
    objects = bucket_objects(uri, WORDING, prefix_only=True)
    final = cache_dir / f"bundle-s3-{listing_version(objects).removeprefix('etags:')}"
    cached = _cached(final, uri)
    if cached is not None:
        return cached
    check_space(cache_dir, sum(o.size for o in objects), uri)
    with _staging_dir(cache_dir, ".extract-") as staging:
        download_objects(uri, objects, staging.resolve(), WORDING, "s3 prefix")
        return _publish(staging, uri, final)


# --- oci -----------------------------------------------------------------------------------


def _fetch_oci(uri: str, cache_dir: Path) -> Fetched:
    """Pull an OCI artifact (ortpack.kernel.oci checks the manifest digest when pinned and every layer's
    digest); the cache entry is named by the manifest digest, so a pinned reference that an
    earlier start verified is not pulled again."""

    pinned = OciReference.parse(uri).digest
    if pinned:
        cached = _cached(cache_dir / f"bundle-oci-{pinned.removeprefix('sha256:')}", uri)
        if cached is not None:
            return cached
    staging = cache_dir / f".pull-{uuid.uuid4().hex[:16]}"
    try:
        reference = pull_bundle(uri, staging)
        digest = OciReference.parse(reference).digest or f"sha256:{uuid.uuid4().hex}"
        final = cache_dir / f"bundle-oci-{digest.removeprefix('sha256:')}"
        cached = _cached(final, uri)
        if cached is not None:
            return cached
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Fetched(_bundle_root(final, uri), final)


# --- extraction and publishing ------------------------------------------------------------


def _extract_archive(archive: Path, uri: str, cache_dir: Path) -> Fetched:
    final = cache_dir / f"bundle-{sha256_file(archive)}"
    cached = _cached(final, uri)
    if cached is not None:
        return cached
    with _staging_dir(cache_dir, ".extract-") as staging:
        extract_archive(
            archive, staging, uri, WORDING, "bundle archive", before=lambda size: check_space(cache_dir, size, uri)
        )
        return _publish(staging, uri, final)


def _bundle_root(staging: Path, uri: str) -> Path:
    """The directory holding the manifest: `staging` itself or its one top-level directory that has one."""
    if (staging / MANIFEST_NAME).is_file():
        return staging
    candidates = [p for p in staging.iterdir() if p.is_dir() and (p / MANIFEST_NAME).is_file()]
    if len(candidates) == 1:
        return candidates[0]
    raise BundleError(f"not a bundle: {uri} has no {MANIFEST_NAME} at its root or in one top-level directory")


def _publish(staging: Path, uri: str, final: Path) -> Fetched:
    """Rename the complete `staging` directory to `final`; return the bundle inside it."""
    rel = _bundle_root(staging, uri).relative_to(staging)
    os.chmod(staging, 0o755)  # mkdtemp makes it 0700: a server running as another user could not read it
    os.rename(staging, final)
    return Fetched(final / rel, final)


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
