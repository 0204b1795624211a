"""Request bodies for every JSON route, each marked valid or not by the route's published OpenAPI
schema: the parser (the same pydantic model) must agree. tests/serving/test_request_bodies.py checks the
models against the golden documents and /v1/embeddings on a server; each task's test file sends
its route's bodies to its own running server (`verdicts`).

The checks a schema cannot state (a blank text, a token id beyond the vocabulary, `dimensions`
other than the model's, `top_k` beyond an image model's classes, bytes that are no image) are
left out: the schema accepts them and the server refuses them (tests/test_routes.py BAD).
"""

from __future__ import annotations

from typing import Any

from ortpack.serving.images import EXAMPLE_PNG

# route -> the golden document (tests/golden/openapi-<case>.json) that publishes it
ROUTE_CASES = {
    "/v1/embeddings": "text-embedding",
    "/v1/classify": "text-classification",
    "/v1/rerank": "text-classification-rerank",
    "/v1/classify/json": "image-classification",
    "/v1/ner": "token-classification",
    "/v1/detect/json": "object-detection",
    "/v1/embeddings#image": "image-embedding",  # the same path, images in `input`: ROUTE#CASE
    "/v1/chat/completions": "text-generation",
    "/v1/completions": "text-generation",
}

# route -> [(body, valid by the schema)]
_CHAT = [{"role": "user", "content": "Say hello."}]
BODIES: dict[str, list[tuple[dict[str, Any], bool]]] = {
    "/v1/chat/completions": [
        ({"messages": _CHAT}, True),
        ({"messages": _CHAT, "max_tokens": 4, "temperature": 0, "top_p": 0.5, "seed": 3}, True),
        ({"messages": _CHAT, "max_completion_tokens": 4, "stop": ["\n", "."], "n": 2}, True),
        ({"messages": _CHAT, "max_tokens": 2, "logprobs": True, "top_logprobs": 2}, True),
        ({"messages": _CHAT, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}, True),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}, True),
        ({"messages": _CHAT, "max_tokens": 2, "top_k": 5, "ignore_eos": True, "user": "u-1"}, True),
        ({}, False),
        ({"messages": []}, False),
        ({"messages": "hello"}, False),
        ({"messages": [{"content": "no role"}]}, False),
        ({"messages": _CHAT, "max_tokens": 0}, False),
        ({"messages": _CHAT, "temperature": 3}, False),
        ({"messages": _CHAT, "top_p": 0}, False),
        ({"messages": _CHAT, "n": 0}, False),
        ({"messages": _CHAT, "top_logprobs": 21}, False),
        ({"messages": _CHAT, "stop": 5}, False),
        ({"messages": _CHAT, "stream": "yes"}, False),
    ],
    "/v1/completions": [
        ({"prompt": "Once upon a time"}, True),
        ({"prompt": ["one", "two"], "max_tokens": 3, "temperature": 0}, True),
        ({"prompt": [5, 6, 7], "max_tokens": 3}, True),
        ({"prompt": [[5, 6], [7]], "max_tokens": 3, "logprobs": 2}, True),
        ({"prompt": "x", "stream": True, "stop": "."}, True),
        ({}, False),
        ({"prompt": 5}, False),
        ({"prompt": [1.5]}, False),
        ({"prompt": "x", "max_tokens": -1}, False),
        ({"prompt": "x", "logprobs": 21}, False),
        ({"prompt": "x", "top_k": -1}, False),
    ],
    "/v1/embeddings": [
        ({"input": "hello"}, True),
        ({"input": ["hello", "world"]}, True),
        ({"input": [101, 7592, 102]}, True),
        ({"input": [[101, 102], [101, 7592, 102]]}, True),
        ({"input": "x", "encoding_format": "base64", "user": "u-1"}, True),
        ({"input": "x", "encoding_format": None, "dimensions": None}, True),
        ({"input": "x", "unknown": {"ignored": True}}, True),
        ({}, False),
        ({"input": 42}, False),
        ({"input": []}, False),
        ({"input": [[]]}, False),
        ({"input": [1.5, 2]}, False),
        ({"input": [True]}, False),
        ({"input": ["a", 1]}, False),
        ({"input": "x", "encoding_format": "base65"}, False),
        ({"input": "x", "dimensions": "64"}, False),
        ({"input": "x", "model": 7}, False),
        ({"input": "x", "user": 5}, False),
    ],
    "/v1/classify": [
        ({"input": "what a lovely day"}, True),
        ({"input": ["good", "bad"], "top_k": 2}, True),
        ({"input": "x", "top_k": 99}, True),  # at most the model's labels
        ({"input": "x", "top_k": None}, True),
        ({}, False),
        ({"input": [1, 2]}, False),
        ({"input": []}, False),
        ({"input": "x", "top_k": 0}, False),
        ({"input": "x", "top_k": 1.5}, False),
        ({"input": "x", "top_k": "2"}, False),
        ({"input": "x", "model": 3}, False),
    ],
    "/v1/rerank": [
        ({"query": "q", "documents": ["a", "b"]}, True),
        ({"query": "q", "documents": [{"text": "a"}, "b"], "top_n": 1, "return_documents": True}, True),
        ({"documents": ["a"]}, False),
        ({"query": " ", "documents": ["a"]}, False),
        ({"query": "q", "documents": []}, False),
        ({"query": "q", "documents": [1]}, False),
        ({"query": "q", "documents": [" "]}, False),
        ({"query": "q", "documents": [{"title": "a"}]}, False),
        ({"query": "q", "documents": ["a"], "top_n": 0}, False),
        ({"query": "q", "documents": ["a"], "return_documents": "yes"}, False),
    ],
    "/v1/classify/json": [
        ({"image": EXAMPLE_PNG}, True),
        ({"images": [EXAMPLE_PNG, EXAMPLE_PNG], "top_k": 1}, True),
        ({}, False),
        ({"image": 7}, False),
        ({"images": []}, False),
        ({"images": [7]}, False),
        ({"image": EXAMPLE_PNG, "images": [EXAMPLE_PNG]}, False),
        ({"image": EXAMPLE_PNG, "top_k": 0}, False),
    ],
    "/v1/detect/json": [
        ({"image": EXAMPLE_PNG}, True),
        ({"images": [EXAMPLE_PNG, EXAMPLE_PNG], "top_k": 1, "min_score": 0.5}, True),
        ({"image": EXAMPLE_PNG, "min_score": 1}, True),
        ({}, False),
        ({"image": 7}, False),
        ({"images": []}, False),
        ({"image": EXAMPLE_PNG, "images": [EXAMPLE_PNG]}, False),
        ({"image": EXAMPLE_PNG, "top_k": 0}, False),
        ({"image": EXAMPLE_PNG, "min_score": 1.5}, False),
        ({"image": EXAMPLE_PNG, "min_score": "0.5"}, False),
    ],
    "/v1/embeddings#image": [
        ({"input": EXAMPLE_PNG}, True),
        ({"input": [EXAMPLE_PNG, "data:image/png;base64," + EXAMPLE_PNG], "encoding_format": "base64"}, True),
        ({"input": EXAMPLE_PNG, "model": None, "dimensions": None, "user": "u-1"}, True),
        ({}, False),
        ({"input": []}, False),
        ({"input": 7}, False),
        ({"input": [EXAMPLE_PNG, 7]}, False),
        ({"input": EXAMPLE_PNG, "encoding_format": "int8"}, False),
        ({"input": EXAMPLE_PNG, "dimensions": "64"}, False),
    ],
    "/v1/ner": [
        ({"input": "Ada Lovelace met Babbage."}, True),
        ({"input": ["Ada met Babbage.", "In London."], "aggregation": "none"}, True),
        ({}, False),
        ({"input": []}, False),
        ({"input": 5}, False),
        ({"input": "x", "aggregation": "max"}, False),
        ({"input": "x", "top_k": 3}, False),
    ],
}


def path_of(route: str) -> str:
    """A route key's path (`/v1/embeddings#image`: the path two tasks share, for the second)."""
    return route.partition("#")[0]


def request_schema(doc: dict[str, Any], route: str) -> str:
    """The components/schemas name of `route`'s JSON request body in an OpenAPI document."""
    ref = doc["paths"][path_of(route)]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return str(ref.rsplit("/", 1)[1])


def answer_schema(doc: dict[str, Any], route: str) -> str:
    """The components/schemas name of `route`'s 200 answer."""
    ref = doc["paths"][path_of(route)]["post"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    return str(ref.rsplit("/", 1)[1])


def schema_accepts(doc: dict[str, Any], name: str, value: Any) -> bool:
    """Whether `value` is valid by `doc`'s component schema `name` (JSON Schema 2020-12, as
    OpenAPI 3.1 uses it)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]}).is_valid(
        value
    )


def verdicts(doc: dict[str, Any], route: str) -> list[tuple[dict[str, Any], int]]:
    """(body, the status a server must answer) for each of `route`'s bodies: 200 if `doc` (the
    server's own /openapi.json) accepts it, else 400; each verdict checked against the table."""
    out = []
    for body, valid in BODIES[route]:
        assert schema_accepts(doc, request_schema(doc, route), body) == valid, (route, body)
        out.append((body, 200 if valid else 400))
    return out


def check_answers(doc: dict[str, Any], route: str, answers: list[tuple[dict[str, Any], int, Any]]) -> None:
    """Each (body, status, answer JSON) a server gave for `route`'s bodies: the status its schema
    says, a 200 answer valid by the route's answer schema, an error in the one error shape."""
    for (body, status), (sent, got, answer) in zip(verdicts(doc, route), answers, strict=True):
        assert sent == body and got == status, (route, body, answer)
        if status == 200:
            assert schema_accepts(doc, answer_schema(doc, route), answer), (route, body, answer)
        else:
            assert set(answer["error"]) == {"message", "type", "code"} and answer["error"]["code"] == 400
