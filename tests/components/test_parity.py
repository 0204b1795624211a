"""The parity gate: it passes faithful variants, rejects perturbed ones, and measures batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ortpack.components.core.artifacts import ExportResult, OptimizeResult, ParityReport
from ortpack.components.core.errors import InvalidSpecError, ParityError
from ortpack.components.core.parity import check_parity
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks import thresholds_for
from ortpack.kernel.contracts.text_embedding import CONTRACT
from ortpack.kernel.gates import gate, neighbour_overlap

EMBEDDING = CONTRACT.gates  # text-embedding's gate table


def test_fp32_and_int8_pass_their_default_gates(tiny_variants: dict[str, Path]) -> None:
    fp32 = ParityReport.load(tiny_variants["cpu-fp32"])
    int8 = ParityReport.load(tiny_variants["cpu-int8"])
    assert fp32.passed and int8.passed, (fp32.misses, int8.misses)
    assert fp32.values["max_abs_diff"] < 1e-5
    assert fp32.values["neighbour_agreement"] == pytest.approx(1.0, abs=0.005)
    # int8 is lossy: the numbers must show it (a gate that sees no difference measures nothing)
    assert int8.values["max_abs_diff"] > 1e-4
    assert int8.values["min_cosine"] < fp32.values["min_cosine"]
    assert fp32.samples >= 500
    assert {"b1.min_cosine", "b32.min_cosine", "neighbour_agreement"} <= set(int8.values)
    assert len(int8.per_item["cosine_distance"]) == int8.samples


def test_optimized_graph_is_fused(tiny_variants: dict[str, Path]) -> None:
    built = OptimizeResult.load(tiny_variants["cpu-fp32"])
    assert built.metrics["fusions"] == {
        "Attention": 2,
        "BiasGelu": 2,
        "EmbedLayerNormalization": 1,
        "SkipLayerNormalization": 4,
    }
    assert built.metrics["nodes_after"] < built.metrics["nodes_before"] / 4
    assert built.offline_optimization_level == "extended"
    int8 = OptimizeResult.load(tiny_variants["cpu-int8"])
    assert int8.metrics["ops_after"].get("QAttention") == 2
    assert int8.metrics["mb"] < built.metrics["mb"]


def _perturb(src: Path, dst: Path, scale: float) -> None:
    """Scale the largest initializer of the raw export (a weight matrix) by `scale`."""
    model = onnx.load(str(src))
    biggest = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    array = numpy_helper.to_array(biggest).astype(np.float32)
    rng = np.random.default_rng(0)
    noisy = array * (1 + scale * rng.standard_normal(array.shape).astype(np.float32))
    biggest.CopyFrom(numpy_helper.from_array(noisy, biggest.name))
    onnx.save(model, str(dst))


def test_gate_rejects_a_perturbed_graph(tiny_export: Path, tmp_path: Path) -> None:
    _perturb(tiny_export / "model.onnx", tmp_path / "perturbed.onnx", scale=0.05)
    report = check_parity(
        tmp_path / "perturbed.onnx",
        tiny_export / "reference.npz",
        thresholds_for("text-embedding", "fp32"),
        variant_id="perturbed",
    )
    assert not report.passed
    assert any(m.startswith("max_abs_diff") for m in report.misses)
    with pytest.raises(ParityError, match="parity gate missed by perturbed: max_abs_diff"):
        report.raise_if_failed()


def test_gate_rejects_wrong_signature(tiny_export: Path, tmp_path: Path) -> None:
    model = onnx.load(str(tiny_export / "model.onnx"))
    model.graph.output[0].name = "embeddings"
    for node in model.graph.node:
        node.output[:] = ["embeddings" if o == "sentence_embedding" else o for o in node.output]
    onnx.save(model, str(tmp_path / "renamed.onnx"))
    report = check_parity(
        tmp_path / "renamed.onnx",
        tiny_export / "reference.npz",
        ParityThresholds(EMBEDDING),
        variant_id="renamed",
    )
    assert report.misses == [
        "unexpected output embeddings (declared: sentence_embedding)",
        "missing output sentence_embedding (float32 ['batch', 'dim'])",
    ]


def test_unloadable_graph_is_a_miss_not_a_crash(tiny_export: Path, tmp_path: Path) -> None:
    (tmp_path / "garbage.onnx").write_bytes(b"\x00garbage")
    report = check_parity(
        tmp_path / "garbage.onnx",
        tiny_export / "reference.npz",
        ParityThresholds(EMBEDDING),
        variant_id="garbage",
    )
    assert not report.passed and "cannot load" in report.misses[0]


def test_batch_invariance(tiny_variants: dict[str, Path], tiny_export: Path) -> None:
    """Each row of a padded batch equals the same sentence run alone."""
    import onnxruntime as ort

    ref = np.load(tiny_export / "reference.npz")
    names = [str(n) for n in ref["input_names"]]
    session = ort.InferenceSession(str(tiny_variants["cpu-fp32"] / "model.onnx"), providers=["CPUExecutionProvider"])
    idx = np.array([0, 5, 17, 100, 250, 400, 401, 550])  # mixed lengths
    width = int(ref["lengths"][idx].max())
    batch = session.run(None, {n: ref[n][idx, :width] for n in names})[0]
    assert len({int(ref["lengths"][i]) for i in idx}) > 3
    for row, i in enumerate(idx):
        n = int(ref["lengths"][i])
        single = session.run(None, {name: ref[name][i : i + 1, :n] for name in names})[0][0]
        np.testing.assert_allclose(batch[row], single, atol=1e-5)
    assert ParityReport.load(tiny_variants["cpu-fp32"]).values["batch_max_abs_diff"] < 1e-5


def test_neighbour_overlap() -> None:
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((50, 16))
    assert neighbour_overlap(emb, emb).mean() == 1.0
    shuffled = rng.standard_normal((50, 16))
    assert neighbour_overlap(emb, shuffled).mean() < 0.5


def test_gate_names_each_miss() -> None:
    limits = ParityThresholds.of(EMBEDDING, max_abs_diff=1e-5, min_cosine=0.99, min_neighbour_agreement=0.9)
    misses = limits.misses({"max_abs_diff": 1e-3, "min_cosine": 0.999, "neighbour_agreement": 0.5})
    assert misses == ["max_abs_diff 0.001 (needs <= 1e-05)", "neighbour_agreement 0.5 (needs >= 0.9)"]
    assert gate({"max_abs_diff": float("nan")}, limits.as_dict(), EMBEDDING) == ["max_abs_diff nan (needs <= 1e-05)"]


def test_each_task_gates_only_its_own_thresholds() -> None:
    """A threshold another task gates is refused by name, listing this task's own."""
    from ortpack.kernel.contracts.image_classification import CONTRACT as IMAGE

    with pytest.raises(InvalidSpecError, match=r"unknown threshold 'min_cosine' \(known: .*min_top1_agreement"):
        ParityThresholds.of(IMAGE.gates, min_cosine=0.9)
    with pytest.raises(InvalidSpecError, match="unknown threshold 'min_top5_agreement'"):
        ParityThresholds.of(EMBEDDING).updated(min_top5_agreement=0.9)
    assert ParityThresholds.of(IMAGE.gates, max_pixel_diff=2.0).updated(max_pixel_diff=None).as_dict() == {}


def test_torch_reference_was_measured(tiny_export: Path) -> None:
    export = ExportResult.load(tiny_export)
    assert all(v["p50_ms"] > 0 for v in export.torch_latency.values())
