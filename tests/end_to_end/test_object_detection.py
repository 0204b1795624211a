"""A torchvision detector end to end (slow): SSDlite320-MobileNetV3 by its builder's name, its own
transform and post-processing exported whole for one image a call, random weights made
non-degenerate (tests/models.py; nothing downloaded), gated on the encoded validation files,
packaged and served; concurrent requests of different sizes each get their own image's detections
(the bundle's `max_batch` 1: the server never stacks two images into this graph)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.photos import encode, source_image
from tests.servers import running_server

pytestmark = pytest.mark.slow

MODEL = "ssdlite320_mobilenet_v3_large"


@pytest.fixture(scope="module")
def ssd(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """(bundle, weights, build result): the fp32 variant through the normal build."""
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from tests.models import make_detection_weights

    root = tmp_path_factory.mktemp("ssd")
    weights = make_detection_weights(MODEL, root / "ssd.safetensors")
    spec = BuildSpec(
        export=ExportSpec(
            source=MODEL,
            task="object-detection",
            name="ssd",
            options={"weights": str(weights), "score_threshold": 0.2},
        ),
        variants=tuple(variant_grid(["cpu"], ["fp32"])),
    )
    return root / "dist", weights, build_bundle(spec, root / "dist", work_dir=root / "work")


def test_the_builders_graph_passes_the_fp32_gate(ssd: tuple[Path, Path, Any]) -> None:
    from ortpack.kernel.bundle import verify_bundle

    bundle, _, result = ssd
    manifest = verify_bundle(bundle)
    settings = manifest.task_settings
    assert settings.max_batch == 1 and settings.preprocessing.mode == "model"
    assert settings.thresholds.score == 0.2 and len(settings.labels) == 91 and settings.labels[1] == "person"
    assert not result.export.degenerate_reference and result.export.metrics["reference_detections"] > 500
    values = manifest.variant("cpu-fp32").parity.values
    assert values["matched_recall"] == values["matched_precision"] == 1.0
    assert values["min_matched_iou"] > 0.999 and values["max_score_diff"] < 1e-3
    assert "batch.images" not in values  # one image a call: no batch scope


def test_concurrent_images_each_get_their_own_detections(ssd: tuple[Path, Path, Any], tmp_path: Path) -> None:
    import torchvision
    from safetensors.torch import load_file

    from ortpack.components.core.exporters.object_detection import BoxesDetector, _set_thresholds
    from ortpack.kernel.contracts.object_detection import Thresholds
    from ortpack.kernel.engines.object_detection import detection_metrics

    bundle, weights, _ = ssd
    network = torchvision.models.get_model(MODEL, weights=None, weights_backbone=None)
    network.load_state_dict(load_file(str(weights)))
    _set_thresholds(network.eval(), Thresholds(score=0.2, iou=0.45, max_detections=100))
    reference = BoxesDetector(network).eval().reference
    images = [source_image(name) for name in ("astronaut", "chelsea", "coffee", "camera")]  # three sizes
    files = [encode(image, "PNG") for image in images]
    expected = [reference(image) for image in images]
    assert sum(bool(len(e["scores"])) for e in expected) >= 3  # and one where it finds nothing

    async def send(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(
                *(client.post("/v1/detect", content=f, headers={"content-type": "image/png"}) for f in files * 2)
            )

    with running_server(bundle, log_dir=tmp_path) as server:
        answers = asyncio.run(send(server.url))
    assert [a.status_code for a in answers] == [200] * 8
    for answer, want in zip(answers, expected * 2, strict=True):
        body = answer.json()
        got = {
            "boxes": np.array([d["box"] for d in body["detections"]], dtype=np.float32).reshape(-1, 4),
            "scores": np.array([d["score"] for d in body["detections"]], dtype=np.float32),
            "labels": np.array([d["index"] for d in body["detections"]], dtype=np.int64),
        }
        metrics = detection_metrics([want], [got], 0.2)
        assert metrics["matched_f1"] == 1.0 and metrics["max_box_diff_px"] < 0.05, metrics
        assert all(d["label"] for d in body["detections"])
