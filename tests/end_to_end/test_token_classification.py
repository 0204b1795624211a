"""The fourth task, token-classification (named-entity recognition): a tiny random-weight tagger
and one on all-MiniLM-L6-v2's trained trunk, built, gated on token-label agreement, and served
through /v1/ner (checked against Hugging Face's own token-classification pipeline) and v2."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from ortpack.kernel.bundle import verify_bundle
from tests.request_bodies import BODIES, check_answers
from tests.servers import RunningServer, running_server

pytestmark = pytest.mark.slow  # builds tagger bundles

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = [
    "Ada Lovelace worked with Charles Babbage in London.",
    "Grace Hopper visited Paris, then Rome.",
    "nothing to see here",
]


def make_tagger(out: Path, *, trunk: Path | None = None, seed: int = 0, head_scale: float = 6.0) -> Path:
    """A BERT token classifier over LABELS: tiny and random, or on `trunk`'s trained encoder."""
    from tests.models import make_labelled_model

    return make_labelled_model(out, "token", LABELS, trunk=trunk, seed=seed, head_scale=head_scale)


def _build(checkpoint: Path, out: Path, work: Path, **options: object) -> Path:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid

    spec = BuildSpec(
        export=ExportSpec(source=str(checkpoint), task="token-classification", name=checkpoint.name, options=options),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    build_bundle(spec, out, work_dir=work)
    return out


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoint, bundle) of the tiny random tagger."""
    root = tmp_path_factory.mktemp("tagger")
    checkpoint = make_tagger(root / "tiny-ner")
    return checkpoint, _build(checkpoint, root / "dist" / "tiny-ner", root / "work")


@pytest.fixture(scope="module")
def tagger_server(tagger: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    with running_server(tagger[1], "--variant", "cpu-fp32", log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server  # type: ignore[misc]


def test_ner_answers_as_its_schema_says(tagger_server: RunningServer) -> None:
    """Each body its published schema refuses gets 400, each it accepts an answer valid by the
    answer schema (tests/request_bodies.py)."""
    doc = httpx.get(f"{tagger_server.url}/openapi.json").json()
    answers = []
    for body, _ in BODIES["/v1/ner"]:
        answer = httpx.post(f"{tagger_server.url}/v1/ner", json=body)
        answers.append((body, answer.status_code, answer.json()))
    check_answers(doc, "/v1/ner", answers)


def test_tagger_bundle_passes_its_gates(tagger: tuple[Path, Path]) -> None:
    manifest = verify_bundle(tagger[1])
    assert manifest.task == "token-classification" and manifest.task_settings.labels == LABELS
    assert [o.shape for o in manifest.outputs] == [["batch", "sequence", len(LABELS)]]
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]
    fp32 = manifest.variant("cpu-fp32").parity
    assert fp32.values["token_agreement"] == 1.0 and fp32.values["max_abs_diff"] < 1e-4
    assert fp32.values["b32.token_agreement"] == 1.0  # padded batches change nothing
    for variant in manifest.variants:
        assert variant.parity.passed and variant.parity.probe is not None and variant.parity.probe.passed
        assert variant.parity.values["token_agreement"] >= variant.parity.thresholds["min_token_agreement"]
    # the reference spreads over labels: the gate is not vacuous
    ref = np.load(next((tagger[1].parent.parent / "work").rglob("reference.npz")))
    real = ref["outputs"][..., 0] >= 0
    assert len(np.unique(ref["outputs"][real].argmax(axis=1))) >= 3


def test_the_gate_can_fail(tagger: tuple[Path, Path]) -> None:
    """The int8 graph judged by the fp32 gate misses it: the numbers are measured, not assumed."""
    from ortpack.components.core.parity import check_parity
    from ortpack.components.core.tasks import thresholds_for

    work = tagger[1].parent.parent / "work"
    int8 = next(p for p in work.rglob("model.onnx") if "int8" in str(p.parent))
    reference = next(work.rglob("reference.npz"))
    report = check_parity(int8, reference, thresholds_for("token-classification", "fp32"), variant_id="int8")
    assert not report.passed and any(m.startswith("max_abs_diff") for m in report.misses)


def _pipeline_entities(checkpoint: Path, text: str) -> list[tuple[str, int, int, float]]:
    """Hugging Face's own answer: the PyTorch model, `aggregation_strategy="first"`."""
    from transformers import pipeline

    tagger = pipeline("token-classification", model=str(checkpoint), aggregation_strategy="first", device="cpu")
    return [(e["entity_group"], int(e["start"]), int(e["end"]), float(e["score"])) for e in tagger(text)]


def test_ner_route_matches_the_transformers_pipeline(tagger: tuple[Path, Path], tagger_server: RunningServer) -> None:
    answer = httpx.post(f"{tagger_server.url}/v1/ner", json={"input": TEXTS}).json()
    assert [d["index"] for d in answer["data"]] == [0, 1, 2] and answer["usage"]["total_tokens"] > 0
    found = 0
    for text, item in zip(TEXTS, answer["data"], strict=True):
        expected = _pipeline_entities(tagger[0], text)
        got = [(e["entity"], e["start"], e["end"], e["score"]) for e in item["entities"]]
        assert [g[:3] for g in got] == [e[:3] for e in expected], text
        assert [g[3] for g in got] == pytest.approx([e[3] for e in expected], abs=1e-4)
        assert all(e["word"] == text[e["start"] : e["end"]] for e in item["entities"])
        found += len(got)
    assert found > 0  # the random head labels some words as entities
    assert verify_bundle(tagger[1]).task_settings.aggregation == "first"  # the bundle's default
    tokens = httpx.post(f"{tagger_server.url}/v1/ner", json={"input": TEXTS[0], "aggregation": "none"}).json()
    labels = {e["entity"] for e in tokens["data"][0]["entities"]}
    assert labels and labels <= set(LABELS) - {"O"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing 'input'"),
        ({"input": "  "}, "input[0] is empty"),
        ({"input": []}, "input"),
        ({"input": "x", "aggregation": "max"}, "aggregation"),
        ({"input": "x", "top_k": 3}, "top_k: Extra inputs are not permitted"),
        ({"input": "x", "model": "other"}, "not found"),
    ],
)
def test_ner_refuses_bad_requests(tagger_server: RunningServer, body: dict[str, object], message: str) -> None:
    answer = httpx.post(f"{tagger_server.url}/v1/ner", json=body)
    assert answer.status_code in (400, 404) and message in answer.json()["error"]["message"]


def test_tagger_v2_metadata_and_infer(tagger_server: RunningServer) -> None:
    meta = httpx.get(f"{tagger_server.url}/v2/models/tiny-ner").json()
    assert meta["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, -1, len(LABELS)]}]
    assert meta["parameters"]["node_check"]["passed"]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}]}
    out = httpx.post(f"{tagger_server.url}/v2/models/tiny-ner/infer", json=body).json()["outputs"][0]
    rows = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    assert out["shape"][0] == 2 and out["shape"][2] == len(LABELS)
    real = rows[..., 0] >= 0  # -1 past each text's tokens
    assert real[:, 0].all() and 0 < real[0].sum() < rows.shape[1]
    assert rows[real].sum(axis=1) == pytest.approx(np.ones(int(real.sum())), abs=1e-5)
    assert (rows[~real] == -1).all()
    paths = set(httpx.get(f"{tagger_server.url}/openapi.json").json()["paths"])
    assert "/v1/ner" in paths and "/v1/classify" not in paths


@pytest.mark.slow
def test_trained_trunk_tagger_int8_gate(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2's trained encoder under a seeded head: int8 passes token agreement with
    the real weights' quantization error (the random tiny model says little about int8)."""
    from tests.models import minilm_dir

    checkpoint = make_tagger(tmp_path / "minilm-ner", trunk=minilm_dir(), head_scale=8.0)
    manifest = verify_bundle(_build(checkpoint, tmp_path / "dist", tmp_path / "work", max_length=128))
    int8 = manifest.variant("cpu-int8").parity
    assert int8.passed and int8.values["token_agreement"] >= 0.85
    assert manifest.variant("cpu-fp32").parity.values["token_agreement"] == 1.0


def test_the_task_owns_its_options() -> None:
    """`aggregation` is token-classification's own option: no flag or shared field was added for it."""
    from ortpack.components.core.errors import InvalidSpecError
    from ortpack.components.core.specs import ExportSpec
    from ortpack.kernel.contracts.token_classification import TokenOptions

    spec = ExportSpec(source="x", task="token-classification", name="t", options={"aggregation": "none"})
    assert spec.options_as(TokenOptions).aggregation == "none"
    with pytest.raises(InvalidSpecError, match="aggregation: Input should be 'first' or 'none'"):
        ExportSpec(source="x", task="token-classification", name="t", options={"aggregation": "max"})
    with pytest.raises(InvalidSpecError, match="--aggregation does not apply to task 'text-embedding'"):
        ExportSpec(source="x", task="text-embedding", name="t", options={"aggregation": "none"})
