"""Hugging Face vision encoders as image embedders (slow), proven structurally on tiny random
configurations built here (nothing downloaded; no trained weights of these install offline):
each exports with its model card's pooling and its processor's preprocessing, and its fp32
variant passes the gate against PyTorch, retrieval included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

CLIP_MEAN, CLIP_STD = [0.4815, 0.4578, 0.4082], [0.2686, 0.2613, 0.2758]
SHORTEST_CROP = {"size": {"shortest_edge": 72}, "do_center_crop": True, "crop_size": {"height": 64, "width": 64}}
FIXED = {"size": {"height": 64, "width": 64}, "do_center_crop": False}


def tiny(model_type: str) -> tuple[Any, dict[str, Any]]:
    """(a random model of `model_type` at 64 px, its preprocessor_config.json)."""
    import torch
    import transformers as t

    torch.manual_seed(0)
    vit = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    processor = {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3, **SHORTEST_CROP}
    if model_type == "dinov2":
        model = t.Dinov2Model(t.Dinov2Config(image_size=64, patch_size=16, **vit))
    elif model_type == "vit":
        model = t.ViTModel(t.ViTConfig(image_size=64, patch_size=16, **vit), add_pooling_layer=False)
        processor = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 2, **FIXED}
    elif model_type == "convnext":
        config = t.ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], image_size=64)
        model = t.ConvNextModel(config)
        processor = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3,
                     "size": {"shortest_edge": 64}, "crop_pct": 0.875}  # fmt: skip
    elif model_type == "clip_vision_model":
        model = t.CLIPVisionModelWithProjection(
            t.CLIPVisionConfig(image_size=64, patch_size=16, projection_dim=24, **vit)
        )
    else:
        model = t.SiglipVisionModel(t.SiglipVisionConfig(image_size=64, patch_size=16, **vit))
        processor = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 2, **FIXED}
    return model.eval(), processor


def checkpoint(root: Path, model_type: str) -> Path:
    model, processor = tiny(model_type)
    path = root / f"tiny-{model_type}"
    model.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


@pytest.mark.parametrize(
    ("model_type", "flags", "pooling", "dim"),
    [
        ("dinov2", {}, "cls", 32),
        ("vit", {"resize_size": 64, "crop_size": 64}, "cls", 32),
        ("convnext", {}, "mean", 64),
        ("clip_vision_model", {}, "projection", 24),
        ("siglip_vision_model", {"resize_size": 64, "crop_size": 64}, "attention", 32),
    ],
)
def test_hf_encoder_exports_with_its_pooling_and_passes_fp32(
    model_type: str, flags: dict[str, int], pooling: str, dim: int, tmp_path: Path
) -> None:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    path = checkpoint(tmp_path, model_type)
    export_dir = tmp_path / "export"
    spec = ExportSpec(source=str(path), task="image-embedding", name="tiny", options=flags)
    export_model(spec, export_dir)
    export = ExportResult.load(export_dir)
    assert export.source["kind"] == "huggingface" and export.source["weights_sha256"]
    assert export.task_settings["pooling"] == pooling and export.outputs[0]["shape"] == ["batch", dim]
    if model_type == "convnext":  # shortest edge 64 / crop_pct 0.875, then the 64 px crop
        assert export.task_settings["preprocessing"]["resize_size"] == 73
    variant = VariantSpec(target="cpu", precision="fp32")
    optimize_model(export_dir, variant, tmp_path / variant.id)
    report = validate_variant(tmp_path / variant.id, export_dir, thresholds_for("image-embedding", "fp32"))
    assert report.passed, report.misses
    assert report.values["served.exact.min_cosine"] > 0.999 and report.values["retrieval_recall_ratio"] >= 0.99


def test_a_stretching_processor_needs_the_crop_said(tmp_path: Path) -> None:
    from ortpack.components.core.errors import OrtpackError
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    path = checkpoint(tmp_path, "vit")
    with pytest.raises(OrtpackError, match="give --resize-size and --crop-size"):
        export_model(ExportSpec(source=str(path), task="image-embedding", name="tiny"), tmp_path / "export")
    with pytest.raises(OrtpackError, match="--weights does not apply"):
        spec = ExportSpec(source=str(path), task="image-embedding", name="tiny", options={"weights": "w.pth"})
        export_model(spec, tmp_path / "export")
