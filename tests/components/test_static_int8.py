"""Static int8 for the image families (components/core/quantization/static_int8.py) on a small convolution net
exported the way the image exporters export theirs (TorchScript exporter, BatchNorm folded): the
graph reaches ONNX Runtime's int8 kernels, biases are corrected, layers are ranked by the noise
they add and returned to float until the judge is satisfied, and servers skip 8-bit weights on
CPUs whose int8 kernels saturate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ortpack.components.core.quantization.recipes import STATIC_INT8_RECIPES, StaticInt8


def _net() -> object:
    import torch
    from torch import nn

    torch.manual_seed(0)

    def block(cin: int, cout: int, groups: int = 1) -> nn.Sequential:
        # a fresh BatchNorm folds to equal biases: the exporter shares them through Identity nodes
        conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups, bias=False)
        return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(block(3, 16), block(16, 16, groups=16), block(16, 32), block(32, 32))
            self.head = nn.Conv2d(32, 8, 1)

        def forward(self, images: torch.Tensor) -> torch.Tensor:  # uint8 NHWC in, like the image graphs
            x = images.permute(0, 3, 1, 2).float() / 255.0
            return self.head(self.body(x)).mean(dim=(2, 3))

    return Net().eval()


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import warnings

    import torch

    path = tmp_path_factory.mktemp("static-int8") / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _net(),
            (torch.zeros(1, 32, 32, 3, dtype=torch.uint8),),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["images"],
            output_names=["scores"],
            dynamic_axes={"images": {0: "batch", 1: "height", 2: "width"}, "scores": {0: "batch"}},
        )
    return path


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8) for _ in range(8)]


def _scores(path: Path, images: list[np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"images": im[None]})[0] for im in images])


def test_the_exporters_shared_biases_kept_convolutions_float_until_prepared(
    graph: Path, images: list[np.ndarray], tmp_path: Path
) -> None:
    """The root cause of int8 graphs slower than fp32: biases shared through Identity nodes are not
    initializers, the quantizer leaves them float, and ONNX Runtime cannot fuse the convolution into
    QLinearConv. `prepare` (quant_pre_process) removes them: every convolution reaches the kernel."""
    import onnx

    from ortpack.components.core.quantization.static_int8 import kernel_census, prepare, quantize

    convolutions = sum(n.op_type == "Conv" for n in onnx.load(str(graph)).graph.node)
    recipe = StaticInt8(8, bias_correction=False)
    quantize(graph, tmp_path / "raw.onnx", images, recipe)
    raw = kernel_census(tmp_path / "raw.onnx", level="all")
    assert raw["dequantized_float"], "the unprepared graph should show the problem this step fixes"

    prepare(graph, tmp_path / "prepared.onnx")
    quantize(tmp_path / "prepared.onnx", tmp_path / "int8.onnx", images, recipe)
    census = kernel_census(tmp_path / "int8.onnx", level="all")
    assert census["dequantized_float"] == [] and census["int8"]["QLinearConv"] == convolutions
    assert "Conv" not in census["float"]
    assert not list(Path.cwd().glob("sym_shape_infer_temp*"))  # prepare works in a scratch directory


def test_weight_width_and_exactness(graph: Path, images: list[np.ndarray], tmp_path: Path) -> None:
    """7-bit weights stay within [-64, 64] (u8 x s8 pairs cannot saturate int16 on any x86-64
    CPU); 8-bit weights use the whole [-127, 127]; the recipe table says which is exact where."""
    import onnx
    from onnx import TensorProto, numpy_helper

    from ortpack.components.core.quantization.static_int8 import prepare, quantize

    prepare(graph, tmp_path / "prepared.onnx")
    largest = {}
    for bits in (7, 8):
        out = tmp_path / f"s{bits}.onnx"
        quantize(tmp_path / "prepared.onnx", out, images, StaticInt8(bits))
        weights = [
            numpy_helper.to_array(i)
            for i in onnx.load(str(out)).graph.initializer
            if i.data_type == TensorProto.INT8 and len(i.dims) == 4
        ]
        largest[bits] = max(int(np.abs(w.astype(np.int64)).max()) for w in weights)
    assert largest[7] <= 64 < largest[8] <= 127
    assert STATIC_INT8_RECIPES["s7"].exact_everywhere and not STATIC_INT8_RECIPES["s8"].exact_everywhere
    assert set(STATIC_INT8_RECIPES) == {
        f"s{bits}{wide}{uncorrected}"
        for bits in (8, 7)
        for wide in ("", "-wide")
        for uncorrected in ("", "-uncorrected")
    }


def test_bias_correction_moves_the_mean_back(graph: Path, images: list[np.ndarray], tmp_path: Path) -> None:
    """Each corrected bias absorbs the mean shift its rounded weights cause: the int8 graph's mean
    output error (over the images, per output) shrinks; the outputs still agree."""
    from ortpack.components.core.quantization.static_int8 import correct_biases, prepare, quantize

    prepared = tmp_path / "prepared.onnx"
    prepare(graph, prepared)
    quantize(prepared, tmp_path / "plain.onnx", images, StaticInt8(7, bias_correction=False))
    changed = correct_biases(prepared, tmp_path / "plain.onnx", tmp_path / "corrected.onnx", images)
    assert changed == 5
    fp32 = _scores(prepared, images)
    shift = {
        name: np.abs((_scores(tmp_path / name, images) - fp32).mean(axis=0)).mean()
        for name in ("plain.onnx", "corrected.onnx")
    }
    assert shift["corrected.onnx"] < shift["plain.onnx"], shift


def test_search_returns_the_most_sensitive_layers_to_float_until_the_judge_passes(
    graph: Path, images: list[np.ndarray], tmp_path: Path
) -> None:
    """A judge that passes only once two layers run in float (it counts them in the session ONNX
    Runtime builds): the search tries the whole int8 graph in its four forms, ranks the layers by
    what each costs the outputs, and ships the first candidate with enough of the worst in float."""
    from ortpack.components.core.quantization.static_int8 import kernel_census, search

    def judge(candidate: Path) -> tuple[dict[str, float], list[str]]:
        census = kernel_census(candidate, level="all")
        floats = census["float"].get("Conv", 0) + census["float"].get("FusedConv", 0)
        assert census["dequantized_float"] == []
        return {"float": float(floats)}, ([] if floats >= 2 else [f"float convolutions {floats} (needs >= 2)"])

    dst = tmp_path / "int8.onnx"
    record = search(graph, dst, images, judge, lambda q: q["float"], weight_bits=7)
    # the four whole-graph candidates first (the operators between convolutions in int8 too, then
    # not; corrected, then not), then the first of them (they tie on the rank) with layers in float
    assert record["passed"] and record["candidate"] == "s7-wide+2fp32" and record["recipe"] == "s7-wide"
    assert list(record["candidates"]) == [
        "s7-wide",
        "s7-wide-uncorrected",
        "s7",
        "s7-uncorrected",
        "s7-wide+1fp32",
        "s7-wide+2fp32",
    ]
    # the two kept in float are the two the ranking calls worst, with their measured noise
    ranking = record["sensitivity"]
    assert list(record["float_layers"]) == list(ranking)[:2] and len(ranking) == 5
    assert all(record["float_layers"][k] == ranking[k] for k in record["float_layers"])
    assert record["weight_bits"] == 7 and record["calibration"] == "min/max over 8 images"
    assert dst.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["int8.onnx"]  # work files removed


def test_servers_skip_8_bit_int8_on_cpus_that_saturate() -> None:
    """An int8 variant proven with 8-bit weights is left out of `auto` where u8 x s8 products
    saturate (AVX2 without VNNI); a 7-bit one is not; fp32 is always there."""
    from ortpack.kernel.bundle import Variant
    from ortpack.kernel.hardware import HardwareInfo
    from ortpack.kernel.selection import inexact_here, rank_variants
    from tests.models import minimal_manifest

    def variant(precision: str, bits: int | None) -> Variant:
        fields = minimal_manifest()["variants"][0]  # a valid cpu-fp32 variant; this one's precision and int8
        int8 = {"recipe": f"s{bits}", "weight_bits": bits} if bits else None
        optimize = {**fields["optimize"], "int8": int8}
        changed = {"id": f"cpu-{precision}", "precision": precision, "optimize": optimize}
        return Variant.model_validate({**fields, **changed})

    avx2 = HardwareInfo(machine="x86_64", cpu_model="AVX2 only", features=("avx2", "fma"), cores=2)
    vnni = HardwareInfo(machine="x86_64", cpu_model="VNNI", features=("avx2", "avx512f", "avx512_vnni"), cores=2)
    fp32, s8, s7 = variant("fp32", None), variant("int8", 8), variant("int8", 7)
    assert inexact_here(s8, avx2) and not inexact_here(s8, vnni) and not inexact_here(s7, avx2)
    providers = ["CPUExecutionProvider"]
    assert [v.id for v in rank_variants([fp32, s8], providers, avx2)] == ["cpu-fp32"]
    assert {v.id for v in rank_variants([fp32, s8], providers, vnni)} == {"cpu-fp32", "cpu-int8"}
    assert {v.id for v in rank_variants([fp32, s7], providers, avx2)} == {"cpu-fp32", "cpu-int8"}
