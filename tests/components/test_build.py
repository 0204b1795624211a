"""The whole build: a bundle holding only passing variants, written atomically, readable by serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ortpack.components.core.build import build_bundle
from ortpack.components.core.errors import InvalidSpecError, NoVariantPassedError
from ortpack.components.core.package import package_dirs
from ortpack.components.core.specs import BuildSpec, ExportSpec, parse_threshold_overrides, variant_grid
from ortpack.kernel.bundle import verify_bundle


def test_contract_components_write_serving_reads(tiny_bundle: Path, tiny_export: Path) -> None:
    """The bundle the components write is one `ortpack.kernel.bundle` reads, verifies and can run."""
    import onnxruntime as ort

    manifest = verify_bundle(tiny_bundle)
    assert manifest.task == "text-embedding"
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]
    assert set(manifest.files) == {
        "tokenizer.json",
        "probe/probe.npz",
        "variants/cpu-fp32/model.onnx",
        "variants/cpu-int8/model.onnx",
    }
    assert manifest.task_settings.tokenizer is not None and manifest.task_settings.tokenizer.max_length == 128
    assert [t.name for t in manifest.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert manifest.outputs[0].shape == ["batch", 64]
    assert {"torch", "transformers", "onnx", "onnxruntime", "ortpack"} <= set(manifest.versions)
    for variant in manifest.variants:
        assert variant.parity.passed is True
        assert variant.parity.values["min_cosine"] > 0.9
        assert variant.benchmark.speedup_vs_torch["b1_s16"] > 0
        assert variant.optimize.nodes_after < variant.optimize.nodes_before
        assert variant.ort_version == ort.__version__ and variant.opset == 17
    # serving-side tokenization with the shipped tokenizer reproduces the PyTorch reference
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_bundle / manifest.task_settings.tokenizer.file))
    tok.enable_truncation(manifest.task_settings.tokenizer.max_length)
    ref = np.load(tiny_export / "reference.npz")
    enc = tok.encode("The quick brown fox jumps over the lazy dog.")
    session = ort.InferenceSession(str(tiny_bundle / manifest.variants[0].file), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
    out = session.run(None, {k: np.array(v, dtype=np.int64) for k, v in feeds.items()})[0]
    assert out.shape == (1, 64) and np.isfinite(out).all()
    assert ref["outputs"].shape[1] == 64


def test_missed_variant_is_dropped_with_its_numbers(
    tiny_export: Path, tiny_variants: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    from ortpack.components.core.artifacts import ParityReport
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.tasks import thresholds_for

    strict = tmp_path / "cpu-int8"
    shutil.copytree(tiny_variants["cpu-int8"], strict)
    report = validate_variant(
        strict, tiny_export, thresholds_for("text-embedding", "int8", {"*": {"min_cosine": 0.99999}})
    )
    assert not report.passed and report.misses[0].startswith("min_cosine")
    assert ParityReport.load(strict).values == report.values  # numbers kept on disk
    manifest = package_dirs(tiny_export, [tiny_variants["cpu-fp32"], strict], tmp_path / "out")
    assert [v.id for v in manifest.variants] == ["cpu-fp32"]
    assert not (tmp_path / "out" / "variants" / "cpu-int8").exists()


@pytest.mark.slow
def test_no_variant_passed_fails_and_ships_nothing(tiny_bert: Path, tmp_path: Path) -> None:
    spec = BuildSpec(
        export=ExportSpec(source=str(tiny_bert), task="text-embedding", name="tiny"),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
        threshold_overrides=parse_threshold_overrides(["max_abs_diff=0", "min_cosine=1"]),
    )
    out = tmp_path / "dist" / "tiny"
    with pytest.raises(NoVariantPassedError) as excinfo:
        build_bundle(spec, out)
    message = str(excinfo.value)
    assert "cpu-fp32: " in message and "cpu-int8: " in message and "max_abs_diff" in message
    assert not out.exists()
    assert list(tmp_path.rglob("*tiny*")) == []  # no staging directory left behind either


def test_existing_output_is_refused_before_any_work(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "exists"
    out.mkdir()
    spec = BuildSpec(
        export=ExportSpec(source=str(tiny_bert), task="text-embedding", name="tiny"),
        variants=tuple(variant_grid(["cpu"], ["fp32"])),
    )
    with pytest.raises(InvalidSpecError, match="output directory exists"):
        build_bundle(spec, out)


def test_downloads_retry_only_when_the_store_is_unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The export step's downloads: an unreachable store is tried again (FETCH_ATTEMPTS), a
    refused source fails at the first try (the step itself is never retried by the pipeline)."""
    from ortpack.components.core import build
    from ortpack.components.core.errors import SourceError, SourceUnreachableError

    calls: list[str] = []

    def flaky(uri: str, dest: Path, **options: object) -> str:
        calls.append(uri)
        if uri.endswith("down") or (uri.endswith("flaky") and len(calls) < 3):
            raise SourceUnreachableError("cannot reach the store")
        if uri.endswith("refused"):
            raise SourceError("pickled weights")
        return "fetched"

    monkeypatch.setattr(build, "fetch_source", flaky)
    monkeypatch.setattr(build, "FETCH_BACKOFF_S", (0.0, 0.0))
    assert build.fetch_with_retries("s3://b/flaky", tmp_path / "a") == "fetched" and len(calls) == 3
    calls.clear()
    with pytest.raises(SourceError):
        build.fetch_with_retries("s3://b/refused", tmp_path / "b")
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(SourceUnreachableError):
        build.fetch_with_retries("s3://b/down", tmp_path / "c")
    assert len(calls) == build.FETCH_ATTEMPTS
