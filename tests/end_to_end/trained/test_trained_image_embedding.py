"""A trained image embedder end to end (slow): EfficientNet-Lite0 with its ImageNet weights
(examples/efficientnet_lite.py, its classifier head dropped: 1280-d pooled features), gated on
natural photographs (tests/photos.py) with the retrieval check, and served to the official
`openai` client: photos of the same subject come out nearest each other."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from tests.photos import encode, source_image
from tests.servers import running_server

pytestmark = pytest.mark.slow

MEAN, STD = (127 / 255,) * 3, (128 / 255,) * 3  # Lite models take (x * 255 - 127) / 128


@pytest.fixture(scope="module")
def lite0_embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from tests.photos import write_photo_sets
    from tests.trained import NotInstalled, efficientnet_lite0_weights

    try:
        weights = efficientnet_lite0_weights()
    except NotInstalled as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("lite0-embedding")
    photos = write_photo_sets(root / "photos", validation=24, calibration=16, heldout=0)
    spec = BuildSpec(
        export=ExportSpec(
            source="examples.efficientnet_lite:efficientnet_lite0",
            task="image-embedding",
            name="lite0-embedding",
            options={
                "weights": str(weights),
                "head": "drop",
                "mean": MEAN,
                "std": STD,
                "validation_images": str(photos.validation),
                "calibration_images": str(photos.calibration),
            },
        ),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    build_bundle(spec, root / "dist", work_dir=root / "work")
    return root / "dist"


def test_lite0_embeddings_pass_on_photos_and_serve_to_the_openai_client(lite0_embedder: Path, tmp_path: Path) -> None:
    import openai

    from ortpack.kernel.bundle import verify_bundle

    manifest = verify_bundle(lite0_embedder)
    assert manifest.outputs[0].shape == ["batch", 1280] and manifest.source.kind == "factory"
    fp32 = manifest.variant("cpu-fp32").parity.values
    assert fp32["served.exact.min_cosine"] >= 0.9999 and fp32["min_cosine"] >= 0.999
    assert fp32["retrieval_recall_ratio"] == 1.0 and fp32["retrieval.reference_recall_at_10"] >= 0.9

    # two crops of the astronaut and one of the cat: the astronaut's crops are nearest each other
    astronaut, cat = source_image("astronaut"), source_image("chelsea")
    photos = [astronaut[:400, :400], astronaut[100:, 100:], cat]
    inputs = [base64.b64encode(encode(p, "JPEG", quality=90)).decode() for p in photos]
    with running_server(lite0_embedder, log_dir=tmp_path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        answer = client.embeddings.create(model="lite0-embedding", input=inputs)
    rows = np.array([d.embedding for d in answer.data])
    assert rows.shape == (3, 1280) and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    similarity = rows @ rows.T
    assert similarity[0, 1] > max(similarity[0, 2], similarity[1, 2])


def test_lite0_int8_embeddings_run_on_int8_kernels(lite0_embedder: Path) -> None:
    """Static int8 of the trained network: on a CPU that sums u8 x s8 exactly (8-bit weights) it
    passes the embedding gate (min cosine 0.992 measured, EfficientNet-Lite0 with its head, AMD EPYC
    with VNNI), every convolution an int8 kernel; elsewhere (7-bit weights) the gate decides."""
    from ortpack.kernel.bundle import verify_bundle
    from ortpack.kernel.hardware import this_machine

    manifest = verify_bundle(lite0_embedder)
    ids = [v.id for v in manifest.variants]
    if this_machine().exact_int8_dot:
        assert "cpu-int8" in ids
    if "cpu-int8" in ids:
        variant = manifest.variant("cpu-int8")
        assert variant.optimize.int8 is not None
        kernels = variant.optimize.int8.kernels
        assert kernels["dequantized_float"] == [] and kernels["int8"]["QLinearConv"] >= 40
        assert variant.parity.values["min_cosine"] >= 0.98
