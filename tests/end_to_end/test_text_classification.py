"""The third task, text-classification: a sequence classifier and a cross-encoder reranker built
from tiny random-weight checkpoints, gated, served through /v1/classify, /v1/rerank and v2."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from ortpack.kernel.bundle import read_manifest, verify_bundle
from tests.request_bodies import BODIES, check_answers
from tests.servers import RunningServer, running_server

pytestmark = pytest.mark.slow  # builds a classifier and a reranker bundle


def _build(checkpoint: Path, out: Path, work: Path) -> Path:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid

    spec = BuildSpec(
        export=ExportSpec(source=str(checkpoint), task="text-classification", name=checkpoint.name),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    build_bundle(spec, out, work_dir=work)
    return out


@pytest.fixture(scope="module")
def classifier_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_tiny_classifier

    root = tmp_path_factory.mktemp("classifier")
    checkpoint = make_tiny_classifier(root / "tiny-sentiment", num_labels=3)
    return _build(checkpoint, root / "dist" / "tiny-sentiment", root / "work")


@pytest.fixture(scope="module")
def reranker_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_tiny_classifier

    root = tmp_path_factory.mktemp("reranker")
    checkpoint = make_tiny_classifier(root / "tiny-reranker", num_labels=1, seed=1)
    return _build(checkpoint, root / "dist" / "tiny-reranker", root / "work")


@pytest.fixture(scope="module")
def classifier_server(classifier_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    with running_server(classifier_bundle, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server  # type: ignore[misc]


@pytest.fixture(scope="module")
def reranker_server(reranker_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    with running_server(reranker_bundle, log_dir=tmp_path_factory.mktemp("logs")) as server:
        yield server  # type: ignore[misc]


def test_rerank_answers_as_its_schema_says(reranker_server: RunningServer) -> None:
    """Each body its published schema refuses gets 400, each it accepts an answer valid by the
    answer schema (tests/request_bodies.py)."""
    doc = httpx.get(f"{reranker_server.url}/openapi.json").json()
    answers = []
    for body, _ in BODIES["/v1/rerank"]:
        answer = httpx.post(f"{reranker_server.url}/v1/rerank", json=body)
        answers.append((body, answer.status_code, answer.json()))
    check_answers(doc, "/v1/rerank", answers)


def test_classify_answers_as_its_schema_says(classifier_server: RunningServer) -> None:
    """Each body its published schema refuses gets 400, each it accepts an answer valid by the
    answer schema (tests/request_bodies.py)."""
    doc = httpx.get(f"{classifier_server.url}/openapi.json").json()
    answers = []
    for body, _ in BODIES["/v1/classify"]:
        answer = httpx.post(f"{classifier_server.url}/v1/classify", json=body)
        answers.append((body, answer.status_code, answer.json()))
    check_answers(doc, "/v1/classify", answers)


def test_classifier_bundle_passes_its_gates(classifier_bundle: Path) -> None:
    manifest = verify_bundle(classifier_bundle)
    assert manifest.task == "text-classification"
    assert (
        manifest.task_settings.classification is not None
        and manifest.task_settings.classification.activation == "softmax"
    )
    assert not manifest.task_settings.classification.pairs and manifest.task_settings.labels == [
        "negative",
        "neutral",
        "positive",
    ]
    assert [o.name for o in manifest.outputs] == ["probabilities"]
    fp32 = manifest.variant("cpu-fp32").parity
    assert fp32.values["max_abs_diff"] < 1e-5 and fp32.values["top1_agreement"] == 1.0
    assert "rank_agreement" not in fp32.values  # classifiers are not rankers
    assert fp32.probe is not None and fp32.probe.passed


def test_reranker_bundle_is_gated_on_rank_agreement(reranker_bundle: Path) -> None:
    manifest = read_manifest(reranker_bundle)
    assert manifest.task_settings.classification is not None and manifest.task_settings.classification.pairs
    assert manifest.task_settings.classification.activation == "sigmoid"
    assert [o.name for o in manifest.outputs] == ["scores"]
    for variant in manifest.variants:
        assert variant.parity.values["rank_agreement"] >= variant.parity.thresholds["min_rank_agreement"]
    assert manifest.variant("cpu-fp32").parity.values["rank_agreement"] > 0.999


def test_classify_route(classifier_server: RunningServer) -> None:
    answer = httpx.post(
        f"{classifier_server.url}/v1/classify", json={"input": ["what a lovely day", "terrible service"], "top_k": 2}
    ).json()
    assert [d["index"] for d in answer["data"]] == [0, 1]
    for item in answer["data"]:
        probs = [p["probability"] for p in item["predictions"]]
        assert len(probs) == 2 and probs == sorted(probs, reverse=True)
        assert {p["label"] for p in item["predictions"]} <= {"negative", "neutral", "positive"}
    # one text alone gets the same probabilities (fp32 is batch-invariant)
    alone = httpx.post(f"{classifier_server.url}/v1/classify", json={"input": "terrible service", "top_k": 3}).json()
    full = {p["label"]: p["probability"] for p in alone["data"][0]["predictions"]}
    assert sum(full.values()) == pytest.approx(1.0, abs=1e-5)
    bad = httpx.post(f"{classifier_server.url}/v1/classify", json={"input": "x", "top_k": 0})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
    assert httpx.post(f"{classifier_server.url}/v1/rerank", json={"query": "q", "documents": ["d"]}).status_code == 404


def test_classifier_v2_and_openapi(classifier_server: RunningServer) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["good", "bad"]}]}
    out = httpx.post(f"{classifier_server.url}/v2/models/tiny-sentiment/infer", json=body).json()["outputs"][0]
    assert out["name"] == "probabilities" and out["shape"] == [2, 3]
    assert np.asarray(out["data"]).reshape(2, 3).sum(axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    paths = set(httpx.get(f"{classifier_server.url}/openapi.json").json()["paths"])
    assert "/v1/classify" in paths and "/v1/embeddings" not in paths and "/v1/rerank" not in paths


def test_rerank_route(reranker_server: RunningServer) -> None:
    documents = ["Boil the pasta in salted water.", "The stock market fell today.", "Cook spaghetti for ten minutes."]
    answer = httpx.post(
        f"{reranker_server.url}/v1/rerank",
        json={"query": "how long to cook pasta", "documents": documents, "return_documents": True},
    ).json()
    results = answer["results"]
    scores = [r["relevance_score"] for r in results]
    assert sorted(r["index"] for r in results) == [0, 1, 2] and scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)  # sigmoid in the graph
    assert all(r["document"]["text"] == documents[r["index"]] for r in results)
    top = httpx.post(
        f"{reranker_server.url}/v1/rerank",
        json={"query": "how long to cook pasta", "documents": [{"text": d} for d in documents], "top_n": 1},
    ).json()["results"]
    assert len(top) == 1 and top[0]["index"] == results[0]["index"] and "document" not in top[0]
    # v2: (query, document) rows score the same as /v1/rerank
    rows = [x for d in documents for x in ("how long to cook pasta", d)]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3, 2], "data": rows}]}
    out = httpx.post(f"{reranker_server.url}/v2/models/tiny-reranker/infer", json=body).json()["outputs"][0]
    by_index = {r["index"]: r["relevance_score"] for r in results}
    assert out["name"] == "scores" and out["data"] == pytest.approx([by_index[i] for i in range(3)], abs=1e-5)
    for bad in ({"query": "", "documents": ["x"]}, {"query": "q", "documents": []}, {"query": "q", "documents": [1]}):
        error = httpx.post(f"{reranker_server.url}/v1/rerank", json=bad)
        assert error.status_code == 400 and error.json()["error"]["type"] == "invalid_request"
    assert "/v1/rerank" in httpx.get(f"{reranker_server.url}/openapi.json").json()["paths"]


def test_pairs_are_tokenized_with_segment_ids(reranker_bundle: Path) -> None:
    from ortpack.serving.text import TextEncoder

    encoder = TextEncoder(
        (reranker_bundle / "tokenizer.json").read_text(), max_tokens=128, truncate=True, buckets=(128,)
    )
    (pair,) = encoder.encode_pairs([("a query", "a longer document text")]).payloads
    assert pair.type_ids[0] == 0 and pair.type_ids[-1] == 1 and len(pair) == len(pair.type_ids)
