"""The text-generation task end to end: a tiny Llama trained for 200 steps on the shipped texts,
built (fp32, int8 and int4, each gated against PyTorch), served by a real server on 127.0.0.1 and
called with the official `openai` client, raw HTTP and server-sent events.

fp32's served greedy text must be PyTorch `generate`'s, decoded; a chat prompt must be the ids
transformers' `apply_chat_template` gives. The loop's limits (the key/value cache as a budget,
429s, disconnects freeing their place) are checked on a live server too."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ortpack.kernel.bundle import read_manifest, verify_bundle
from tests.fakes import metric
from tests.request_bodies import BODIES
from tests.servers import RunningServer, running_server

pytestmark = pytest.mark.slow  # trains, builds and serves a decoder

MESSAGES = [{"role": "user", "content": "How do I cook pasta?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.causal_lms import make_tiny_causal_lm

    return make_tiny_causal_lm("llama", tmp_path_factory.mktemp("llm") / "tiny-llama", train_steps=200)


@pytest.fixture(scope="module")
def bundle(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid

    root = tmp_path_factory.mktemp("dist")
    spec = BuildSpec(
        export=ExportSpec(source=str(checkpoint), task="text-generation", name="tiny-llama"),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8", "int4"])),
    )
    build_bundle(spec, root / "tiny-llama", work_dir=root / "work")
    return root / "tiny-llama"


@pytest.fixture(scope="module")
def server(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    with running_server(bundle, "--variant", "cpu-fp32", log_dir=tmp_path_factory.mktemp("logs")) as running:
        yield running  # type: ignore[misc]


@pytest.fixture(scope="module")
def hf(checkpoint: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint), AutoModelForCausalLM.from_pretrained(checkpoint).eval()


def client(server: RunningServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_the_bundle_carries_tokenizer_template_defaults_and_gated_variants(bundle: Path) -> None:
    verify_bundle(bundle)
    manifest = read_manifest(bundle)
    settings = manifest.task_settings
    assert settings.task == "text-generation"
    assert settings.shared_files() == ["tokenizer.json", "chat_template.jinja"]
    assert settings.generation.eos_token_ids == [2, 0]  # <|im_end|>, <|endoftext|>
    variants = {v.id: v for v in manifest.variants}
    fp32 = variants["cpu-fp32"]
    assert fp32.parity.values["greedy_match"] == 1.0  # all 64 tokens of every prompt, three ways
    for path in ("single", "chunked", "batched"):
        assert fp32.parity.values[f"{path}.greedy_match"] == 1.0
    assert fp32.parity.probe is not None and fp32.parity.probe.passed
    for variant in variants.values():
        assert {"prefill_b1_s128", "decode_b1_p128", "decode_b8_p128"} <= set(variant.benchmark.shapes)
    int8 = variants.get("cpu-int8")
    assert int8 is not None and int8.optimize.int8 is not None
    assert int8.optimize.ops_after.get("MatMulNBits", 0) > 0
    int4 = variants.get("cpu-int4")
    if int4 is not None:  # shipped only when its gate passed: then its search is on record
        recipe = int4.optimize.int4
        assert recipe is not None and recipe.bits == 4 and recipe.candidates
        assert recipe.block_size in (32, 128) and recipe.accuracy_level in (0, 4)
        assert int4.optimize.ops_after.get("MatMulNBits", 0) > 0
        assert all(cost >= 0 for cost in recipe.float_layers.values())
    assert "text-generation" in (bundle / "report.html").read_text()


def test_served_greedy_text_is_pytorch_generates(server: RunningServer, hf: tuple[Any, Any]) -> None:
    import torch

    tokenizer, model = hf
    prompt = "The lighthouse stood at the end of"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=[], pad_token_id=0)
    expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)  # as OpenAI servers answer
    answer = client(server).completions.create(
        model="tiny-llama", prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    assert answer.choices[0].text == expected
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (ids.shape[1], 24)


def test_a_chat_prompt_is_the_ids_apply_chat_template_gives(server: RunningServer, hf: tuple[Any, Any]) -> None:
    tokenizer, _ = hf
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    answer = client(server).chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=3)
    assert answer.usage.prompt_tokens == len(expected)
    assert answer.choices[0].message.role == "assistant"


def test_the_openai_client_streams_what_it_gets_whole(server: RunningServer) -> None:
    openai = client(server)
    whole = openai.chat.completions.create(
        model="tiny-llama", messages=MESSAGES, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    chunks = list(
        openai.chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20


def test_n_choices_seeds_and_logprobs(server: RunningServer) -> None:
    openai = client(server)

    def sampled(seed: int) -> list[str]:
        answer = openai.completions.create(
            model="tiny-llama", prompt="Once upon a time", max_tokens=12, n=2, seed=seed, temperature=1.0
        )
        return [c.text for c in answer.choices]

    assert sampled(5) == sampled(5)
    with_logprobs = openai.chat.completions.create(
        model="tiny-llama", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = with_logprobs.choices[0].logprobs.content
    assert len(content) == with_logprobs.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2
        assert token.top_logprobs[0].token == token.token
    completion = openai.completions.create(
        model="tiny-llama", prompt="Once", max_tokens=4, temperature=0, logprobs=3, extra_body={"ignore_eos": True}
    )
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert all(len(top) == 3 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_the_generate_extension_whole_and_streamed(server: RunningServer) -> None:
    body = {"text_input": "Once upon a time", "parameters": {"max_tokens": 10, "temperature": 0, "ignore_eos": True}}
    whole = httpx.post(f"{server.url}/v2/models/tiny-llama/generate", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["model_name"] == "tiny-llama" and answer["finish_reason"] == "length"
    with httpx.stream("POST", f"{server.url}/v2/models/tiny-llama/generate_stream", json=body, timeout=60) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == answer["text_output"]
    assert events[-1]["finish_reason"] == "length"
    infer = httpx.post(
        f"{server.url}/v2/models/tiny-llama/infer",
        json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
    )
    assert infer.status_code == 400 and "generate" in infer.json()["error"]["message"]


def test_requests_answer_as_their_schemas_say(server: RunningServer) -> None:
    """Each body of tests/request_bodies.py: 200 with an answer valid by the route's answer schema,
    or 400 in the one error shape, as the server's own /openapi.json says (streamed bodies answer
    events, not the schema's object: the streaming tests read those)."""
    from tests.request_bodies import answer_schema, request_schema, schema_accepts

    doc = httpx.get(f"{server.url}/openapi.json").json()
    for route in ("/v1/chat/completions", "/v1/completions"):
        for body, valid in BODIES[route]:
            assert schema_accepts(doc, request_schema(doc, route), body) == valid, (route, body)
            if body.get("stream") is True:
                continue
            response = httpx.post(f"{server.url}{route}", json=body, timeout=60)
            assert response.status_code == (200 if valid else 400), (route, body, response.text)
            answer = response.json()
            if valid:
                assert schema_accepts(doc, answer_schema(doc, route), answer), (route, body, answer)
            else:
                assert set(answer["error"]) == {"message", "type", "code"}


@pytest.mark.parametrize(
    ("route", "body", "status", "says"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "presence_penalty": 0.5}, 400, "presence_penalty"),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 100_000}, 400, "context"),
        ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "json_object"}}, 400, "json"),
        ("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, 400, "tool_choice"),
        ("/v1/chat/completions", {"messages": MESSAGES, "model": "other"}, 404, "not found"),
        ("/v1/completions", {"prompt": [99999]}, 400, "token id"),
        ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
        ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo"),
        ("/v1/completions", {"prompt": ["a"] * 9, "n": 2}, 400, "at most 16"),
        ("/v2/models/tiny-llama/generate", {"text_input": ""}, 400, "text_input"),
    ],
)
def test_bad_requests_get_one_json_error(server: RunningServer, route: str, body: dict, status: int, says: str) -> None:
    response = httpx.post(f"{server.url}{route}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]


def test_concurrent_streams_are_batched_and_counted(server: RunningServer) -> None:
    before = httpx.get(f"{server.url}/metrics").text

    def one(i: int) -> str:
        body = {"prompt": f"Story {i}:", "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        return "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(one, range(8)))
    assert all(texts)
    after = httpx.get(f"{server.url}/metrics").text
    steps = metric(after, 'ortpack_generation_step_seconds_count{phase="decode"}') - metric(
        before, 'ortpack_generation_step_seconds_count{phase="decode"}'
    )
    tokens = metric(after, 'ortpack_generation_tokens_total{phase="decode"}') - metric(
        before, 'ortpack_generation_tokens_total{phase="decode"}'
    )
    assert tokens > steps > 0  # some steps decoded several sequences at once
    for name in ("ortpack_time_to_first_token_seconds_count", "ortpack_inter_token_latency_seconds_count"):
        assert metric(after, name) > metric(before, name)
    assert metric(after, "ortpack_sequences_running") == 0
    assert metric(after, "ortpack_kv_cache_capacity_tokens") > 0


def test_a_client_that_goes_away_frees_its_place(server: RunningServer) -> None:
    before = metric(httpx.get(f"{server.url}/metrics").text, 'ortpack_sequences_total{reason="cancelled"}')
    body = json.dumps({"prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sock.settimeout(30)
        received = b""
        while b"data: " not in received:  # it streams; then the client goes away
            received += sock.recv(4096)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(f"{server.url}/metrics").text
        if metric(text, 'ortpack_sequences_total{reason="cancelled"}') > before:
            break
        time.sleep(0.05)
    assert metric(text, 'ortpack_sequences_total{reason="cancelled"}') == before + 1
    assert metric(text, "ortpack_kv_cache_reserved_tokens") == 0


def test_the_cache_budget_answers_429_and_serves_the_rest(bundle: Path, tmp_path: Path) -> None:
    """A cache of few tokens (a small --kv-cache-share of the memory left): many long requests at
    once get 429 with Retry-After or their completion, never a 5xx, and the server stays up."""
    options = ("--variant", "cpu-int8", "--max-memory", "1G", "--kv-cache-share", "0.001")
    with running_server(bundle, *options, log_dir=tmp_path) as small:
        capacity = metric(httpx.get(f"{small.url}/metrics").text, "ortpack_kv_cache_capacity_tokens")
        assert 0 < capacity < 2000

        def one(i: int) -> tuple[int, str | None]:
            body = {"prompt": f"Request {i}", "max_tokens": 200, "ignore_eos": True}
            response = httpx.post(f"{small.url}/v1/completions", json=body, timeout=120)
            return response.status_code, response.headers.get("retry-after")

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, range(48)))
        codes = [code for code, _ in answers]
        assert set(codes) <= {200, 429}, codes
        assert 200 in codes and 429 in codes
        assert all(retry is not None and int(retry) >= 1 for code, retry in answers if code == 429)
        assert small.process.poll() is None
