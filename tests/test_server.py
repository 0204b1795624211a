"""A real server on 127.0.0.1 driven by real clients: the openai client, plain HTTP for v2."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from serving.bundle import read_manifest
from tests.servers import RunningServer, running_server

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Kubeflow pipelines run each step in its own container.",
    "ok",
    "Ein kurzer deutscher Satz über das Wetter in Berlin.",
    "日本語の文も埋め込めます。",
    " ".join(["long"] * 300),  # past the tiny model's 128 tokens: truncated
]


@pytest.fixture(scope="module")
def server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # fp32: its rows do not depend on what else is in the batch (dynamic int8's do: see README)
    with running_server(
        tiny_bundle,
        "--variant",
        "cpu-fp32",
        "--max-items",
        "64",
        "--max-body-bytes",
        "65536",
        env={"ORTPACK_MAX_BATCH_SIZE": "8"},
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as s:
        yield s


def reference_rows(bundle: Path, texts: list[str], variant: str = "cpu-fp32") -> np.ndarray:
    """Each text alone through the served variant with ONNX Runtime directly (no server)."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    manifest = read_manifest(bundle)
    assert manifest.tokenizer is not None
    tok = Tokenizer.from_file(str(bundle / manifest.tokenizer.file))
    tok.enable_truncation(manifest.tokenizer.max_length)
    session = ort.InferenceSession(str(bundle / manifest.variant(variant).file), providers=["CPUExecutionProvider"])
    rows = []
    for text in texts:
        enc = tok.encode(text)
        feeds = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
        rows.append(session.run(None, {k: np.array(v, dtype=np.int64) for k, v in feeds.items()})[0][0])
    return np.stack(rows)


def test_openai_client_reads_embeddings(server: RunningServer, tiny_bundle: Path) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    got = client.embeddings.create(model="tiny-bert", input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert got.model == "tiny-bert" and got.usage.prompt_tokens == got.usage.total_tokens > len(TEXTS)
    rows = np.array([d.embedding for d in got.data])
    np.testing.assert_allclose(rows, reference_rows(tiny_bundle, TEXTS), atol=1e-5)
    as_float = client.embeddings.create(model="tiny-bert", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(as_float.data[0].embedding, rows[0], atol=1e-6)
    assert [m.id for m in client.models.list().data] == ["tiny-bert"]


def test_token_id_input_and_base64(server: RunningServer) -> None:
    ids = [101, 7592, 2088, 102]
    one = httpx.post(f"{server.url}/v1/embeddings", json={"input": ids, "encoding_format": "base64"}).json()
    many = httpx.post(f"{server.url}/v1/embeddings", json={"input": [ids, ids[:2]]}).json()
    decoded = np.frombuffer(base64.b64decode(one["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, many["data"][0]["embedding"], atol=1e-6)
    assert one["usage"]["prompt_tokens"] == 4 and many["usage"]["prompt_tokens"] == 6
    text = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hello world"}).json()
    np.testing.assert_allclose(text["data"][0]["embedding"], decoded, atol=1e-5)  # same ids as "hello world"


def test_concurrent_mixed_lengths_equal_unbatched(server: RunningServer, tiny_bundle: Path) -> None:
    from components.core.validation_data import validation_sentences

    texts = [t for t in validation_sentences() if t.strip()][:200]
    expected = reference_rows(tiny_bundle, texts)

    async def fire() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/embeddings", json={"input": t}) for t in texts))

    answers = asyncio.run(fire())
    assert [a.status_code for a in answers] == [200] * 200
    got = np.array([a.json()["data"][0]["embedding"] for a in answers])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    metrics = httpx.get(f"{server.url}/metrics").text
    sizes = [line for line in metrics.splitlines() if line.startswith("ortpack_batch_size_bucket")]
    assert any('le="1.0"' not in line and float(line.split()[-1]) > 0 for line in sizes)


def test_open_inference_protocol(server: RunningServer, tiny_bundle: Path) -> None:
    assert httpx.get(f"{server.url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}
    assert httpx.get(f"{server.url}/v2").json()["name"] == "ortpack"
    meta = httpx.get(f"{server.url}/v2/models/tiny-bert").json()
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "sentence_embedding", "datatype": "FP32", "shape": [-1, 64]}]
    assert httpx.get(f"{server.url}/v2/models/tiny-bert/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/tiny-bert/versions/1").status_code == 200
    body = {
        "id": "r1",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}],
        "outputs": [{"name": "sentence_embedding"}],
    }
    answer = httpx.post(f"{server.url}/v2/models/tiny-bert/infer", json=body).json()
    assert answer["id"] == "r1" and answer["model_version"] == "1"
    (out,) = answer["outputs"]
    assert out["shape"] == [2, 64] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 64), reference_rows(tiny_bundle, TEXTS[:2]), atol=1e-5)
    versioned = httpx.post(f"{server.url}/v2/models/tiny-bert/versions/1/infer", json=body)
    assert versioned.status_code == 200


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
    ("/v1/embeddings", {"input": "x", "dimensions": 3}, 400, "dimensions must be 64"),
    ("/v1/embeddings", {"input": ["x"] * 65}, 413, "the limit is 64"),
    ("/v1/embeddings", {"input": "x" * 70000}, 413, "exceeds the 65536-byte limit"),
    ("/v2/models/other/infer", {"inputs": []}, 404, "not found"),
    ("/v2/models/tiny-bert/versions/9/infer", {"inputs": []}, 404, "no version '9'"),
    ("/v2/models/tiny-bert/infer", {"inputs": "text"}, 400, "inputs must be a list"),
    (
        "/v2/models/tiny-bert/infer",
        {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
        400,
        "unknown input 'image'",
    ),
    (
        "/v2/models/tiny-bert/infer",
        {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
        400,
        "datatype BYTES",
    ),
    (
        "/v2/models/tiny-bert/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["a"]}]},
        400,
        "has shape [3] but 1 elements",
    ),
    (
        "/v2/models/tiny-bert/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]},
        400,
        "shape must be [n] or [n, 1]",
    ),
    (
        "/v2/models/tiny-bert/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [5]}]},
        400,
        "must hold one or more non-empty strings",
    ),
    (
        "/v2/models/tiny-bert/infer",
        {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
            "outputs": [{"name": "logits"}],
        },
        400,
        "unknown output",
    ),
    ("/v1/nothing", {"input": "x"}, 404, "no route /v1/nothing"),
]


@pytest.mark.parametrize(("path", "body", "status", "fragment"), BAD, ids=[f"{b[0]}-{b[2]}-{b[3][:20]}" for b in BAD])
def test_bad_input_gets_4xx_in_one_shape(
    server: RunningServer, path: str, body: object, status: int, fragment: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == status
    assert fragment in error["message"]


def test_wrong_method_and_metrics(server: RunningServer) -> None:
    assert httpx.post(f"{server.url}/v1/embeddings", json={}).status_code == 400  # counted below
    wrong = httpx.get(f"{server.url}/v1/embeddings")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "method_not_allowed"
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "ortpack_requests_total",
        "ortpack_request_duration_seconds_bucket",
        "ortpack_queue_depth",
        "ortpack_batch_size_bucket",
        "ortpack_padding_ratio_bucket",
        "ortpack_inference_duration_seconds",
        "ortpack_rejections_total",
        "ortpack_ready 1.0",
    ):
        assert name in text, name
    assert 'ortpack_requests_total{route="/v1/embeddings",status="400"}' in text


def test_openapi_document(server: RunningServer) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/embeddings", "/v2/models/{name}/infer", "/v2/health/ready", "/metrics"} <= set(doc["paths"])
    assert "<table>" in httpx.get(f"{server.url}/docs").text


def test_api_key_guards_everything_but_health(tiny_bundle: Path, tmp_path: Path) -> None:
    with running_server(tiny_bundle, "--api-key", "k3y", log_dir=tmp_path) as s:
        assert httpx.get(f"{s.url}/v2/health/ready").status_code == 200
        assert httpx.get(f"{s.url}/v2/health/live").status_code == 200
        for path in ("/metrics", "/v2/models/tiny-bert", "/v1/models", "/openapi.json", "/docs", "/v2"):
            denied = httpx.get(f"{s.url}{path}")
            assert denied.status_code == 401 and denied.json()["error"]["type"] == "unauthorized"
        wrong = httpx.post(f"{s.url}/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = httpx.post(f"{s.url}/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer k3y"})
        assert ok.status_code == 200


def test_no_truncation_means_413(tiny_bundle: Path, tmp_path: Path) -> None:
    with running_server(tiny_bundle, "--truncate", "false", "--max-tokens", "32", log_dir=tmp_path) as s:
        answer = httpx.post(f"{s.url}/v1/embeddings", json={"input": ["short", " ".join(["word"] * 40)]})
        assert (
            answer.status_code == 413 and "input[1] has 42 tokens; the limit is 32" in answer.json()["error"]["message"]
        )


def test_overload_answers_every_request_with_200_or_429(tiny_bundle: Path, tmp_path: Path) -> None:
    with running_server(
        tiny_bundle, "--max-queue-size", "4", "--workers", "1", "--max-batch-size", "1", log_dir=tmp_path
    ) as s:

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=s.url, limits=httpx.Limits(max_connections=200), timeout=60) as c:
                body = {"input": [" ".join(["load"] * 100)] * 2}
                return await asyncio.gather(*(c.post("/v1/embeddings", json=body) for _ in range(200)))

        answers = asyncio.run(fire())
        codes = [a.status_code for a in answers]
        assert len(codes) == 200 and set(codes) <= {200, 429}
        assert codes.count(429) > 0 and codes.count(200) > 0
        for refused in (a for a in answers if a.status_code == 429):
            assert int(refused.headers["Retry-After"]) >= 1 and refused.json()["error"]["type"] == "overloaded"
        metrics = httpx.get(f"{s.url}/metrics").text
        assert f'ortpack_rejections_total{{reason="queue_full"}} {float(codes.count(429))}' in metrics


def test_sigterm_under_load_loses_nothing_accepted(tiny_bundle: Path, tmp_path: Path) -> None:
    with running_server(tiny_bundle, "--workers", "1", "--max-batch-size", "2", log_dir=tmp_path) as s:
        results: list[int | str] = []
        sent = threading.Event()

        async def fire() -> None:
            async with httpx.AsyncClient(base_url=s.url, limits=httpx.Limits(max_connections=100), timeout=60) as c:
                body = {"input": [" ".join(["drain"] * 120)] * 4}
                tasks = [asyncio.ensure_future(c.post("/v1/embeddings", json=body)) for _ in range(60)]
                while True:  # SIGTERM only once the server has accepted all 60 (the 61st is /metrics)
                    text = (await c.get("/metrics")).text
                    line = next(x for x in text.splitlines() if x.startswith("ortpack_requests_in_flight "))
                    if float(line.split()[1]) >= 61 or all(t.done() for t in tasks):
                        break
                    await asyncio.sleep(0.01)
                sent.set()
                for done in await asyncio.gather(*tasks, return_exceptions=True):
                    results.append(done.status_code if isinstance(done, httpx.Response) else type(done).__name__)

        client = threading.Thread(target=lambda: asyncio.run(fire()))
        client.start()
        assert sent.wait(30)
        code = s.stop(signal.SIGTERM)
        client.join(60)
        assert results == [200] * 60, results
        assert code == 0
        assert "Finished server process" in s.output()


def test_tampered_bundle_refuses_to_start(tiny_bundle: Path, tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    bad = tmp_path / "bad"
    shutil.copytree(tiny_bundle, bad)
    model = bad / "variants" / "cpu-int8" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    result = subprocess.run(
        [sys.executable, "-m", "serving", "--bundle", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "ortpack-serve: error: checksum mismatch for variants/cpu-int8/model.onnx: the file was changed after packaging"
    )


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        ([], {}, "no bundle given"),
        (["--bundle", "/no/such/bundle"], {}, "bundle not found"),
        (["--bundle", "{bundle}", "--variant", "cuda-fp16"], {}, "has no variant 'cuda-fp16'"),
        (["--bundle", "{bundle}"], {"ORTPACK_MAX_BATCH_SIZE": "zero"}, "ORTPACK_MAX_BATCH_SIZE"),
        (["--bundle", "{bundle}", "--port", "0"], {}, "--port must be in 1..65535"),
        (["--bundle", "{bundle}", "--max-tokens", "4096"], {}, "exceeds the model's 128"),
    ],
)
def test_bad_start_is_one_line(args: list[str], env: dict[str, str], fragment: str, tiny_bundle: Path) -> None:
    import os
    import subprocess
    import sys

    argv = [a.replace("{bundle}", str(tiny_bundle)) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "serving", *argv], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ortpack-serve: error:") and fragment in lines[0], result.stderr


def test_live_before_ready(tiny_bundle: Path) -> None:
    """Until warm-up has run every bucket shape, liveness is 200 and readiness and inference 503."""
    from serving.app import create_app
    from serving.config import ServeConfig
    from serving.metrics import Metrics
    from serving.service import load_service

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
    runtime = service.runtime
    assert len(runtime.warm_up_batches(config.max_batch_size)) == len(runtime.encoder.buckets) + 1  # type: ignore[attr-defined]
