"""The routes in-process: the real app, model service and tiny model, driven through httpx's ASGI
transport (no subprocess, no port). tests/serving/test_server.py and tests/serving/test_hardening.py start real
servers only for what the process itself does (signals, ports, the connection layer)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.fakes import SlowBackend, in_process, metric
from tests.models import TEXTS, reference_rows
from tests.openapi_golden import CASES, document, path_of, render


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- answers ------------------------------------------------------------------------------------


def test_openai_client_reads_embeddings(tiny_bundle: Path) -> None:
    import openai

    async def body() -> tuple[Any, Any, list[str]]:
        async with in_process(tiny_bundle, max_items=64) as s:
            client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=s.client)
            got = await client.embeddings.create(model="tiny-bert", input=TEXTS)  # asks for base64, decodes it
            as_float = await client.embeddings.create(model="tiny-bert", input=TEXTS[0], encoding_format="float")
            models = [m.id async for m in client.models.list()]
            return got, as_float, models

    got, as_float, models = run(body())
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert got.model == "tiny-bert" and got.usage.prompt_tokens == got.usage.total_tokens > len(TEXTS)
    rows = np.array([d.embedding for d in got.data])
    np.testing.assert_allclose(rows, reference_rows(tiny_bundle, TEXTS), atol=1e-5)
    np.testing.assert_allclose(as_float.data[0].embedding, rows[0], atol=1e-6)
    assert models == ["tiny-bert"]


def test_token_id_input_and_base64(tiny_bundle: Path) -> None:
    async def body() -> tuple[Any, Any, Any]:
        async with in_process(tiny_bundle) as s:
            ids = [101, 7592, 2088, 102]
            one = (await s.client.post("/v1/embeddings", json={"input": ids, "encoding_format": "base64"})).json()
            many = (await s.client.post("/v1/embeddings", json={"input": [ids, ids[:2]]})).json()
            text = (await s.client.post("/v1/embeddings", json={"input": "hello world"})).json()
            return one, many, text

    one, many, text = run(body())
    decoded = np.frombuffer(base64.b64decode(one["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, many["data"][0]["embedding"], atol=1e-6)
    assert one["usage"]["prompt_tokens"] == 4 and many["usage"]["prompt_tokens"] == 6
    np.testing.assert_allclose(text["data"][0]["embedding"], decoded, atol=1e-5)  # same ids as "hello world"


def test_concurrent_mixed_lengths_equal_unbatched_and_batches_form(tiny_bundle: Path) -> None:
    from ortpack.components.core.validation_data import validation_sentences

    texts = [t for t in validation_sentences() if t.strip()][:200]
    expected = reference_rows(tiny_bundle, texts)

    async def body() -> tuple[list[httpx.Response], str]:
        # a model taking 2 ms per item: requests queue behind a running batch, so batches form
        async with in_process(tiny_bundle, max_batch_size=8, backend=lambda b: SlowBackend(b, 0.002)) as s:
            answers = await asyncio.gather(*(s.client.post("/v1/embeddings", json={"input": t}) for t in texts))
            return answers, s.metrics()

    answers, metrics = run(body())
    assert [a.status_code for a in answers] == [200] * 200
    got = np.array([a.json()["data"][0]["embedding"] for a in answers])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # Buckets are cumulative: a batch of more than one shows as more items than model calls.
    assert metric(metrics, "ortpack_batch_size_sum") > metric(metrics, "ortpack_batch_size_count") > 0
    assert metric(metrics, "ortpack_batch_size_sum") == 200


def test_open_inference_protocol(tiny_bundle: Path) -> None:
    body = {
        "id": "r1",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}],
        "outputs": [{"name": "sentence_embedding"}],
    }

    async def go() -> list[Any]:
        async with in_process(tiny_bundle) as s:
            c = s.client
            return [
                (await c.get("/v2/health/live")).json(),
                (await c.get("/v2/health/ready")).json(),
                (await c.get("/v2")).json()["name"],
                (await c.get("/v2/models/tiny-bert")).json(),
                (await c.get("/v2/models/tiny-bert/ready")).status_code,
                (await c.get("/v2/models/tiny-bert/versions/1")).status_code,
                (await c.post("/v2/models/tiny-bert/infer", json=body)).json(),
                (await c.post("/v2/models/tiny-bert/versions/1/infer", json=body)).status_code,
            ]

    live, ready, name, meta, model_ready, versioned_meta, answer, versioned = run(go())
    assert live == {"live": True} and ready == {"ready": True} and name == "ortpack"
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "sentence_embedding", "datatype": "FP32", "shape": [-1, 64]}]
    assert model_ready == versioned_meta == versioned == 200
    assert answer["id"] == "r1" and answer["model_version"] == "1"
    (out,) = answer["outputs"]
    assert out["shape"] == [2, 64] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 64), reference_rows(tiny_bundle, TEXTS[:2]), atol=1e-5)


# --- bad input: 4xx in one shape ----------------------------------------------------------------

_V2 = "/v2/models/tiny-bert/infer"


def _text(shape: list[Any], data: list[Any], **more: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}], **more}


BAD = [
    ("/v1/embeddings", b"{not json", 400, "malformed JSON"),
    ("/v1/embeddings", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/embeddings", b"", 400, "empty request body"),
    ("/v1/embeddings", {"input": 42}, 400, "input must be"),
    ("/v1/embeddings", {"input": [1.5, 2]}, 400, "input must be"),
    ("/v1/embeddings", {"input": ["ok", None]}, 400, "input must be"),
    ("/v1/embeddings", {"model": 7, "input": "x"}, 400, "model must be a string"),
    ("/v1/embeddings", {}, 400, "missing 'input'"),
    ("/v1/embeddings", {"input": ""}, 400, "input[0] is empty"),
    ("/v1/embeddings", {"input": ["fine", "   "]}, 400, "input[1] is empty"),
    ("/v1/embeddings", {"input": []}, 400, "non-empty"),
    ("/v1/embeddings", {"input": [[]]}, 400, "input must be"),
    ("/v1/embeddings", {"input": [10**9]}, 400, "outside 0..30521"),
    ("/v1/embeddings", {"input": "x", "model": "gpt-4"}, 404, "model 'gpt-4' not found"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "base65"}, 400, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "encoding_format": []}, 400, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 3}, 400, "dimensions must be 64"),
    ("/v1/embeddings", {"input": "x", "dimensions": 64.0}, 400, "dimensions must be 64"),
    ("/v1/embeddings", {"input": "x", "dimensions": True}, 400, "dimensions must be 64"),
    ("/v1/embeddings", {"input": ["x"] * 65}, 413, "the limit is 64"),
    ("/v1/embeddings", {"input": "x" * 70000}, 413, "exceeds the 65536-byte limit"),
    ("/v2/models/other/infer", {"inputs": []}, 404, "not found"),
    ("/v2/models/tiny-bert/versions/9/infer", {"inputs": []}, 404, "no version '9'"),
    (_V2, {"inputs": "text"}, 400, "inputs must be a list"),
    (
        _V2,
        {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
        400,
        "unknown input 'image'",
    ),
    (_V2, {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, 400, "datatype BYTES"),
    (_V2, _text([3], ["a"]), 400, "has shape [3] but 1 elements"),
    (_V2, _text([1, 2], ["a", "b"]), 400, "shape must be [n] or [n, 1]"),
    (_V2, _text([True], ["a"]), 400, "shape must be [n] or [n, 1]"),
    (_V2, _text([1.0], ["a"]), 400, "shape must be [n] or [n, 1]"),
    (_V2, _text([2, 1], [["a"]]), 400, "has shape [2, 1] but 1 elements"),
    (_V2, _text([1], [["a"]]), 400, "does not match its shape"),
    (_V2, _text([1], [5]), 400, "must hold one or more non-empty strings"),
    (_V2, _text([1], ["a"], outputs=[{"name": "logits"}]), 400, "unknown output"),
    (_V2, _text([1], ["a"], outputs=5), 400, "outputs must be a list"),
    (_V2, _text([1], ["a"], outputs=True), 400, "outputs must be a list"),
    (_V2, _text([1], ["a"], outputs=1.5), 400, "outputs must be a list"),
    (_V2, _text([1], ["a"], outputs=[5]), 400, "unknown output"),
    (_V2, _text([1], ["a"], id=5), 400, "id must be a string"),
    ("/v1/nothing", {"input": "x"}, 404, "no route /v1/nothing"),
]


def test_bad_input_gets_4xx_in_one_shape(tiny_bundle: Path) -> None:
    async def body() -> list[tuple[int, dict[str, Any]]]:
        async with in_process(tiny_bundle, max_items=64, max_body_bytes=65536) as s:
            out = []
            for path, payload, _, _ in BAD:
                content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                answer = await s.client.post(path, content=content, headers={"Content-Type": "application/json"})
                out.append((answer.status_code, answer.json()))
            return out

    for (path, payload, status, fragment), (got, answer) in zip(BAD, run(body()), strict=True):
        where = f"{path} {str(payload)[:60]}"
        assert got == status, (where, answer)
        error = answer["error"]
        assert set(error) == {"message", "type", "code"} and error["code"] == status, where
        assert fragment in error["message"], (where, error)


def test_non_json_content_type_is_415(tiny_bundle: Path) -> None:
    """A browser may POST text/plain cross-origin without a preflight; curl -d sends a form type."""

    async def body() -> list[httpx.Response]:
        async with in_process(tiny_bundle) as s:
            out = []
            for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
                out.append(
                    await s.client.post("/v1/embeddings", content=b'{"input": "x"}', headers={"Content-Type": kind})
                )
            out.append(await s.client.post("/v1/embeddings", content=b'{"input": "x"}'))  # no type: read as JSON
            out.append(
                await s.client.post(
                    "/v1/embeddings",
                    content=b'{"input": "x"}',
                    headers={"Content-Type": "application/json; charset=utf-8"},
                )
            )
            return out

    *refused, bare, charset = run(body())
    for answer in refused:
        assert answer.status_code == 415 and answer.json()["error"]["type"] == "unsupported_media_type"
    assert bare.status_code == charset.status_code == 200


def test_a_request_that_can_never_fit_is_413_not_429(tiny_bundle: Path) -> None:
    """Default limits: 1,025 texts is more than --max-items (1024, at most --max-queue-size)."""

    async def body() -> httpx.Response:
        async with in_process(tiny_bundle) as s:
            return await s.client.post("/v1/embeddings", json={"input": ["x"] * 1025})

    answer = run(body())
    assert answer.status_code == 413, answer.text
    assert "Retry-After" not in answer.headers and "the limit is 1024" in answer.json()["error"]["message"]


def test_no_truncation_means_413(tiny_bundle: Path) -> None:
    async def body() -> tuple[httpx.Response, httpx.Response]:
        async with in_process(tiny_bundle, truncate=False, max_tokens=32, max_text_chars=1000) as s:
            tokens = await s.client.post("/v1/embeddings", json={"input": ["short", " ".join(["word"] * 40)]})
            chars = await s.client.post("/v1/embeddings", json={"input": ["short", "w" * 1001]})
            return tokens, chars

    tokens, chars = run(body())
    assert tokens.status_code == 413 and "input[1] has 42 tokens; the limit is 32" in tokens.json()["error"]["message"]
    assert chars.status_code == 413 and "input[1] has 1001 characters; the limit is 1000" in chars.text


def test_long_texts_are_cut_in_characters_before_tokenizing(tiny_bundle: Path) -> None:
    """A 1 MB text is cut at --max-text-chars (100 x 128 tokens by default) before the tokenizer
    sees it: the same embedding as its first 128 tokens, and the tokenizer never holds 1 MB."""

    async def body() -> tuple[Any, Any]:
        async with in_process(tiny_bundle, max_body_bytes=2 * 1024 * 1024) as s:
            huge = (await s.client.post("/v1/embeddings", json={"input": "word " * 200_000})).json()
            short = (await s.client.post("/v1/embeddings", json={"input": "word " * 200})).json()
            return huge, short

    huge, short = run(body())
    np.testing.assert_allclose(huge["data"][0]["embedding"], short["data"][0]["embedding"], atol=1e-6)
    assert huge["usage"]["prompt_tokens"] == 128


# --- auth, redirects, headers -------------------------------------------------------------------


def test_api_key_bearer_scheme_and_challenge(tiny_bundle: Path) -> None:
    async def body() -> dict[str, Any]:
        async with in_process(tiny_bundle, api_key="k3y") as s:
            c = s.client
            out: dict[str, Any] = {}
            for path in ("/v2/health/ready", "/v2/health/live"):
                out[path] = (await c.get(path)).status_code
            for path in ("/metrics", "/v2/models/tiny-bert", "/v1/models", "/openapi.json", "/docs", "/v2"):
                out[path] = await c.get(path)
            for scheme in ("Bearer", "bearer", "BEARER", "Basic", "Bearer  "):
                token = "k3y" if scheme != "Bearer  " else ""
                out[scheme] = await c.post(
                    "/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"{scheme} {token}"}
                )
            out["wrong"] = await c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer nope"})
            return out

    out = run(body())
    assert out["/v2/health/ready"] == out["/v2/health/live"] == 200
    for path in ("/metrics", "/v2/models/tiny-bert", "/v1/models", "/openapi.json", "/docs", "/v2"):
        denied = out[path]
        assert denied.status_code == 401 and denied.json()["error"]["type"] == "unauthorized", path
        assert denied.headers["WWW-Authenticate"] == 'Bearer realm="ortpack"', path
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert out[scheme].status_code == 200, scheme
    for refused in ("Basic", "Bearer  ", "wrong"):
        assert out[refused].status_code == 401, refused
        assert out[refused].headers["WWW-Authenticate"].startswith('Bearer realm="ortpack", error="invalid_token"')


def test_metrics_port_serves_only_metrics_without_the_key(tiny_bundle: Path) -> None:
    """With --metrics-port, /metrics answers there without the key; on the main port it keeps
    needing it, and the metrics port serves nothing else."""

    async def body() -> tuple[int, int, int, int]:
        async with in_process(tiny_bundle, api_key="k3y", port=8080, metrics_port=9100) as s:
            main = (await s.client.get("http://test:8080/metrics")).status_code
            side = await s.client.get("http://test:9100/metrics")
            other = (await s.client.get("http://test:9100/v1/models")).status_code
            return main, side.status_code, other, int("ortpack_ready 1.0" in side.text)

    assert run(body()) == (401, 200, 404, 1)


def test_trailing_slash_redirect_does_not_echo_the_host(tiny_bundle: Path) -> None:
    async def body() -> tuple[httpx.Response, httpx.Response]:
        async with in_process(tiny_bundle) as s:
            moved = await s.client.get("/v1/models/?x=1", headers={"Host": "evil.example"})
            missing = await s.client.get("/v1/none/", headers={"Host": "evil.example"})
            return moved, missing

    moved, missing = run(body())
    assert moved.status_code == 307 and moved.headers["Location"] == "/v1/models?x=1"
    assert "evil" not in str(moved.headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


def test_request_id_and_timing_headers(tiny_bundle: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> list[httpx.Response]:
        async with in_process(tiny_bundle, access_log=True) as s:
            return [
                await s.client.post(
                    "/v1/embeddings", json={"input": ["a b c", "d"]}, headers={"x-request-id": "abc-1"}
                ),
                await s.client.post(
                    "/v1/embeddings", json={"input": "x"}, headers={"x-request-id": "bad id\twith tab"}
                ),
                await s.client.get("/v2/health/ready"),
                await s.client.post("/v1/embeddings", json={}),
            ]

    with caplog.at_level(logging.INFO, logger="ortpack.access"):
        echoed, generated, health, bad = run(body())
    assert echoed.headers["x-request-id"] == "abc-1"
    assert len(generated.headers["x-request-id"]) == 32 and generated.headers["x-request-id"] != "abc-1"
    ids = [r.headers["x-request-id"] for r in (generated, health, bad)]  # generated: 128 random bits, hex
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 3
    for answer in (echoed, generated):
        assert float(answer.headers["x-queue-time"]) >= 0 and float(answer.headers["x-inference-time"]) > 0
    assert "x-inference-time" not in health.headers and "x-request-id" in health.headers
    assert "x-request-id" in bad.headers and bad.status_code == 400
    lines = [r for r in caplog.records if r.name == "ortpack.access"]
    assert len(lines) == 4
    first = lines[0].fields  # type: ignore[attr-defined]
    assert first["route"] == "/v1/embeddings" and first["status"] == 200 and first["items"] == 2
    assert first["tokens"] == 8 and first["request_id"] == "abc-1" and first["inference_ms"] > 0


def test_the_stage_breakdown_is_exported_and_adds_up(tiny_bundle: Path) -> None:
    """Every answered inference request is broken down into stages that add up to its total; a
    refused one and a route without a model call are not."""
    from ortpack.serving.stages import STAGES

    async def body() -> str:
        async with in_process(tiny_bundle) as s:
            for text in TEXTS[:3]:
                assert (await s.client.post("/v1/embeddings", json={"input": text})).status_code == 200
            v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}]}
            assert (await s.client.post("/v2/models/tiny-bert/infer", json=v2)).status_code == 200
            assert (await s.client.post("/v1/embeddings", json={"input": ""})).status_code == 400
            assert (await s.client.get("/v2/health/ready")).status_code == 200
            return s.metrics()

    text = run(body())

    def stage(route: str, name: str, kind: str) -> float:
        return metric(text, f'ortpack_request_stage_seconds_{kind}{{route="{route}",stage="{name}"}}')

    for name in STAGES:
        assert stage("/v1/embeddings", name, "count") == 3, name
        assert stage("/v2/models/{name}/infer", name, "count") == 1, name
    parts = sum(stage("/v1/embeddings", name, "sum") for name in STAGES if name != "total")
    assert parts == pytest.approx(stage("/v1/embeddings", "total", "sum"), rel=1e-6)
    for name in ("read", "tokenize", "queue", "model", "postprocess", "serialize"):
        assert stage("/v1/embeddings", name, "sum") > 0, name
    assert 'route="/v2/health/ready",stage=' not in text


# --- scheduling through HTTP --------------------------------------------------------------------


# --- metrics, documents, readiness --------------------------------------------------------------


def test_wrong_method_and_metrics(tiny_bundle: Path) -> None:
    async def body() -> tuple[httpx.Response, str]:
        async with in_process(tiny_bundle) as s:
            assert (await s.client.post("/v1/embeddings", json={})).status_code == 400  # counted below
            wrong = await s.client.get("/v1/embeddings")
            return wrong, (await s.client.get("/metrics")).text

    wrong, text = run(body())
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "method_not_allowed"
    for name in (
        "ortpack_requests_total",
        "ortpack_request_duration_seconds_bucket",
        "ortpack_queue_depth",
        "ortpack_batch_size_bucket",
        "ortpack_padding_ratio_bucket",
        "ortpack_inference_duration_seconds",
        "ortpack_rejections_total",
        "ortpack_tokens_total",
        "ortpack_ready 1.0",
    ):
        assert name in text, name
    assert 'ortpack_requests_total{route="/v1/embeddings",status="400"}' in text
    assert "_created" not in text


def test_openapi_document_is_what_the_server_registers(tiny_bundle: Path) -> None:
    async def body() -> tuple[dict[str, Any], str]:
        async with in_process(tiny_bundle) as s:
            return (await s.client.get("/openapi.json")).json(), (await s.client.get("/docs")).text

    doc, page = run(body())
    assert set(doc["paths"]) == set(document("text-embedding")["paths"])
    assert "<table>" in page


@pytest.mark.parametrize("case", sorted(CASES))
def test_openapi_golden_files(case: str) -> None:
    """Each task's document, from its registered routes; `python -m tests.openapi_golden` rewrites them."""
    assert path_of(case).read_text() == render(document(case)), f"regenerate: python -m tests.openapi_golden ({case})"


def test_live_before_ready(tiny_bundle: Path) -> None:
    """Until warm-up has run every bucket shape, liveness is 200 and readiness and inference 503."""
    from ortpack.serving.app import create_app
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    config = ServeConfig(bundle=str(tiny_bundle))
    service = load_service(tiny_bundle, config, Metrics())
    app = create_app(service, config)  # lifespan not started: nothing warmed up yet

    async def probe() -> tuple[int, int, int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            live = (await client.get("/v2/health/live")).status_code
            ready = (await client.get("/v2/health/ready")).status_code
            infer = (await client.post("/v1/embeddings", json={"input": "x"})).status_code
            await service.start(config)  # warm-up runs every bucket shape, then ready
            after = (await client.get("/v2/health/ready")).status_code
            await service.stop()
            return live, ready, infer, after

    assert asyncio.run(probe()) == (200, 503, 503, 200)
    engine = service.engine
    assert len(engine.warm_up_batches(config.max_batch_size)) == len(engine.encoder.buckets) + 1  # type: ignore[attr-defined]


def test_draining_turns_readiness_503_and_keeps_serving(tiny_bundle: Path) -> None:
    async def body() -> tuple[int, int, str]:
        async with in_process(tiny_bundle) as s:
            s.service.draining = True  # what SIGTERM does during --shutdown-grace-s
            ready = (await s.client.get("/v2/health/ready")).status_code
            served = (await s.client.post("/v1/embeddings", json={"input": "x"})).status_code
            return ready, served, s.service.batcher.__class__.__name__

    assert run(body())[:2] == (503, 200)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_json_request_body_has_an_example(case: str) -> None:
    """/docs shows it and Swagger-style tools pre-fill it (tests/serving/test_server.py sends them to a server)."""
    doc = document(case)
    posts = {path: ops["post"] for path, ops in doc["paths"].items() if "post" in ops}
    json_bodies = {p: op["requestBody"]["content"].get("application/json") for p, op in posts.items()}
    json_bodies = {p: body for p, body in json_bodies.items() if body is not None}  # not raw image bytes
    assert json_bodies
    for path, body in json_bodies.items():
        assert isinstance(body.get("example"), dict), path


def test_the_image_example_is_an_image_the_server_decodes() -> None:
    from ortpack.kernel.images import ImageDecoder, decode_base64
    from ortpack.serving.images import EXAMPLE_PNG

    pixels = ImageDecoder(max_pixels=1_000_000).decode(decode_base64(EXAMPLE_PNG, "image"))
    assert pixels.shape == (8, 8, 3) and pixels.dtype == np.uint8


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", True),  # a browser
        ("*/*", False),  # curl, httpx
        ("", False),
        ("application/json", False),
        ("text/*", True),
        ("text/html;q=0.5, application/json", False),
        ("application/json;q=0.1, text/html", True),
    ],
)
def test_the_front_door_answers_html_only_when_preferred(accept: str, html: bool) -> None:
    from ortpack.serving.routes.ops import prefers_html

    assert prefers_html(accept) is html
