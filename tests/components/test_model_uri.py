"""Models named by URI (components/core/sources.py): s3:// and minio:// against moto's S3 server,
https:// tars and hf:// against real HTTP servers on 127.0.0.1, the credentials secret, and what
is refused (pickled weights, unsafe archives, a source that changed since the run started)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ortpack.components.core.errors import SourceError, SourceUnreachableError
from ortpack.components.core.sources import (
    check_uri,
    default_name,
    fetch_source,
    load_credentials,
    parse_source_versions,
    resolve_source_versions,
    source_version,
    tree_digest,
)

CHECKPOINT = {
    "config.json": b'{"model_type": "bert"}',
    "model.safetensors": b"\x00weights" * 100,
    "tokenizer.json": b'{"version": "1.0"}',
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
}


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _tar(files: dict[str, bytes], top: str = "", links: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if top == ".":  # as `tar -C DIR -cf x.tar .` writes it: the root itself first
            info = tarfile.TarInfo(".")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if links:
            info = tarfile.TarInfo("escape")
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buffer.getvalue()


# --- form ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("hf://org/name", "needs @REVISION"),
        ("hf://just-a-name@main", "looks like hf://ORG/NAME@REVISION"),
        ("ftp://host/x.tar", "unsupported model URI scheme 'ftp'"),
        ("file:///models/x", "use a plain path"),
        ("s3:///no-bucket", "has no bucket"),
        ("s3://bucket/../up/", "may not contain '..'"),
    ],
)
def test_malformed_uris_are_refused_in_one_line(uri: str, fragment: str) -> None:
    with pytest.raises(SourceError, match=".*") as info:
        check_uri(uri)
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("s3://bucket/models/my-ckpt/", "my-ckpt"),
        ("https://host/files/ckpt.v2.tar.gz", "ckpt.v2"),
        ("hf://sentence-transformers/all-MiniLM-L6-v2@main", "all-MiniLM-L6-v2"),
        ("/mnt/models/bert base", "bert-base"),
        ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2"),
    ],
)
def test_default_bundle_name(value: str, name: str) -> None:
    assert default_name(value) == name


def test_credentials_from_the_mounted_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = _write(tmp_path / "secret", {"AWS_ACCESS_KEY_ID": b"key\n", "HF_TOKEN": b"hf", "gcs.json": b"{}"})
    (secret / "UNRELATED").write_text("x")
    monkeypatch.setenv("HF_TOKEN", "already-set")
    for name in ("AWS_ACCESS_KEY_ID", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORTPACK_CREDENTIALS_DIR", str(secret))
    assert load_credentials() == ["AWS_ACCESS_KEY_ID", "GOOGLE_APPLICATION_CREDENTIALS"]
    assert os.environ["AWS_ACCESS_KEY_ID"] == "key" and os.environ["HF_TOKEN"] == "already-set"
    assert "UNRELATED" not in os.environ
    assert load_credentials(tmp_path / "absent") == []  # the secret is optional


# --- s3 / minio ---------------------------------------------------------------------------


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("ORTPACK_CREDENTIALS_DIR", "/nonexistent")
    client = boto3.client("s3")
    bucket = f"models-{hashlib.sha256(os.urandom(8)).hexdigest()[:8]}"
    client.create_bucket(Bucket=bucket)
    client.bucket = bucket
    return client


def _upload(s3: Any, prefix: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        s3.put_object(Bucket=s3.bucket, Key=f"{prefix}{name}", Body=data)


def test_s3_prefix_is_fetched_without_its_pickled_copy(s3: Any, tmp_path: Path) -> None:
    _upload(s3, "ckpt/", {**CHECKPOINT, "pytorch_model.bin": b"pickle"})
    uri = f"s3://{s3.bucket}/ckpt/"
    version = source_version(uri)
    assert version.startswith("etags:") and source_version(f"s3://{s3.bucket}/ckpt") == version
    fetched = fetch_source(uri, tmp_path / "model", pinned=version)
    assert sorted(p.relative_to(fetched.path).as_posix() for p in fetched.path.rglob("*") if p.is_file()) == sorted(
        CHECKPOINT
    )
    assert fetched.digest == tree_digest(_write(tmp_path / "original", CHECKPOINT)) and fetched.version == version


def test_s3_content_change_changes_the_version_and_fails_a_pinned_fetch(s3: Any, tmp_path: Path) -> None:
    _upload(s3, "ckpt/", CHECKPOINT)
    uri = f"s3://{s3.bucket}/ckpt/"
    before = source_version(uri)
    _upload(s3, "ckpt/", {"model.safetensors": b"\x01other weights"})
    assert source_version(uri) != before
    with pytest.raises(SourceError, match="changed since the run started"):
        fetch_source(uri, tmp_path / "model", pinned=before)


def test_s3_tar_with_a_top_level_folder(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=s3.bucket, Key="archives/ckpt.tar.gz", Body=_tar(CHECKPOINT, top="ckpt"))
    fetched = fetch_source(f"s3://{s3.bucket}/archives/ckpt.tar.gz", tmp_path / "model")
    assert (fetched.path / "config.json").is_file() and fetched.path.name == "ckpt"


def test_s3_tar_of_a_folder_made_with_tar_dot(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=s3.bucket, Key="archives/dot.tar.gz", Body=_tar(CHECKPOINT, top="."))
    fetched = fetch_source(f"s3://{s3.bucket}/archives/dot.tar.gz", tmp_path / "model")
    assert (fetched.path / "config.json").is_file()


def test_s3_refusals(s3: Any, tmp_path: Path) -> None:
    _upload(s3, "pickled/", {"config.json": b"{}", "pytorch_model.bin": b"pickle"})
    with pytest.raises(SourceError, match="only pickled weights .*pytorch_model.bin"):
        fetch_source(f"s3://{s3.bucket}/pickled/", tmp_path / "a")
    with pytest.raises(SourceError, match="not found"):
        source_version(f"s3://{s3.bucket}/nothing/here/")
    with pytest.raises(SourceError, match="not found"):
        source_version("s3://no-such-bucket-anywhere/ckpt/")
    s3.put_object(Bucket=s3.bucket, Key="w/mnv3.pt", Body=b"pickle")
    with pytest.raises(SourceError, match="must be .safetensors"):
        fetch_source(f"s3://{s3.bucket}/w/mnv3.pt", tmp_path / "b", kind="weights")


def test_minio_is_s3_with_an_endpoint(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _upload(s3, "ckpt/", CHECKPOINT)
    assert source_version(f"minio://{s3.bucket}/ckpt/") == source_version(f"s3://{s3.bucket}/ckpt/")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with pytest.raises(SourceError, match="minio:// needs AWS_ENDPOINT_URL"):
        source_version(f"minio://{s3.bucket}/ckpt/")


def test_unreachable_store_is_an_environment_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(SourceUnreachableError):
        source_version("s3://bucket/ckpt/")


# --- http(s) and the Hub ------------------------------------------------------------------


class Files(BaseHTTPRequestHandler):
    """Static files, an optional ETag, and just enough of the Hub API (model info by revision)."""

    files: ClassVar[dict[str, bytes]] = {}
    etag: ClassVar[bool] = True
    requests: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        self.requests.append(f"{self.command} {self.path} {self.headers.get('Authorization')}")
        data = self.files.get(self.path.split("?")[0])
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        if self.etag:
            self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
        self.end_headers()
        if body:
            self.wfile.write(data)


@pytest.fixture
def http_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    Files.files, Files.etag, Files.requests = {}, True, []
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("etag", [True, False])
def test_https_tar(http_server: str, tmp_path: Path, etag: bool) -> None:
    Files.files["/files/ckpt.tar.gz"], Files.etag = _tar(CHECKPOINT), etag
    uri = f"{http_server}/files/ckpt.tar.gz"
    version = source_version(uri)
    assert version.startswith("etag:" if etag else "sha256:")
    fetched = fetch_source(uri, tmp_path / "model", pinned=version)
    assert fetched.digest == tree_digest(_write(tmp_path / "original", CHECKPOINT))
    assert not list(tmp_path.glob("*.download"))  # the archive is not left behind


def test_https_refusals(http_server: str, tmp_path: Path) -> None:
    Files.files["/bad.tar"] = _tar(CHECKPOINT, links=True)
    with pytest.raises(SourceError, match="links or devices"):
        fetch_source(f"{http_server}/bad.tar", tmp_path / "a")
    Files.files["/up.tar"] = _tar({"../outside": b"x"})
    with pytest.raises(SourceError, match="unsafe path"):
        fetch_source(f"{http_server}/up.tar", tmp_path / "b")
    assert not (tmp_path / "outside").exists()
    with pytest.raises(SourceError, match="HTTP 404"):
        fetch_source(f"{http_server}/missing.tar", tmp_path / "c")
    Files.files["/notatar.tar"] = b"plain text"
    with pytest.raises(SourceError, match="not a tar archive"):
        fetch_source(f"{http_server}/notatar.tar", tmp_path / "d")


def _hub(repo: str, sha: str, files: dict[str, bytes], revisions: tuple[str, ...] = ("main",)) -> None:
    info = json.dumps({"sha": sha, "siblings": [{"rfilename": name} for name in files]}).encode()
    for revision in (*revisions, sha):
        Files.files[f"/api/models/{repo}/revision/{revision}"] = info
    for name, data in files.items():
        Files.files[f"/{repo}/resolve/{sha}/{name}"] = data


def test_hf_revision_is_pinned_to_its_commit(http_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", http_server)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    sha = "a" * 40
    extra = {"pytorch_model.bin": b"pickle", "onnx/model.onnx": b"onnx", "tf_model.h5": b"h5"}
    _hub("org/tiny", sha, {**CHECKPOINT, **extra})
    versions = resolve_source_versions("hf://org/tiny@main")
    assert parse_source_versions(versions) == {"model": f"hf:{sha}"}
    fetched = fetch_source("hf://org/tiny@main", tmp_path / "model", pinned=f"hf:{sha}")
    assert fetched.revision == sha and fetched.digest == tree_digest(_write(tmp_path / "original", CHECKPOINT))
    downloads = [r for r in Files.requests if "/resolve/" in r]
    assert all(f"/resolve/{sha}/" in r and r.endswith("Bearer hf_secret") for r in downloads)
    assert not any(name in r for r in downloads for name in extra)  # pickles and other formats: never fetched


def test_hf_pickle_only_repository_is_refused(
    http_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", http_server)
    _hub("org/old", "b" * 40, {"config.json": b"{}", "pytorch_model.bin": b"pickle"})
    with pytest.raises(SourceError, match="only pickled weights"):
        fetch_source("hf://org/old@main", tmp_path / "model")
    assert not any("pytorch_model.bin" in r for r in Files.requests if r.startswith("GET"))
    with pytest.raises(SourceError, match="HTTP 404"):
        source_version("hf://org/missing@main")


# --- the export step ----------------------------------------------------------------------


@pytest.mark.slow
def test_export_step_records_the_uri_and_digest(tiny_bert: Path, http_server: str, tmp_path: Path) -> None:
    """The export step downloads a checkpoint tar over HTTP and writes the URI and the content's
    digest into the export record (the manifest's source)."""
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.build import export_parameters, run_export_step

    files = {p.relative_to(tiny_bert).as_posix(): p.read_bytes() for p in tiny_bert.rglob("*") if p.is_file()}
    Files.files["/tiny-bert.tar"] = _tar(files, top="tiny-bert")
    uri = f"{http_server}/tiny-bert.tar"
    out = run_export_step(
        tmp_path / "export",
        model_uri=uri,
        source_versions=resolve_source_versions(uri),
        params=export_parameters(task="text-embedding", task_options={"max_length": 32}),
    )
    record = ExportResult.load(tmp_path / "export")
    assert record.name == "tiny-bert" and out.metadata["name"] == "tiny-bert"
    assert record.source["id"] == uri and record.source["revision"] == tree_digest(tiny_bert)
    assert out.metrics["export.nodes"] > 0
