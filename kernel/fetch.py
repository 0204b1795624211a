"""One fetcher for what a URI names: bundles (ortpack.kernel.sources) and model checkpoints
(ortpack.components.core.sources) both download through here.

- http(s): streamed to a file, never held in memory, within the caller's byte limit
  (`download_url`); the store's strong ETag and the body's sha256 come back.
- s3:// and minio:// (boto3, the `s3` extra; the endpoint is AWS_ENDPOINT_URL_S3 or
  AWS_ENDPOINT_URL, which minio:// requires), gs:// (google-cloud-storage, the `gcs` extra): the
  object a URI names, or every object under it as a prefix (`bucket_objects`), each downloaded
  to a path checked by the caller's archive rules (`download_objects`); the listing names the
  content (`listing_version`: keys, sizes and ETags/MD5s).
- tar archives: extracted within the caller's rules (ortpack.kernel.archive: limits, safe paths,
  no links or devices, then tarfile's "data" filter).

What a caller fetches into, caches and checks afterwards is its own; so is the wording of its
refusals (`Wording`: its archive rules, and its "not found" and "cannot reach" errors), because
its users and tests read them. The standard library only at import; boto3, google-cloud-storage
are imported when their scheme is fetched.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ortpack.kernel.archive import ArchiveRules, extract_tar
from ortpack.kernel.errors import one_line

HTTP_TIMEOUT_S = 60.0
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
BUCKET_SCHEMES = ("s3", "minio", "gs")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CHUNK = 1 << 20
_MISSING = ("404", "NoSuchKey", "NoSuchBucket", "NotFound")


@dataclass(frozen=True)
class Wording:
    """A caller's refusals: its archive rules (limits, unsafe paths, links: ortpack.kernel.archive),
    its errors for what does not exist and for a store that cannot be reached or refuses, and
    their messages (`str.format` templates of `{uri}`, `{code}`: an HTTP status or a store's
    error code, `{detail}`: a reason)."""

    rules: ArchiveRules
    not_found: Callable[[str], Exception]
    unreachable: Callable[[str], Exception]
    missing: str = "not found: {uri} ({detail})"  # no such object, bucket or prefix (HTTP 404)
    refused: str = "{uri}: the store refused the request ({code})"
    http_refused: str = "{uri}: HTTP {code}{detail}"  # detail: why 401/403 are refused
    no_reach: str = "cannot reach {uri}: {detail}"
    broken: str = "cannot download {uri}: {detail}"  # the transfer broke off

    def missing_error(self, uri: str, detail: str) -> Exception:
        return self.not_found(self.missing.format(uri=uri, detail=detail))

    def unreachable_error(self, template: str, uri: str, *, code: object = "", detail: str = "") -> Exception:
        return self.unreachable(template.format(uri=uri, code=code, detail=detail))


def uri_scheme(value: str) -> str:
    """The lower-case scheme of a URI, or "" for a path or a name."""
    match = _SCHEME.match(value.strip())
    return match.group(1).lower() if match else ""


# --- http(s) ------------------------------------------------------------------------------


def urlopen(url: str, wording: Wording, *, method: str = "GET", token: str | None = None) -> Any:
    """An open response for `url` (a context manager), or one line: not found (HTTP 404),
    credentials missing or refused (401, 403), another status, or unreachable."""
    request = urllib.request.Request(url, method=method)
    request.add_header("User-Agent", "ortpack")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            raise wording.missing_error(url, "HTTP 404") from None
        why = " (credentials missing or refused)" if exc.code in (401, 403) else ""
        raise wording.unreachable_error(wording.http_refused, url, code=exc.code, detail=why) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = one_line(getattr(exc, "reason", exc), 300)
        raise wording.unreachable_error(wording.no_reach, url, detail=reason) from None


def strong_etag(response: Any) -> str:
    etag = str(response.headers.get("ETag") or "")
    return etag.strip('"') if etag and not etag.startswith("W/") else ""


def copy_limited(src: IO[bytes], dst: IO[bytes] | None, source: str, rules: ArchiveRules) -> str:
    """Copy `src` to `dst` (None: read only) in chunks, refusing more than the rules' bytes; the
    sha256 of what was read."""
    digest, total = hashlib.sha256(), 0
    while block := src.read(_CHUNK):
        total += len(block)
        rules.check_limits(1, total, source)
        digest.update(block)
        if dst is not None:
            dst.write(block)
    return digest.hexdigest()


def download_url(
    url: str, target: Path, wording: Wording, *, token: str | None = None, before: Callable[[int], None] | None = None
) -> tuple[str, str]:
    """Stream `url` to `target`; return (its strong ETag or "", the sha256 of its bytes).
    `before(declared bytes)` runs first when the server declares a length (a space check)."""
    with urlopen(url, wording, token=token) as response, open(target, "wb") as out:
        declared = response.headers.get("Content-Length")
        if before is not None and declared is not None and declared.isdigit():
            before(int(declared))
        try:
            return strong_etag(response), copy_limited(response, out, url, wording.rules)
        except (OSError, http.client.HTTPException) as exc:
            raise wording.unreachable_error(wording.broken, url, detail=one_line(exc, 300)) from None


# --- buckets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketObject:
    key: str  # relative to the prefix ("" for a single object)
    size: int
    tag: str  # ETag or MD5: what the store says the content is
    name: str  # the full key


def bucket_parts(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket, key) of s3://, minio:// or gs://."""
    parts = urllib.parse.urlsplit(uri)
    return uri_scheme(uri), parts.netloc, parts.path.lstrip("/")


def s3_client(uri: str, error: Callable[[str], Exception]) -> Any:
    """A boto3 S3 client for `uri` (s3:// or minio://). The endpoint is AWS_ENDPOINT_URL_S3 or
    AWS_ENDPOINT_URL (an S3-compatible store), which minio:// requires. A missing boto3, endpoint or
    profile raises `error` with a one-line message."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise error(f"{uri} needs boto3: install the s3 extra (pip install 'ortpack[s3]')") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if uri.strip().lower().startswith("minio://") and not endpoint:
        raise error(
            f"{uri}: minio:// needs AWS_ENDPOINT_URL (the MinIO service, e.g. http://minio-service.kubeflow:9000)"
        )
    try:
        return boto3.client("s3", endpoint_url=endpoint or None)
    except BotoCoreError as exc:
        raise error(f"{uri}: {one_line(exc, 300)}") from None


@contextmanager
def s3_errors(uri: str, wording: Wording) -> Iterator[None]:
    """boto3's errors as one line: a missing bucket or key is not found, the rest unreachable."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "")) or "error"
        if code in _MISSING:
            raise wording.missing_error(uri, code) from None
        raise wording.unreachable_error(wording.refused, uri, code=code) from None
    except (BotoCoreError, Boto3Error) as exc:
        raise wording.unreachable(f"{uri}: {one_line(exc, 300)}") from None


def bucket_objects(uri: str, wording: Wording, *, prefix_only: bool = False) -> list[BucketObject]:
    """The object `uri` names, or every object under it as a prefix (with `prefix_only`, always
    the prefix), within the rules' limits. None at all is not found."""
    scheme = uri_scheme(uri)
    found = _gcs_objects(uri, wording, prefix_only) if scheme == "gs" else _s3_objects(uri, wording, prefix_only)
    if not found:
        raise wording.missing_error(uri, "no object, and nothing under it as a prefix")
    wording.rules.check_limits(len(found), sum(o.size for o in found), uri)
    return found


def listing_version(objects: list[BucketObject]) -> str:
    """`etags:<sha256>` over each object's key, size and ETag/MD5: what the store says it holds."""
    lines = sorted(f"{o.key}\t{o.size}\t{o.tag}\n" for o in objects)
    return "etags:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def download_objects(
    uri: str, objects: list[BucketObject], dest: Path, wording: Wording, what: str = "bucket prefix"
) -> None:
    """Each object to `dest / key`, the path checked by the rules first (one object named by the
    URI itself goes to `dest` as a file)."""
    scheme, bucket, _ = bucket_parts(uri)
    if scheme == "gs":
        gcs = _gcs_bucket(uri, bucket, wording)

        def download(obj: BucketObject, target: Path) -> None:
            with _gcs_errors(uri, wording):
                gcs.blob(obj.name).download_to_filename(str(target))

    else:
        client = s3_client(uri, wording.rules.error)

        def download(obj: BucketObject, target: Path) -> None:
            with s3_errors(uri, wording), open(target, "wb") as out:
                body = client.get_object(Bucket=bucket, Key=obj.name)["Body"]
                with body:
                    copy_limited(body, out, uri, wording.rules)

    for obj in objects:
        if obj.key == "":
            download(obj, dest)
            continue
        target = wording.rules.safe_target(obj.key, dest, uri, what)
        target.parent.mkdir(parents=True, exist_ok=True)
        download(obj, target)


def _s3_objects(uri: str, wording: Wording, prefix_only: bool) -> list[BucketObject]:
    from botocore.exceptions import ClientError

    _, bucket, key = bucket_parts(uri)
    client = s3_client(uri, wording.rules.error)
    with s3_errors(uri, wording):
        if key and not key.endswith("/") and not prefix_only:
            try:
                head = client.head_object(Bucket=bucket, Key=key)
                return [BucketObject("", int(head["ContentLength"]), str(head.get("ETag", "")).strip('"'), key)]
            except ClientError as exc:  # not an object: try it as a prefix below
                if str(exc.response.get("Error", {}).get("Code", "")) not in _MISSING:
                    raise
        prefix = key if not key or key.endswith("/") else key + "/"
        found: list[BucketObject] = []
        total = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if rel and not rel.endswith("/"):  # not the prefix itself, nor a "directory" marker
                    found.append(
                        BucketObject(rel, int(obj.get("Size", 0)), str(obj.get("ETag", "")).strip('"'), obj["Key"])
                    )
                    total += found[-1].size
                    wording.rules.check_limits(len(found), total, uri)
    return found


def _gcs_objects(uri: str, wording: Wording, prefix_only: bool) -> list[BucketObject]:
    _, bucket_name, key = bucket_parts(uri)
    bucket = _gcs_bucket(uri, bucket_name, wording)
    with _gcs_errors(uri, wording):
        if key and not key.endswith("/") and not prefix_only:
            blob = bucket.get_blob(key)
            if blob is not None:
                return [BucketObject("", int(blob.size or 0), str(blob.md5_hash or blob.crc32c or ""), key)]
        prefix = key if not key or key.endswith("/") else key + "/"
        return [
            BucketObject(b.name[len(prefix) :], int(b.size or 0), str(b.md5_hash or b.crc32c or ""), b.name)
            for b in bucket.list_blobs(prefix=prefix)
            if b.name[len(prefix) :] and not b.name.endswith("/")
        ]


def _gcs_bucket(uri: str, name: str, wording: Wording) -> Any:
    try:
        from google.cloud import storage
    except ImportError:
        raise wording.rules.error(
            f"{uri} needs google-cloud-storage: install the gcs extra (pip install 'ortpack[gcs]')"
        ) from None
    with _gcs_errors(uri, wording):
        return storage.Client().bucket(name)


@contextmanager
def _gcs_errors(uri: str, wording: Wording) -> Iterator[None]:
    ours: tuple[type[BaseException], ...] = tuple(
        c for c in (wording.rules.error, wording.not_found, wording.unreachable) if isinstance(c, type)
    )
    try:
        yield
    except ours:
        raise  # a refusal already worded
    except Exception as exc:  # noqa: BLE001 - google-api-core raises many types; one line each
        if type(exc).__name__ == "NotFound":
            raise wording.missing_error(uri, "NotFound") from None
        raise wording.unreachable(f"{uri}: {one_line(exc, 300)}") from None


# --- archives -----------------------------------------------------------------------------


def extract_archive(
    archive: Path,
    dest: Path,
    source: str,
    wording: Wording,
    what: str = "archive",
    before: Callable[[int], None] | None = None,
) -> list[str]:
    """Extract the tar at `archive` into `dest` within the rules (limits, safe paths, regular files
    and directories only, then tarfile's "data" filter); `before(declared bytes)` runs once the
    members are checked (a space check). Returns the names extracted. Not a tar, or anything else
    that breaks: one line of the rules' error."""

    def check(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
        members = wording.rules.checked_members(tar, dest.resolve(), source, what)
        if before is not None:
            before(sum(m.size for m in members))
        return members

    try:
        return [m.name for m in extract_tar(archive, dest, check)]
    except tarfile.ReadError:
        raise wording.rules.error(f"not a tar archive: {source}") from None
    except (tarfile.TarError, OSError) as exc:
        raise wording.rules.error(f"cannot extract {source}: {one_line(exc, 300)}") from None


def is_archive(name: str) -> bool:
    return PurePosixPath(name).name.endswith(ARCHIVE_SUFFIXES)
