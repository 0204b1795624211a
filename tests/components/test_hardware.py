"""The CPU story: ISA detection, and an int8 recipe whose numbers do not depend on the CPU.

Without AVX-512 VNNI (or AVX-VNNI, AMX), ONNX Runtime's u8 x s8 kernels add pairs of products in
saturating int16. Our int8 recipe uses 7-bit weights (`reduce_range`), so no pair can saturate:
the quantized graph then computes exactly what integer arithmetic says, on every x86-64 CPU. The
emulation test below checks that against numpy's int32 math, with activations at 255 and
weights at their extremes, where 8-bit weights would saturate on an AVX2-only CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortpack.components.core.quantization.recipes import DYNAMIC_INT8_RECIPES, DynamicInt8
from ortpack.kernel.hardware import describe, parse_cpuinfo, this_machine

# The int8 search's recipes that quantize the test's [64, 8] MatMul (ffn-out-fp32 keeps a MatMul
# that narrows its input in fp32, and quantizes the others as per-channel does).
QUANTIZED_MATMUL_RECIPES = [r for r in DYNAMIC_INT8_RECIPES if not r.fp32_ffn_output]

AVX2_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave \
avx f16c rdrand hypervisor lahf_lm abm sse4a bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni
"""
XEON_VNNI = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
SAPPHIRE = """model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: avx2 fma avx512f avx512bw avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
"""


def test_cpuinfo_flags_are_parsed() -> None:
    model, features = parse_cpuinfo(AVX2_EPYC)
    assert model == "AMD EPYC 7B13"
    assert features == ("avx2", "fma", "f16c")
    assert parse_cpuinfo(XEON_VNNI)[1] == ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni")
    assert parse_cpuinfo(GRAVITON)[1] == ("asimd", "asimddp")
    assert parse_cpuinfo("") == ("", ())


@pytest.mark.parametrize(
    ("text", "kernel", "exact"),
    [
        (AVX2_EPYC, "avx2", False),
        (XEON_VNNI, "avx512_vnni", True),
        (SAPPHIRE, "amx", True),
        (GRAVITON, "neon_dot", True),
        ("flags: sse sse2 avx512f avx512bw", "avx512", False),
    ],
)
def test_int8_kernel_family(text: str, kernel: str, exact: bool) -> None:
    info = describe(text)
    assert info.int8_kernel == kernel
    assert info.exact_int8_dot is exact
    assert info.as_dict()["int8_kernel"] == kernel


def test_feature_sets_compare() -> None:
    vnni, avx2 = describe(XEON_VNNI), describe(AVX2_EPYC)
    assert vnni.has_features(list(avx2.features))
    assert not avx2.has_features(list(vnni.features))
    assert this_machine().cores >= 1


# ---------------------------------------------------------------- the int8 recipe, emulated


def _matmul_model(path: Path, weights: np.ndarray) -> None:
    k, n = weights.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _quantized_weights(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int weights [k, n], per-channel scales [n], zero points [n]) of the quantized MatMul."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul"))
    if node.op_type == "MatMulInteger":
        wq, wzp = inits[node.input[1]], inits[node.input[3]]
        mul = next(n for n in model.graph.node if n.op_type == "Mul" and any(i in inits for i in n.input))
        scale_name = next(i for i in mul.input if i in inits)
        # the Mul multiplies by x_scale * w_scale; w_scale is the initializer
        return wq, inits[scale_name], wzp
    return inits[node.input[1]], inits[node.input[2]], inits[node.input[3]]


def _emulate(x: np.ndarray, wq: np.ndarray, w_scale: np.ndarray, w_zp: np.ndarray) -> np.ndarray:
    """The quantized MatMul in exact integer arithmetic: DynamicQuantizeLinear on x (uint8,
    round half to even), int32 dot products, then the scales."""
    x_max, x_min = max(0.0, float(x.max())), min(0.0, float(x.min()))
    x_scale = np.float32((x_max - x_min) / 255.0)
    x_zp = int(np.clip(np.rint(-x_min / x_scale), 0, 255))
    xq = np.clip(np.rint(x / x_scale) + x_zp, 0, 255).astype(np.int64)
    acc = (xq - x_zp) @ (wq.astype(np.int64) - w_zp.astype(np.int64))  # exact: int64 never overflows here
    return acc.astype(np.float64) * (np.float64(x_scale) * w_scale.astype(np.float64))


def _worst_case(k: int = 64, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Activations that quantize to 255 and weights at +-max: every product pair is as large as
    it gets, where 8-bit weights overflow an int16 pair sum (255 * 127 * 2 > 32767)."""
    rng = np.random.default_rng(0)
    weights = rng.choice([-1.0, 1.0], size=(k, n)) * rng.uniform(0.9, 1.0, size=(k, n))
    weights[:, : n // 2] = np.abs(weights[:, : n // 2])  # half the channels all positive: saturating sums
    x = np.full((4, k), 255.0, dtype=np.float32)
    x[1] = rng.integers(0, 256, k)  # uint8 levels exactly (scale 1, zero point 0)
    x[2, ::2] = 0.0
    x[3] = 255.0 - x[1]
    return x, weights


@pytest.mark.parametrize("recipe", QUANTIZED_MATMUL_RECIPES, ids=lambda r: r.name)
def test_shipped_int8_recipe_uses_7_bit_weights_on_every_cpu(tmp_path: Path, recipe: DynamicInt8) -> None:
    """Every recipe the int8 search may pick (components/core/optimize.py DYNAMIC_INT8_RECIPES)."""
    from ortpack.components.core.quantization.graph_recipes import quantize_int8_dynamic

    _, weights = _worst_case()
    _matmul_model(tmp_path / "fp32.onnx", weights)
    quantize_int8_dynamic(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", recipe=recipe)
    wq, _, wzp = _quantized_weights(tmp_path / "int8.onnx")
    assert wq.dtype == np.int8 and not wzp.any()
    # 7-bit weights: |w| <= 64, so two products of a u8 activation fit an int16: 255 * 64 * 2 < 32767
    assert int(np.abs(wq.astype(np.int64)).max()) <= 64
    assert 255 * int(np.abs(wq.astype(np.int64)).max()) * 2 <= 32767


def test_ffn_output_recipe_keeps_narrowing_matmuls_in_fp32(tmp_path: Path) -> None:
    from ortpack.components.core.quantization.graph_recipes import quantize_int8_dynamic

    _, weights = _worst_case()  # [64, 8]: narrows, as an FFN's second MatMul does
    _matmul_model(tmp_path / "fp32.onnx", weights)
    quantize_int8_dynamic(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", recipe=DynamicInt8(fp32_ffn_output=True))
    assert [n.op_type for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node] == ["MatMul"]


@pytest.mark.parametrize("recipe", QUANTIZED_MATMUL_RECIPES, ids=lambda r: r.name)
def test_shipped_int8_recipe_matches_exact_integer_math(tmp_path: Path, recipe: DynamicInt8) -> None:
    """Whatever int8 kernel this CPU selects, each recipe's graph (quantized, then optimized
    offline as the optimize step ships it) equals exact int32 arithmetic."""
    import onnxruntime as ort

    from ortpack.components.core.optimize import ort_offline_optimize
    from ortpack.components.core.quantization.graph_recipes import quantize_int8_dynamic

    x, weights = _worst_case()
    _matmul_model(tmp_path / "fp32.onnx", weights)
    quantize_int8_dynamic(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", recipe=recipe)
    ort_offline_optimize(tmp_path / "int8.onnx", tmp_path / "shipped.onnx", "extended", ["CPUExecutionProvider"])
    session = ort.InferenceSession(str(tmp_path / "shipped.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    expected = _emulate(x, *_quantized_weights(tmp_path / "int8.onnx"))
    # float32 rounding of the final scale only; a saturated pair sum would be off by ~50%
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)


@pytest.mark.skipif(
    this_machine().exact_int8_dot,
    reason=f"this CPU ({this_machine().int8_kernel}) sums u8 x s8 products exactly: 8-bit weights do not saturate here",
)
def test_8_bit_weights_saturate_on_this_cpu(tmp_path: Path) -> None:
    """Why the recipe uses 7-bit weights: on a CPU without an exact int8 dot product, 8-bit
    weights give other numbers than integer arithmetic (runs only on such a CPU)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    x, weights = _worst_case()
    _matmul_model(tmp_path / "fp32.onnx", weights)
    quantize_dynamic(
        str(tmp_path / "fp32.onnx"), str(tmp_path / "int8.onnx"), per_channel=True, weight_type=QuantType.QInt8
    )
    session = ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    expected = _emulate(x, *_quantized_weights(tmp_path / "int8.onnx"))
    assert np.abs(got - expected).max() > 0.1 * np.abs(expected).max()


def int8_weight_magnitude(model_path: Path) -> int:
    """The largest |value| of any int8 initializer (quantized weights) in a graph."""
    model = onnx.load(str(model_path))
    arrays = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == TensorProto.INT8]
    assert arrays, f"{model_path} has no int8 weights"
    return max(int(np.abs(a.astype(np.int64)).max()) for a in arrays if a.size)


def test_text_int8_variant_has_7_bit_weights(tiny_variants: dict[str, Path]) -> None:
    assert int8_weight_magnitude(tiny_variants["cpu-int8"] / "model.onnx") <= 64
