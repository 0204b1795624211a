"""The bundle contract: atomic writes, strict reads, and verification that catches tampering."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortpack.kernel.bundle import SCHEMA_VERSION, BundleError, read_manifest, verify_bundle, write_bundle
from ortpack.serving.startup import Prehash
from tests.models import minimal_manifest


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "src").mkdir()
    model = tmp_path / "src" / "model.onnx"
    model.write_bytes(b"not really onnx, but bytes to checksum")
    tok = tmp_path / "src" / "tokenizer.json"
    tok.write_text("{}")
    return {"variants/cpu-fp32/model.onnx": model, "tokenizer.json": tok}


def test_roundtrip(tmp_path: Path, sources: dict[str, Path]) -> None:
    written = write_bundle(tmp_path / "out", minimal_manifest(), sources)
    assert written.schema_version == SCHEMA_VERSION
    assert set(written.files) == set(sources)
    read = verify_bundle(tmp_path / "out")
    assert read == written
    assert read.variant("cpu-fp32").precision == "fp32"
    with pytest.raises(BundleError, match="has no variant 'cuda-fp16'"):
        read.variant("cuda-fp16")


def test_refuses_existing_output_unless_forced(tmp_path: Path, sources: dict[str, Path]) -> None:
    write_bundle(tmp_path / "out", minimal_manifest(), sources)
    with pytest.raises(BundleError, match="output directory exists"):
        write_bundle(tmp_path / "out", minimal_manifest(), sources)
    manifest = minimal_manifest() | {"version": "4"}
    write_bundle(tmp_path / "out", manifest, sources, force=True)
    assert read_manifest(tmp_path / "out").version == "4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no staging leftovers


def test_failed_write_leaves_nothing(tmp_path: Path, sources: dict[str, Path]) -> None:
    broken = dict(sources)
    broken["report.html"] = tmp_path / "does-not-exist.html"
    with pytest.raises(BundleError, match=r"cannot write the bundle .*: No such file or directory \(.*does-not-exist"):
        write_bundle(tmp_path / "out", minimal_manifest(), broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_invalid_manifest_leaves_nothing(tmp_path: Path, sources: dict[str, Path]) -> None:
    manifest = minimal_manifest()
    manifest["variants"][0]["precision"] = "fp8"
    with pytest.raises(BundleError, match=r"invalid manifest: variants\.0\.precision"):
        write_bundle(tmp_path / "out", manifest, sources)
    assert not (tmp_path / "out").exists()


def test_manifest_must_list_what_it_points_at(tmp_path: Path, sources: dict[str, Path]) -> None:
    del sources["tokenizer.json"]
    with pytest.raises(BundleError, match="lacks"):
        write_bundle(tmp_path / "out", minimal_manifest(), sources)


def test_unsafe_paths_are_refused(tmp_path: Path, sources: dict[str, Path]) -> None:
    sources["../escape.onnx"] = sources["tokenizer.json"]
    with pytest.raises(BundleError, match="unsafe path"):
        write_bundle(tmp_path / "out", minimal_manifest(), sources)


@pytest.fixture
def bundle(tmp_path: Path, sources: dict[str, Path]) -> Path:
    write_bundle(tmp_path / "b", minimal_manifest(), sources)
    return tmp_path / "b"


def test_detects_changed_file(bundle: Path) -> None:
    model = bundle / "variants/cpu-fp32/model.onnx"
    data = bytearray(model.read_bytes())
    data[0] ^= 1
    model.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="checksum mismatch for variants/cpu-fp32/model.onnx"):
        verify_bundle(bundle)


def test_a_prehashed_bundle_is_checked_as_strictly(bundle: Path) -> None:
    """The server's start hashes a bundle directory early (ortpack.serving.startup.Prehash); a file changed
    after that is hashed again by the check, which still refuses it."""
    prehash = Prehash(bundle)
    model = bundle / "variants/cpu-fp32/model.onnx"
    assert prehash.known(model) == read_manifest(bundle).files["variants/cpu-fp32/model.onnx"].sha256
    verify_bundle(bundle, known=prehash.known)
    data = bytearray(model.read_bytes())
    data[0] ^= 1
    model.write_bytes(bytes(data))  # same size, new content, a newer modification time
    assert prehash.known(model) is None
    with pytest.raises(BundleError, match="checksum mismatch for variants/cpu-fp32/model.onnx"):
        verify_bundle(bundle, known=prehash.known)


def test_detects_truncated_file(bundle: Path) -> None:
    (bundle / "tokenizer.json").write_text("")
    with pytest.raises(BundleError, match="size mismatch for tokenizer.json"):
        verify_bundle(bundle)


def test_detects_missing_file(bundle: Path) -> None:
    shutil.rmtree(bundle / "variants")
    with pytest.raises(BundleError, match="missing file in bundle: variants/cpu-fp32/model.onnx"):
        verify_bundle(bundle)


def test_rejects_unknown_schema_version(bundle: Path) -> None:
    raw = json.loads((bundle / "manifest.json").read_text())
    raw["schema_version"] = 99
    (bundle / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="unknown bundle schema_version 99"):
        verify_bundle(bundle)


def test_reads_a_version_2_manifest(bundle: Path) -> None:
    """Version 2 kept every task's sections at the top level: read as version 3, files untouched."""
    raw = json.loads((bundle / "manifest.json").read_text())
    settings = raw.pop("task_settings")
    v2 = {**raw, "schema_version": 2, **settings, "preprocessing": None, "classification": None, "labels": None}
    (bundle / "manifest.json").write_text(json.dumps(v2))
    manifest = verify_bundle(bundle)
    assert manifest.schema_version == SCHEMA_VERSION and manifest.task == settings["task"]
    assert manifest.task_settings.model_dump() == settings
    v2["preprocessing"] = {"resize_size": 8, "crop_size": 8, "mean": [0, 0, 0], "std": [1, 1, 1]}
    (bundle / "manifest.json").write_text(json.dumps(v2))
    with pytest.raises(BundleError, match="a text-embedding manifest cannot have preprocessing settings"):
        verify_bundle(bundle)


def test_task_settings_are_the_tasks_own(bundle: Path) -> None:
    """The section is chosen by its task: another task's field, or a missing one, is refused by name."""
    raw = json.loads((bundle / "manifest.json").read_text())
    raw["task_settings"]["labels"] = ["a", "b"]  # text-classification's, not text-embedding's
    (bundle / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"task_settings\.text-embedding\.labels"):
        verify_bundle(bundle)
    del raw["task_settings"]["labels"], raw["task_settings"]["pooling"]
    (bundle / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"task_settings\.text-embedding\.pooling: Field required"):
        verify_bundle(bundle)
    raw["task_settings"]["task"] = "speech-recognition"
    (bundle / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="task_settings"):
        verify_bundle(bundle)


def test_rejects_unknown_fields_and_garbage(bundle: Path) -> None:
    raw = json.loads((bundle / "manifest.json").read_text())
    raw["surprise"] = 1
    (bundle / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="surprise"):
        verify_bundle(bundle)
    (bundle / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="unreadable manifest.json"):
        verify_bundle(bundle)


def test_rejects_non_bundles(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="bundle directory not found"):
        verify_bundle(tmp_path / "nope")
    with pytest.raises(BundleError, match="has no manifest.json"):
        verify_bundle(tmp_path)


def test_verify_only_selected_files(bundle: Path) -> None:
    (bundle / "tokenizer.json").write_text("tampered")
    verify_bundle(bundle, only=["variants/cpu-fp32/model.onnx"])  # the tokenizer is not checked
    with pytest.raises(BundleError, match="tokenizer.json"):
        verify_bundle(bundle, only=["tokenizer.json"])
