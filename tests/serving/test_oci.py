"""OCI registries as bundle stores: a real registry (Debian's docker-registry) on 127.0.0.1, real pushes and pulls."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ortpack.kernel.bundle import BundleError, verify_bundle
from ortpack.kernel.oci import ARTIFACT_TYPE, TITLE, pull_bundle, push_bundle
from ortpack.kernel.registry import OciReference, RegistryError
from ortpack.kernel.signing import sign_bundle, verify_signature
from ortpack.kernel.sources import fetch_bundle
from tests.cli import assert_one_line_error, ortpack
from tests.registry import Credentials, Registry, oci_registry, start_registry, stop_registry
from tests.servers import running_server
from tests.signed import make_bundle, make_key_pair, tamper_and_rehash

__all__ = ["oci_registry"]  # the fixture, imported from tests/registry.py

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _manifest(registry: Registry, repository: str, reference: str) -> dict:
    url = f"http://{registry.host}/v2/{repository}/manifests/{reference}"
    return httpx.get(url, headers={"Accept": OCI_MANIFEST}).json()


@pytest.fixture
def signed_bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A small signed bundle whose model bytes are unique to the test (blobs are shared across repos)."""
    bundle = make_bundle(tmp_path, model=os.urandom(2048))
    private, public = make_key_pair(tmp_path)
    sign_bundle(bundle, private)
    return bundle, public


def test_references_parse_and_print() -> None:
    ref = OciReference.parse("oci://127.0.0.1:5000/ortpack/minilm:v1")
    assert (ref.host, ref.repository, ref.tag, ref.digest, ref.insecure) == (
        "127.0.0.1:5000",
        "ortpack/minilm",
        "v1",
        None,
        True,
    )
    pinned = OciReference.parse("oci://registry.example.com/a/b/c@sha256:" + "ab" * 32)
    assert not pinned.insecure and pinned.reference == "sha256:" + "ab" * 32 and str(pinned).endswith("ab")
    assert OciReference.parse("oci://localhost/x:1").insecure
    for bad in ("oci://host/UPPER:1", "oci://host/x@sha256:short", "oci://host", "s3://b/k", "oci://host/x/../y:1"):
        with pytest.raises(BundleError):
            OciReference.parse(bad)


def test_push_then_pull_by_digest_and_by_tag(
    oci_registry: Registry, signed_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, public = signed_bundle
    pinned = push_bundle(bundle, oci_registry.url("ortpack/demo:3"))
    ref = OciReference.parse(pinned)
    assert ref.digest is not None and ref.tag is None and pinned.startswith(oci_registry.url("ortpack/demo@sha256:"))

    document = _manifest(oci_registry, "ortpack/demo", "3")
    assert document["artifactType"] == ARTIFACT_TYPE
    assert document["annotations"]["dev.ortpack.bundle.name"] == "demo"
    assert document["annotations"]["dev.ortpack.bundle.version"] == "3"
    assert document["annotations"]["dev.ortpack.bundle.task"] == "text-embedding"
    assert document["annotations"]["dev.ortpack.bundle.variants"] == "cpu-fp32"
    layers = {layer["annotations"][TITLE]: layer for layer in document["layers"]}
    assert sorted(layers) == sorted(_files(bundle))
    manifest = verify_bundle(bundle)
    for rel, entry in manifest.files.items():  # the layer digests are the manifest.json checksums
        assert layers[rel]["digest"] == f"sha256:{entry.sha256}" and layers[rel]["size"] == entry.bytes

    out = tmp_path / "pulled"
    assert pull_bundle(pinned, out) == pinned
    assert _files(out) == _files(bundle)
    assert out.stat().st_mode & 0o777 == 0o755
    verify_bundle(out)
    verify_signature(out, public)

    assert pull_bundle(oci_registry.url("ortpack/demo:3"), tmp_path / "by-tag") == pinned
    assert _files(tmp_path / "by-tag") == _files(bundle)
    with pytest.raises(BundleError, match="output directory exists"):
        pull_bundle(pinned, out)
    assert push_bundle(bundle, oci_registry.url("ortpack/demo:3")) == pinned  # same bytes, same digest


def test_wrong_digest_or_tag_is_refused(
    oci_registry: Registry, signed_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = signed_bundle
    pinned = push_bundle(bundle, oci_registry.url("ortpack/digests:1"))
    other = pinned[: -len("0000")] + ("0000" if not pinned.endswith("0000") else "1111")
    with pytest.raises(BundleError, match="bundle not found"):
        pull_bundle(other, tmp_path / "a")
    with pytest.raises(BundleError, match="bundle not found"):
        pull_bundle(oci_registry.url("ortpack/digests:nope"), tmp_path / "b")
    # the registry answers for the digest with other bytes: its stored manifest was altered
    manifest_blob = oci_registry.blob_path(OciReference.parse(pinned).reference)
    manifest_blob.write_bytes(manifest_blob.read_bytes().replace(b'"demo"', b'"evil"'))
    with pytest.raises(BundleError, match="manifest digest mismatch"):
        pull_bundle(pinned, tmp_path / "c")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("bundle", "src")) == [
        "key.pem",
        "key.pub.pem",
    ]


def test_corrupted_blob_in_registry_storage_is_refused(
    oci_registry: Registry, signed_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = signed_bundle
    pinned = push_bundle(bundle, oci_registry.url("ortpack/corrupt:1"))
    model = verify_bundle(bundle).files["variants/cpu-fp32/model.onnx"]
    blob = oci_registry.blob_path(f"sha256:{model.sha256}")
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF  # same size, other bytes
    blob.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="layer digest mismatch for variants/cpu-fp32/model.onnx"):
        pull_bundle(pinned, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(BundleError, match="layer digest mismatch"):
        fetch_bundle(pinned, tmp_path / "cache")


def _put_manifest(registry: Registry, repository: str, tag: str, document: dict) -> str:
    body = json.dumps(document).encode()
    url = f"http://{registry.host}/v2/{repository}/manifests/{tag}"
    answer = httpx.put(url, content=body, headers={"Content-Type": OCI_MANIFEST})
    assert answer.status_code == 201, answer.text
    return registry.url(f"{repository}:{tag}")


def test_hostile_manifests_are_refused(
    oci_registry: Registry, signed_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = signed_bundle
    push_bundle(bundle, oci_registry.url("ortpack/hostile:good"))
    good = _manifest(oci_registry, "ortpack/hostile", "good")

    escaping = json.loads(json.dumps(good))
    escaping["layers"][0]["annotations"][TITLE] = "../../outside.txt"
    with pytest.raises(BundleError, match=r"unsafe path in OCI manifest: \.\./\.\./outside\.txt"):
        pull_bundle(_put_manifest(oci_registry, "ortpack/hostile", "escape", escaping), tmp_path / "a")
    absolute = json.loads(json.dumps(good))
    absolute["layers"][0]["annotations"][TITLE] = "/etc/cron.d/x"
    with pytest.raises(BundleError, match="unsafe path"):
        pull_bundle(_put_manifest(oci_registry, "ortpack/hostile", "absolute", absolute), tmp_path / "b")
    twice = json.loads(json.dumps(good))
    twice["layers"][1]["annotations"][TITLE] = twice["layers"][0]["annotations"][TITLE]
    with pytest.raises(BundleError, match="duplicate path"):
        pull_bundle(_put_manifest(oci_registry, "ortpack/hostile", "twice", twice), tmp_path / "c")
    foreign = json.loads(json.dumps(good))
    foreign["artifactType"] = "application/vnd.example.other+json"
    with pytest.raises(BundleError, match="not an ortpack bundle"):
        pull_bundle(_put_manifest(oci_registry, "ortpack/hostile", "foreign", foreign), tmp_path / "d")
    assert not (tmp_path.parent / "outside.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name in "abcd") == []


def test_unreachable_registry_fails_fast_in_one_line(signed_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    from tests.servers import free_port

    bundle, _ = signed_bundle
    reference = f"oci://127.0.0.1:{free_port()}/ortpack/demo:1"
    start = time.monotonic()
    with pytest.raises(RegistryError, match="cannot reach registry 127.0.0.1:[0-9]+: connection refused"):
        push_bundle(bundle, reference)
    with pytest.raises(RegistryError, match="cannot reach registry"):
        pull_bundle(reference, tmp_path / "out")
    with pytest.raises(BundleError, match=f"cannot fetch {reference}: cannot reach registry"):
        fetch_bundle(reference, tmp_path / "cache")
    assert time.monotonic() - start < 60  # oras' own retries would sleep for minutes


@pytest.mark.slow
def test_registry_with_credentials(
    signed_bundle: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, _ = signed_bundle
    monkeypatch.setenv("HOME", str(tmp_path))  # no docker config with credentials of this machine's user
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    registry, process = start_registry(tmp_path / "private-registry", Credentials("ortpack", "correct horse"))
    try:
        reference = registry.url("ortpack/private:1")
        with pytest.raises(RegistryError, match="needs credentials: set ORTPACK_REGISTRY_USERNAME"):
            push_bundle(bundle, reference)
        monkeypatch.setenv("ORTPACK_REGISTRY_USERNAME", "ortpack")
        monkeypatch.setenv("ORTPACK_REGISTRY_PASSWORD", "wrong")
        with pytest.raises(RegistryError, match="refused access"):
            push_bundle(bundle, reference)
        monkeypatch.setenv("ORTPACK_REGISTRY_PASSWORD", "correct horse")
        pinned = push_bundle(bundle, reference)
        pull_bundle(pinned, tmp_path / "out")
        assert _files(tmp_path / "out") == _files(bundle)
        # credentials from the docker config, as `docker login` writes them
        import base64

        monkeypatch.delenv("ORTPACK_REGISTRY_USERNAME")
        monkeypatch.delenv("ORTPACK_REGISTRY_PASSWORD")
        (tmp_path / ".docker").mkdir()
        auth = base64.b64encode(b"ortpack:correct horse").decode()
        (tmp_path / ".docker" / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
        pull_bundle(pinned, tmp_path / "out-docker-config")
        assert _files(tmp_path / "out-docker-config") == _files(bundle)
    finally:
        stop_registry(process)


# --- the CLI and the server ---------------------------------------------------------------


@pytest.mark.slow
def test_cli_push_and_pull(oci_registry: Registry, signed_bundle: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, public = signed_bundle
    pushed = ortpack("bundle", "push", str(bundle), oci_registry.url("ortpack/cli:1"), "--trust-key", str(public))
    assert pushed.returncode == 0, pushed.stderr
    pinned = pushed.stdout.strip()
    assert pinned.startswith(oci_registry.url("ortpack/cli@sha256:")) and len(pinned.splitlines()) == 1

    pulled = ortpack("bundle", "pull", pinned, "--out", str(tmp_path / "out"), "--trust-key", str(public))
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.startswith(f"pulled: {tmp_path / 'out'} (demo 3) from {pinned}")
    assert _files(tmp_path / "out") == _files(bundle)

    _, other = make_key_pair(tmp_path, "other")
    refused = ortpack("bundle", "pull", pinned, "--out", str(tmp_path / "refused"), "--trust-key", str(other))
    assert_one_line_error(refused, 2, "made with another key")
    assert not (tmp_path / "refused").exists()

    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    (broken / "tokenizer.json").write_text("changed")
    assert_one_line_error(
        ortpack("bundle", "push", str(broken), oci_registry.url("ortpack/cli:2")), 2, "size mismatch for tokenizer.json"
    )
    assert_one_line_error(
        ortpack("bundle", "push", str(bundle), "oci://127.0.0.1:1/ortpack/cli:1"), 3, "cannot reach registry"
    )
    assert_one_line_error(ortpack("bundle", "push", str(bundle), "oci://host/Bad:1"), 2, "bad OCI reference")


@pytest.fixture
def signed_tiny(tiny_bundle: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A signed copy of the shared tiny bundle (never sign the shared fixture itself)."""
    bundle = tmp_path / "tiny-bert"
    shutil.copytree(tiny_bundle, bundle)
    private, public = make_key_pair(tmp_path)
    sign_bundle(bundle, private)
    return bundle, public


def test_server_pulls_a_pinned_signed_bundle_and_serves_it(
    oci_registry: Registry, signed_tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, public = signed_tiny
    pinned = push_bundle(bundle, oci_registry.url("ortpack/tiny-bert:1"))
    args = ("--variant", "cpu-fp32", "--trust-key", str(public), "--cache-dir", str(tmp_path / "cache"))
    with running_server(pinned, *args, log_dir=tmp_path) as server:
        answer = httpx.post(f"{server.url}/v1/embeddings", json={"input": "served from a registry"})
        assert answer.status_code == 200 and len(answer.json()["data"][0]["embedding"]) == 64
        log = server.output()
    assert "bundle signature verified: " in log and "unsigned" not in log


def test_server_warns_when_the_signature_is_not_checked(
    oci_registry: Registry, signed_tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = signed_tiny
    pinned = push_bundle(bundle, oci_registry.url("ortpack/tiny-bert:unchecked"))
    with running_server(pinned, "--variant", "cpu-fp32", "--warmup", "false", log_dir=tmp_path) as server:
        log = server.output()
    warnings = [line for line in log.splitlines() if "model.sig" in line]
    assert len(warnings) == 1 and "NOT checked: no --trust-key given" in warnings[0]


def _refused_start(bundle: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Start the server and expect exit 2 with one error line, before any model is loaded."""
    done = subprocess.run(
        [sys.executable, "-m", "ortpack.serving", "--bundle", bundle, "--port", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ortpack-serve: error:")]
    assert len(errors) == 1, done.stderr
    assert "loaded " not in done.stderr and "warm-up" not in done.stderr  # refused before loading
    return errors[0]


def test_server_refuses_a_tampered_and_rehashed_bundle(
    oci_registry: Registry, signed_tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, public = signed_tiny
    rel = "variants/cpu-fp32/model.onnx"
    tamper_and_rehash(bundle, rel, (bundle / rel).read_bytes() + b"\0")  # e.g. a graph with a node added
    verify_bundle(bundle)  # checksums alone would let it through
    pinned = push_bundle(bundle, oci_registry.url("ortpack/tiny-bert:tampered"))
    error = _refused_start(pinned, "--trust-key", str(public), "--cache-dir", str(tmp_path / "cache"))
    assert f"changed after signing: manifest.json, {rel}" in error


def test_server_refuses_an_unsigned_bundle_with_a_trust_key(tiny_bundle: Path, tmp_path: Path) -> None:
    _, public = make_key_pair(tmp_path)
    error = _refused_start(str(tiny_bundle), env={"ORTPACK_TRUST_KEY": str(public)})
    assert "bundle is not signed" in error
