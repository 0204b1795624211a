"""A gate means something only where it ran: a cuda variant checked on the CPU provider is not
validated on its target, and a reference that barely varies validates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortpack.components.core.errors import ExportError


@pytest.fixture(scope="module")
def cuda_fp16(tiny_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cuda fp16 variant of the tiny BERT: GPU fusions, fp16 weights with the pooling block in
    fp32, no ORT-level offline optimization (the path a GPU node serves)."""
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.specs import VariantSpec

    out = tmp_path_factory.mktemp("cuda") / "cuda-fp16"
    optimize_model(tiny_export, VariantSpec(target="cuda", precision="fp16"), out)
    return out


def test_fp16_graph_keeps_io_and_pooling_in_fp32(cuda_fp16: Path) -> None:
    import onnx

    from ortpack.components.core.artifacts import OptimizeResult

    built = OptimizeResult.load(cuda_fp16)
    assert built.offline_optimization_level == "disabled" and built.execution_providers[0] == "CUDAExecutionProvider"
    model = onnx.load(str(cuda_fp16 / built.model_file))
    floats = {i.name: i.type.tensor_type.elem_type for i in [*model.graph.input, *model.graph.output]}
    assert floats["sentence_embedding"] == onnx.TensorProto.FLOAT
    fp16_weights = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
    assert fp16_weights, "no fp16 weights: the conversion did not run"
    # the pooling block stays fp32: its inputs are cast back to float (blocked nodes keep fp32)
    producers = {out: n for n in model.graph.node for out in n.output}
    pooling = [n for n in model.graph.node if n.name.startswith("/pooling/") and n.op_type == "Mul"]
    assert pooling
    fed = [producers.get(i) for n in pooling for i in n.input]
    casts = [n for n in fed if n is not None and n.op_type == "Cast"]
    assert any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for n in casts for a in n.attribute)


def test_cuda_variant_checked_on_the_cpu_provider_is_not_validated(
    cuda_fp16: Path, tiny_export: Path, tmp_path: Path
) -> None:
    import onnxruntime

    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.tasks import thresholds_for

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the variant is validated on its target here")
    thresholds = thresholds_for("text-embedding", "fp16")
    report = validate_variant(cuda_fp16, tiny_export, thresholds, out_dir=tmp_path / "strict")
    assert not report.passed and report.off_target
    assert report.validated_on == "CPUExecutionProvider"
    assert any("not on its target's CUDAExecutionProvider" in m for m in report.misses)
    # the numbers themselves pass the fp16 gate: only the provider is wrong
    assert report.values["min_cosine"] >= thresholds.as_dict()["min_cosine"]
    allowed = validate_variant(cuda_fp16, tiny_export, thresholds, out_dir=tmp_path / "allowed", allow_off_target=True)
    assert allowed.passed and allowed.off_target and allowed.metrics()["parity.off_target"] == 1.0


def test_report_marks_off_target_and_degenerate_builds(cuda_fp16: Path, tiny_export: Path, tmp_path: Path) -> None:
    import dataclasses

    from ortpack.components.core.artifacts import ExportResult, OptimizeResult, VariantRecord
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.report.tables import banners
    from ortpack.components.core.tasks import thresholds_for

    report = validate_variant(
        cuda_fp16,
        tiny_export,
        thresholds_for("text-embedding", "fp16"),
        out_dir=tmp_path,
        allow_off_target=True,
    )
    record = VariantRecord(model_dir=cuda_fp16, built=OptimizeResult.load(cuda_fp16), parity=report, benchmark=None)
    export = ExportResult.load(tiny_export)
    assert not banners(export, [dataclasses.replace(record, parity=dataclasses.replace(report, off_target=False))])
    (line,) = banners(export, [record])
    assert "cuda-fp16 was validated on CPUExecutionProvider" in line
    degenerate = dataclasses.replace(export, degenerate_reference=True)
    assert any("degenerate" in b for b in banners(degenerate, []))


@pytest.mark.slow
def test_degenerate_reference_is_refused(tmp_path: Path) -> None:
    """torchvision's MobileNetV3 with random weights gives every class ~0.001: refused in one
    line, built only when the user says so."""
    from ortpack.components.core.export import MIN_SPREAD, export_model
    from ortpack.components.core.specs import ExportSpec

    spec = ExportSpec(source="mobilenet_v3_small", task="image-classification", name="random")
    with pytest.raises(ExportError, match="reference is degenerate") as caught:
        export_model(spec, tmp_path / "refused")
    assert "\n" not in str(caught.value) and "--allow-degenerate-reference" in str(caught.value)
    import dataclasses

    result = export_model(dataclasses.replace(spec, allow_degenerate_reference=True), tmp_path / "allowed")
    assert result.degenerate_reference and result.metrics["reference_spread"] < MIN_SPREAD


def test_non_degenerate_references_pass(tiny_export: Path) -> None:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.export import MIN_SPREAD

    export = ExportResult.load(tiny_export)
    assert not export.degenerate_reference and export.metrics["reference_spread"] >= MIN_SPREAD


@pytest.mark.gpu
def test_cuda_variant_is_validated_on_its_target_where_cuda_exists(
    cuda_fp16: Path, tiny_export: Path, tmp_path: Path
) -> None:
    """On a GPU machine (onnxruntime-gpu with the CUDA provider) the same check runs on the target:
    no off-target flag needed. Never runs on this project's CI (no GPU)."""
    import onnxruntime

    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.tasks import thresholds_for

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("needs onnxruntime-gpu with the CUDA provider (no GPU here)")
    report = validate_variant(cuda_fp16, tiny_export, thresholds_for("text-embedding", "fp16"), out_dir=tmp_path)
    assert report.passed and not report.off_target and report.validated_on == "CUDAExecutionProvider"
