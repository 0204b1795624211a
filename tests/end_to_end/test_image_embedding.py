"""Image embeddings end to end (slow): a torchvision classifier builder with its head dropped (a
random-weight MobileNetV3-small made non-degenerate, its state_dict: tests/models.py; nothing
downloaded), gated on distance, cosine, neighbours and retrieval, int8 chosen by the search,
packaged, compared with `bundle diff`, and served to the official `openai` client."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ortpack.components.core.validation_data import ImageSpec, render_image
from tests.photos import encode
from tests.request_bodies import check_answers, verdicts
from tests.servers import running_server

pytestmark = pytest.mark.slow

MODEL = "mobilenet_v3_small"


def build(root: Path, weights: Path, precisions: list[str], **options: Any) -> Any:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid

    spec = BuildSpec(
        export=ExportSpec(
            source=MODEL, task="image-embedding", name="mnv3s-emb", options={"weights": str(weights), **options}
        ),
        variants=tuple(variant_grid(["cpu"], precisions)),
    )
    return build_bundle(spec, root / "dist", work_dir=root / "work")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_image_weights

    return make_image_weights(MODEL, tmp_path_factory.mktemp("weights") / "mnv3s.safetensors")


@pytest.fixture(scope="module")
def embedder(weights: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("emb")
    return root / "dist", build(root, weights, ["fp32", "int8"])


def test_the_head_is_dropped_and_fp32_passes_its_gate(embedder: tuple[Path, Any]) -> None:
    from ortpack.kernel.bundle import embedding_space, verify_bundle

    bundle, result = embedder
    manifest = verify_bundle(bundle)
    assert manifest.outputs[0].shape == ["batch", 1024]  # MobileNetV3-small's hidden features, not 1000 classes
    settings = manifest.task_settings
    assert settings.pooling == "features" and settings.normalize and settings.preprocessing.crop_size == 224
    fp32 = manifest.variant("cpu-fp32").parity.values
    assert fp32["min_cosine"] >= 0.9999 and fp32["served.exact.min_cosine"] >= 0.9999
    assert fp32["retrieval_recall_ratio"] == 1.0 and fp32["retrieval.copies"] == 2 * fp32["served.images"]
    assert fp32["retrieval.reference_recall_at_10"] > 0.5  # the copies find their originals
    space = embedding_space(manifest, manifest.variant("cpu-fp32"))
    assert space is not None and space.dimensions == 1024 and space.model_dump()["pooling"] == "features"
    (int8,) = [r for r in result.records if r.variant_id == "cpu-int8"]
    chosen = int8.built.metrics["int8"]
    assert chosen["recipe"] in chosen["candidates"]  # chosen by the search
    assert ("cpu-int8" in [v.id for v in manifest.variants]) == int8.passed


def test_bundle_diff_says_drop_in_re_index_or_incompatible(
    embedder: tuple[Path, Any], weights: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from ortpack.components.core.compat import diff_bundles

    bundle, _ = embedder
    assert diff_bundles(str(bundle), str(bundle)).verdict == "drop-in"
    state = load_file(str(weights))
    torch.manual_seed(1)  # the features' own layer perturbed (576 -> 1024): the same net, other vectors
    layer = state["classifier.0.weight"]
    noisy = {**state, "classifier.0.weight": layer + 0.7 * layer.std() * torch.randn_like(layer)}
    save_file(noisy, str(tmp_path / "noisy.safetensors"))
    perturbed = build(tmp_path / "noisy", tmp_path / "noisy.safetensors", ["fp32"])
    diff = diff_bundles(str(bundle), str(tmp_path / "noisy" / "dist"))
    assert perturbed.manifest.variants and diff.verdict == "re-index", diff.table()
    classes = build(tmp_path / "keep", weights, ["fp32"], head="keep")
    assert classes.manifest.outputs[0].shape == ["batch", 1000]
    other = diff_bundles(str(bundle), str(tmp_path / "keep" / "dist"))
    assert other.verdict == "incompatible" and "dimensions differ: 1024 -> 1000" in other.worst_pair().reason


def test_openai_client_raw_bytes_and_v2_get_pytorchs_vectors(embedder: tuple[Path, Any], tmp_path: Path) -> None:
    import openai

    from ortpack.kernel.bundle import embedding_space, verify_bundle
    from ortpack.kernel.gates import cosine_rows

    bundle, result = embedder
    manifest = verify_bundle(bundle)
    space = embedding_space(manifest, manifest.variant("cpu-fp32"))
    images = [
        render_image(ImageSpec(h, w, "smooth", i)) for i, (h, w) in enumerate([(240, 320), (480, 360), (300, 300)])
    ]
    files = [encode(image, "PNG") for image in images]
    with np.load(Path(result.records[0].model_dir).parent.parent / "export" / "reference.npz") as ref:
        served_files, served = [bytes(f) for f in _files(ref)], ref["served_outputs"]
    with running_server(bundle, "--variant", "cpu-fp32", log_dir=tmp_path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        got = client.embeddings.create(
            model="mnv3s-emb", input=[base64.b64encode(f).decode() for f in served_files[:4]]
        )
        rows = np.array([d.embedding for d in got.data], dtype=np.float32)  # the client asked for base64
        assert rows.shape == (4, 1024) and cosine_rows(rows, served[:4]).min() > 0.9999
        as_float = client.embeddings.create(
            model="mnv3s-emb",
            input="data:image/png;base64," + base64.b64encode(files[0]).decode(),
            encoding_format="float",
        )
        one = np.array(as_float.data[0].embedding, dtype=np.float32)
        assert abs(float(np.linalg.norm(one)) - 1.0) < 1e-5

        raw = httpx.post(f"{server.url}/v1/embeddings/image", content=files[0], headers={"content-type": "image/png"})
        assert raw.status_code == 200 and raw.headers["x-embedding-space"] == space.id
        np.testing.assert_allclose(raw.json()["data"][0]["embedding"], one, atol=1e-6)

        # a large image first in its body is decoded from the body's bytes (serving/http.py
        # `lifted_member`): the vector a body parsed whole gets, and the rest still validated
        blob = base64.b64encode(encode(render_image(ImageSpec(300, 400, "noisy", 3)), "PNG")).decode()
        lifted, whole = (
            httpx.post(f"{server.url}/v1/embeddings", content=body, headers={"content-type": "application/json"})
            for body in (
                f'{{"input": "{blob}", "model": "mnv3s-emb", "encoding_format": "float"}}',
                f'{{"model": "mnv3s-emb", "encoding_format": "float", "input": "{blob}"}}',
            )
        )
        assert lifted.status_code == whole.status_code == 200, lifted.text
        np.testing.assert_allclose(lifted.json()["data"][0]["embedding"], whole.json()["data"][0]["embedding"])
        refused = httpx.post(f"{server.url}/v1/embeddings", json={"input": blob, "dimensions": 64})
        assert refused.status_code == 400 and "dimensions" in refused.json()["error"]["message"]

        tensor = {
            "name": "images",
            "datatype": "UINT8",
            "shape": [1, *images[0].shape],
            "data": images[0].ravel().tolist(),
        }
        v2 = httpx.post(f"{server.url}/v2/models/mnv3s-emb/infer", json={"inputs": [tensor]}, timeout=60)
        assert v2.status_code == 200, v2.text
        (output,) = v2.json()["outputs"]
        assert output["name"] == "image_embedding" and output["shape"] == [1, 1024]
        np.testing.assert_allclose(output["data"], one, atol=1e-5)

        for bad, status in (
            ({"input": "not base64!"}, 400),
            ({"input": base64.b64encode(b"not an image").decode()}, 400),
            ({"input": base64.b64encode(files[0]).decode(), "dimensions": 64}, 400),
        ):
            refused = httpx.post(f"{server.url}/v1/embeddings", json=bad)
            assert refused.status_code == status and set(refused.json()["error"]) == {"message", "type", "code"}
        doc = httpx.get(f"{server.url}/openapi.json").json()
        answers = []
        for body, _ in verdicts(doc, "/v1/embeddings#image"):
            response = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
            answers.append((body, response.status_code, response.json()))
        check_answers(doc, "/v1/embeddings#image", answers)


def _files(ref: Any) -> list[bytes]:
    from ortpack.components.core.validation_data import unpack_files

    return unpack_files(ref["served_offsets"], ref["served_data"])


def test_retrieval_copies_are_other_files_of_the_same_image() -> None:
    from PIL import Image

    from ortpack.components.core.exporters.image_retrieval import retrieval_copies

    files = [encode(render_image(ImageSpec(200, 300, "smooth", 1)), "PNG")]
    copies, targets = retrieval_copies(files)
    assert targets == [0, 0] and len(set(copies)) == 2
    sizes = [Image.open(io.BytesIO(c)).size for c in copies]
    assert sizes == [(255, 170), (150, 100)]
