"""Fetching bundles: local dirs and tars, http(s) from a real local server, s3 from moto's server, and hostile tars."""

from __future__ import annotations

import functools
import io
import re
import socket
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ortpack.kernel.archive import BUNDLE_MAX_MEMBERS as MAX_MEMBERS
from ortpack.kernel.bundle import BundleError, verify_bundle, write_bundle
from ortpack.kernel.sources import fetch, fetch_bundle
from tests.models import minimal_manifest


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    model = tmp_path / "src" / "model.onnx"
    model.write_bytes(b"not really onnx, but bytes to checksum")
    tok = tmp_path / "src" / "tokenizer.json"
    tok.write_text("{}")
    out = tmp_path / "bundle"
    write_bundle(out, minimal_manifest(), {"variants/cpu-fp32/model.onnx": model, "tokenizer.json": tok})
    return out


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _tar(bundle: Path, dest: Path, top: str | None = None) -> Path:
    """Tar the bundle's files, at the archive root or under one top-level directory `top`."""
    with tarfile.open(dest, "w") as tar:
        for path in sorted(bundle.rglob("*")):
            rel = path.relative_to(bundle).as_posix()
            tar.add(path, arcname=f"{top}/{rel}" if top else rel, recursive=False)
    return dest


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --- local --------------------------------------------------------------------------------


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_directory_is_used_in_place(bundle: Path, cache: Path, as_uri: bool) -> None:
    uri = bundle.as_uri() if as_uri else str(bundle)
    got = fetch_bundle(uri, cache)
    assert got == bundle
    assert verify_bundle(got).name == "demo"
    assert _leftovers(cache) == []


@pytest.mark.parametrize("top", [None, "demo-3"], ids=["files-at-root", "top-level-dir"])
@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_local_tar_is_extracted(bundle: Path, cache: Path, tmp_path: Path, top: str | None, as_uri: bool) -> None:
    archive = _tar(bundle, tmp_path / "bundle.tar", top)
    got = fetch_bundle(archive.as_uri() if as_uri else str(archive), cache)
    assert verify_bundle(got).name == "demo"
    assert got.is_relative_to(cache)
    assert got.name == (top or got.name)
    assert [name for name in _leftovers(cache) if name.startswith(".")] == []


def test_missing_path(tmp_path: Path, cache: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(BundleError, match=f"^bundle not found: {re.escape(str(missing))}$"):
        fetch_bundle(str(missing), cache)
    with pytest.raises(BundleError, match="^bundle not found: file://"):
        fetch_bundle(missing.as_uri(), cache)


def test_not_a_tar(tmp_path: Path, cache: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar archive at all\n" * 100)
    with pytest.raises(BundleError, match=f"^not a tar archive: {re.escape(str(junk))}$"):
        fetch_bundle(str(junk), cache)
    assert _leftovers(cache) == []


def test_tar_without_manifest(tmp_path: Path, cache: Path) -> None:
    archive = tmp_path / "empty.tar"
    with tarfile.open(archive, "w") as tar:
        _add_bytes(tar, "readme.txt", b"hello")
    with pytest.raises(BundleError, match="^not a bundle: .* has no manifest.json"):
        fetch_bundle(str(archive), cache)
    assert _leftovers(cache) == []


def test_unsupported_scheme(cache: Path) -> None:
    with pytest.raises(BundleError, match=r"^unsupported bundle URI scheme 'ftp' \(use a directory"):
        fetch_bundle("ftp://example.com/b.tar", cache)


# --- the cache: one verified extraction per archive digest --------------------------------


def test_a_verified_extraction_is_reused_and_an_unverified_one_redone(
    bundle: Path, tmp_path: Path, cache: Path
) -> None:
    archive = _tar(bundle, tmp_path / "bundle.tar", "demo-3")
    first = fetch(str(archive), cache)
    assert first.extraction is not None and not first.reused
    assert first.extraction.name.startswith("bundle-") and len(first.extraction.name) == len("bundle-") + 64
    first.release()  # not verified: the next fetch does not trust it
    (first.path / "tokenizer.json").write_text("tampered")
    again = fetch(str(archive), cache)
    assert not again.reused and (again.path / "tokenizer.json").read_text() == "{}"  # extracted anew
    again.keep()  # verified by the server
    reused = fetch(str(archive), cache)
    reused.release()
    assert reused.reused and reused.path == again.path
    assert _leftovers(cache) == [again.extraction.name, again.extraction.name + ".verified"]  # type: ignore[union-attr]
    other = _tar(bundle, tmp_path / "other.tar")  # other bytes, another entry
    fetch(str(other), cache).discard()
    assert len(_leftovers(cache)) == 2


def test_discard_removes_the_extraction_and_its_mark(bundle: Path, tmp_path: Path, cache: Path) -> None:
    archive = _tar(bundle, tmp_path / "bundle.tar")
    fetched = fetch(str(archive), cache)
    fetched.keep()
    fetched = fetch(str(archive), cache)
    fetched.discard()  # e.g. a reused copy failed its checksums: a failed start leaves nothing
    assert _leftovers(cache) == []
    directory = fetch(str(bundle), cache)
    directory.discard()  # a directory used in place is never removed
    assert directory.path == bundle and (bundle / "manifest.json").is_file()


def test_not_enough_space_is_refused_before_extracting(
    bundle: Path, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filesystem's free space (faked here: a nearly full disk) against what the archive declares."""
    import shutil
    from collections import namedtuple

    archive = tmp_path / "big.tar"
    with tarfile.open(archive, "w") as tar:
        _add_bytes(tar, "manifest.json", b"{}")
        _add_bytes(tar, "blob.bin", b"\0" * (2 * 1024 * 1024))
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(real(path).total, 0, 65 * 1024**2))
    with pytest.raises(BundleError, match="^not enough space in .* 2 MiB declared, 65 MiB free"):
        fetch_bundle(str(archive), cache)
    assert _leftovers(cache) == []


# --- hostile archives ---------------------------------------------------------------------


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    tar.addfile(info)


_HOSTILE = {
    "dotdot": (lambda t: _add_bytes(t, "../evil.txt", b"x"), r"^unsafe path in bundle archive: \.\./evil\.txt "),
    "absolute": (lambda t: _add_bytes(t, "/tmp/evil.txt", b"x"), r"^unsafe path in bundle archive: /tmp/evil\.txt "),
    "symlink": (
        lambda t: _add_link(t, "evil", "/etc/passwd", tarfile.SYMTYPE),
        r"^links are not allowed in bundle archives: evil -> /etc/passwd ",
    ),
    "hardlink": (
        lambda t: _add_link(t, "evil", "manifest.json", tarfile.LNKTYPE),
        r"^links are not allowed in bundle archives: evil -> manifest\.json ",
    ),
}


@pytest.mark.parametrize("kind", list(_HOSTILE))
def test_hostile_tar_is_refused(bundle: Path, tmp_path: Path, cache: Path, kind: str) -> None:
    add_evil, message = _HOSTILE[kind]
    archive = _tar(bundle, tmp_path / "evil.tar")
    with tarfile.open(archive, "a") as tar:
        add_evil(tar)
    with pytest.raises(BundleError, match=message) as err:
        fetch_bundle(str(archive), cache)
    assert "\n" not in str(err.value)
    assert str(archive) in str(err.value)
    assert _leftovers(cache) == []
    assert not (tmp_path / "evil.txt").exists()


def test_too_many_members(tmp_path: Path, cache: Path) -> None:
    archive = tmp_path / "many.tar"
    with tarfile.open(archive, "w") as tar:
        for i in range(MAX_MEMBERS + 1):
            _add_bytes(tar, f"f{i}", b"")
    with pytest.raises(BundleError, match="^too many entries in bundle"):
        fetch_bundle(str(archive), cache)
    assert _leftovers(cache) == []


def test_huge_declared_size(tmp_path: Path, cache: Path) -> None:
    info = tarfile.TarInfo("huge.bin")
    info.size = 21 * 1024**3  # only the header is written: the limit must trip before any data is read
    archive = tmp_path / "huge.tar"
    archive.write_bytes(info.tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024)
    with pytest.raises(BundleError, match="^bundle too large"):
        fetch_bundle(str(archive), cache)
    assert _leftovers(cache) == []


# --- http ---------------------------------------------------------------------------------


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A real HTTP server on a free port serving files from a fresh directory: (base URL, directory)."""
    _no_proxy(monkeypatch)
    root = tmp_path / "www"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("top", [None, "demo-3"], ids=["files-at-root", "top-level-dir"])
def test_http_tar(bundle: Path, cache: Path, http_root: tuple[str, Path], top: str | None) -> None:
    base, root = http_root
    _tar(bundle, root / "bundle.tar", top)
    got = fetch_bundle(f"{base}/bundle.tar", cache)
    assert verify_bundle(got).name == "demo"
    assert [name for name in _leftovers(cache) if name.startswith(".")] == []  # temp download removed


def test_http_404(cache: Path, http_root: tuple[str, Path]) -> None:
    uri = f"{http_root[0]}/missing.tar"
    with pytest.raises(BundleError, match=f"^bundle not found: {re.escape(uri)} \\(HTTP 404\\)$"):
        fetch_bundle(uri, cache)
    assert _leftovers(cache) == []


def test_http_closed_port(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_proxy(monkeypatch)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    uri = f"http://127.0.0.1:{port}/bundle.tar"
    with pytest.raises(BundleError, match=f"^cannot reach {re.escape(uri)}: .*refused"):
        fetch_bundle(uri, cache)
    assert _leftovers(cache) == []


# --- s3 -----------------------------------------------------------------------------------


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 client for moto's server; the same AWS_* environment is what fetch_bundle sees."""
    import boto3

    _no_proxy(monkeypatch)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return boto3.client("s3")


def test_s3_tar_and_prefix(bundle: Path, tmp_path: Path, cache: Path, s3: Any) -> None:
    s3.create_bucket(Bucket="bundles")
    s3.upload_file(str(_tar(bundle, tmp_path / "bundle.tar", "demo-3")), "bundles", "demo/3.tar")
    for path in bundle.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "bundles", f"demo/3/{path.relative_to(bundle).as_posix()}")

    from_tar = fetch_bundle("s3://bundles/demo/3.tar", cache)
    assert verify_bundle(from_tar).name == "demo"
    for uri in ("s3://bundles/demo/3/", "s3://bundles/demo/3"):
        from_prefix = fetch_bundle(uri, cache)
        assert verify_bundle(from_prefix).name == "demo"
        assert sorted(p.relative_to(from_prefix).as_posix() for p in from_prefix.rglob("*") if p.is_file()) == [
            "manifest.json",
            "tokenizer.json",
            "variants/cpu-fp32/model.onnx",
        ]
    assert [name for name in _leftovers(cache) if name.startswith(".")] == []


def test_minio_is_s3_with_an_endpoint(
    bundle: Path, tmp_path: Path, cache: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kubeflow's artifact store URIs (minio://mlpipeline/v2/artifacts/...) read as S3."""
    s3.create_bucket(Bucket="mlpipeline")
    s3.upload_file(str(_tar(bundle, tmp_path / "bundle.tar", "demo-3")), "mlpipeline", "v2/artifacts/bundle.tar")
    assert verify_bundle(fetch_bundle("minio://mlpipeline/v2/artifacts/bundle.tar", cache)).name == "demo"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with pytest.raises(BundleError, match="minio:// needs AWS_ENDPOINT_URL"):
        fetch_bundle("minio://mlpipeline/v2/artifacts/other.tar", cache)


def test_s3_errors(cache: Path, s3: Any) -> None:
    with pytest.raises(BundleError, match=r"^bundle not found: s3://no-such-bucket/x.tar \(NoSuchBucket\)$"):
        fetch_bundle("s3://no-such-bucket/x.tar", cache)
    with pytest.raises(BundleError, match=r"^bundle not found: s3://no-such-bucket/prefix/ \(NoSuchBucket\)$"):
        fetch_bundle("s3://no-such-bucket/prefix/", cache)
    s3.create_bucket(Bucket="empty")
    with pytest.raises(BundleError, match=r"^bundle not found: s3://empty/x.tar \(NoSuchKey\)$"):
        fetch_bundle("s3://empty/x.tar", cache)
    with pytest.raises(BundleError, match=r"^bundle not found: s3://empty/prefix/ \(no object"):
        fetch_bundle("s3://empty/prefix/", cache)
    assert _leftovers(cache) == []


def test_s3_key_escaping_the_prefix_is_refused(cache: Path, s3: Any) -> None:
    s3.create_bucket(Bucket="hostile")
    s3.put_object(Bucket="hostile", Key="b/manifest.json", Body=b"{}")
    s3.put_object(Bucket="hostile", Key="b/../../evil.txt", Body=b"x")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="hostile", Prefix="b/")["Contents"]]
    assert "b/../../evil.txt" in keys
    with pytest.raises(BundleError, match=r"^unsafe path in s3 prefix: \.\./\.\./evil\.txt "):
        fetch_bundle("s3://hostile/b/", cache)
    assert _leftovers(cache) == []
