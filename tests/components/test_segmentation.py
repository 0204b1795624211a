"""Semantic segmentation's parts (fast): the metrics the gate and the probe read, the graph's
resize back and argmax against `F.interpolate`, the preprocessing's new modes against
torchvision's uint8 kernel, the answer's run-length masks, and what `--model` accepts."""

from __future__ import annotations

import numpy as np
import pytest

from ortpack.kernel.contracts.semantic_segmentation import OUTPUT
from ortpack.kernel.engines.semantic_segmentation import DECISIVE, segmentation_metrics


def _item(label_map: np.ndarray, decisive: np.ndarray | None = None) -> dict[str, np.ndarray]:
    item = {OUTPUT: label_map.astype(np.uint8)}
    if decisive is not None:
        item[DECISIVE] = decisive
    return item


def test_metrics_count_pixels_classes_and_decisive_pixels() -> None:
    ref = np.zeros((10, 10), dtype=np.uint8)
    ref[:, 5:] = 1  # two classes, 50 pixels each
    cand = ref.copy()
    cand[0, 0] = 1  # one background pixel called class 1
    decisive = np.ones((10, 10), dtype=bool)
    decisive[0, 0] = False  # the flipped pixel was on the fence
    values = segmentation_metrics([_item(ref, decisive)], [_item(cand)])
    assert values["pixel_agreement"] == pytest.approx(0.99)
    assert values["min_image_agreement"] == pytest.approx(0.99)
    assert values["decisive_pixel_agreement"] == 1.0 and values["decisive_pixels"] == 99
    # class 0: 49 / 50; class 1: 50 / 51
    assert values["mean_iou"] == pytest.approx((49 / 50 + 50 / 51) / 2)
    assert values["classes_present"] == 2


def test_metrics_take_flat_maps_and_the_worst_image() -> None:
    """A probe stores maps flat: they compare with the engine's 2-D maps pixel for pixel."""
    a = np.arange(12, dtype=np.uint8).reshape(3, 4) % 3
    b = a.copy()
    b[0, :] = 2 - b[0, :]  # a third of the second image's pixels move
    values = segmentation_metrics([_item(a.reshape(-1)), _item(a.reshape(-1))], [_item(a), _item(b)])
    changed = float((a != b).mean())
    assert values["min_image_agreement"] == pytest.approx(1 - changed)
    assert values["pixel_agreement"] == pytest.approx(1 - changed / 2)
    assert "decisive_pixel_agreement" not in values  # no mask: not measured, so not gated
    with pytest.raises(ValueError, match="pixels"):
        segmentation_metrics([_item(a)], [_item(a[:2])])


def test_graph_resizes_logits_back_and_takes_the_argmax_as_pytorch() -> None:
    """The nodes after the network (Resize linear half-pixel, ArgMax, Cast) give exactly
    `F.interpolate(align_corners=False).argmax` for upscales, downscales and odd aspects."""
    import onnxruntime as ort
    import torch
    import torch.nn.functional as F
    from onnx import TensorProto, helper

    from ortpack.components.core.exporters.semantic_segmentation import append_map

    graph = helper.make_graph(
        [],
        "post",
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", "c", "h", "w"]),
            helper.make_tensor_value_info("images", TensorProto.UINT8, ["n", "H", "W", 3]),
        ],
        [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    append_map(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for (h, w), (height, width) in (((17, 23), (240, 320)), ((17, 23), (9, 11)), ((32, 32), (300, 97))):
        logits = F.avg_pool2d(torch.from_numpy(rng.normal(size=(2, 7, h, w)).astype(np.float32)), 3, 1, 1)
        images = np.zeros((2, height, width, 3), dtype=np.uint8)
        out = session.run(None, {"logits": logits.numpy(), "images": images})[0]
        expected = F.interpolate(logits, size=(height, width), mode="bilinear", align_corners=False).argmax(dim=1)
        assert out.dtype == np.uint8 and out.shape == (2, height, width)
        np.testing.assert_array_equal(out, expected.numpy())


@pytest.mark.parametrize("mode", ["shorter", "fixed"])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_preprocessing_keeps_the_aspect_or_stretches_within_a_level(mode: str, interpolation: str) -> None:
    import onnxruntime as ort
    import torch
    from torchvision.transforms import v2

    from ortpack.components.core.exporters.image_common import ImagePreprocess

    layout = ImagePreprocess(
        resize_size=96, crop_size=96, mean=(0, 0, 0), std=(1, 1, 1), interpolation=interpolation, mode=mode
    )
    session = ort.InferenceSession(layout.graph(17).SerializeToString(), providers=["CPUExecutionProvider"])
    resize = v2.Resize(96 if mode == "shorter" else [96, 96], interpolation=v2.InterpolationMode(interpolation))
    rng = np.random.default_rng(1)
    for height, width in ((123, 200), (300, 97), (60, 50)):
        images = rng.integers(0, 256, (2, height, width, 3), dtype=np.uint8)
        out = session.run(None, {"images": images})[0] * 255.0
        expected = resize(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
        assert out.shape == expected.shape
        # one level, two for bicubic upscales of tiny images (as the crop mode: image_common.py)
        assert np.abs(np.rint(out) - expected).max() <= (2.0 if interpolation == "bicubic" else 1.0)


def test_run_lengths_are_cocos_column_major_runs() -> None:
    from ortpack.serving.tasks.semantic_segmentation import run_lengths

    mask = np.array([[0, 1, 1], [0, 1, 0]], dtype=bool)  # column-major: 0 0 1 1 1 0
    assert run_lengths(mask) == [2, 3, 1]
    assert run_lengths(~mask) == [0, 2, 3, 1]  # starts true: a first run of zeros
    decoded = np.concatenate([np.full(n, i % 2, dtype=bool) for i, n in enumerate(run_lengths(mask))])
    np.testing.assert_array_equal(decoded.reshape(mask.shape, order="F"), mask)


def test_model_names_resolve_or_get_the_nearest_real_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ortpack.components.core.errors import ModelLoadError
    from ortpack.components.core.exporters.semantic_segmentation import (
        parse_segmentation_source,
        segmentation_builders,
    )

    assert {"deeplabv3_resnet50", "fcn_resnet50", "lraspp_mobilenet_v3_large"} <= set(segmentation_builders())
    assert parse_segmentation_source("fcn_resnet50").kind == "torchvision"
    with pytest.raises(ModelLoadError, match="did you mean 'deeplabv3_resnet50'"):
        parse_segmentation_source("deeplabv3_resnet5")
    classifier = tmp_path / "vit"
    classifier.mkdir()
    (classifier / "config.json").write_text('{"model_type": "vit", "architectures": ["ViTForImageClassification"]}')
    with pytest.raises(ModelLoadError, match="give --task image-classification"):
        parse_segmentation_source(str(classifier))
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match="not one transformers loads as a semantic segmenter"):
        parse_segmentation_source(str(bert))


def test_a_segmentation_checkpoint_given_to_the_classifier_is_told_its_task(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SegFormer is both an image classifier and a segmenter in transformers' tables: the
    checkpoint's own architectures decide, so a segmentation head is never loaded as a classifier
    (which would drop its decode head and start a random classifier)."""
    from ortpack.components.core.errors import ModelLoadError
    from ortpack.components.core.exporters.image_models import parse_image_source

    checkpoint = tmp_path / "segformer"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        '{"model_type": "segformer", "architectures": ["SegformerForSemanticSegmentation"]}'
    )
    with pytest.raises(ModelLoadError, match="give --task semantic-segmentation"):
        parse_image_source(str(checkpoint))


def test_a_label_map_holds_at_most_256_classes() -> None:
    from pydantic import ValidationError

    from ortpack.kernel.contracts.semantic_segmentation import SemanticSegmentationSettings

    pre = {"resize": "fixed", "size": 64, "mean": (0.5,) * 3, "std": (0.5,) * 3}
    SemanticSegmentationSettings(preprocessing=pre, labels=[str(i) for i in range(256)])
    with pytest.raises(ValidationError):
        SemanticSegmentationSettings(preprocessing=pre, labels=[str(i) for i in range(257)])


def test_images_whose_map_would_not_fit_are_refused_before_decoding() -> None:
    """The engine caps its decoder at the pixels whose resized logits fit 1 GiB (float32, one per
    class): an ADE20K-sized head refuses a 2 MP photo from its header."""
    from ortpack.kernel.contracts.semantic_segmentation import SIGNATURE, SemanticSegmentationSettings
    from ortpack.kernel.engine import EngineContext, EngineOptions
    from ortpack.kernel.engines.semantic_segmentation import SegmentationEngine, max_map_pixels
    from ortpack.kernel.errors import InputTooLargeError
    from tests.photos import encode

    assert max_map_pixels(21, 40_000_000) == (1 << 30) // 84
    assert max_map_pixels(6, 40_000_000) == 40_000_000  # the server's own limit is lower
    pre = {"resize": "fixed", "size": 64, "mean": (0.5,) * 3, "std": (0.5,) * 3}
    settings = SemanticSegmentationSettings(preprocessing=pre, labels=[str(i) for i in range(150)])
    ctx = EngineContext(
        settings=settings,
        signature=SIGNATURE,
        sizes={},
        session=None,
        options=EngineOptions(max_image_pixels=40_000_000),
    )
    engine = SegmentationEngine(ctx)
    assert engine.max_image_pixels == (1 << 30) // 600
    small = encode(np.zeros((600, 800, 3), dtype=np.uint8), "PNG")
    assert engine.decoder.decode(small, "small").shape == (600, 800, 3)
    large = encode(np.zeros((1200, 1600, 3), dtype=np.uint8), "PNG")
    with pytest.raises(InputTooLargeError):
        engine.decoder.decode(large, "large")
