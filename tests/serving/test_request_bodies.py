"""Parser and schema agree: each JSON route's request model both parses requests and writes the
route's OpenAPI schema, so a body the published schema refuses is refused (400, the one error
shape) and a body it accepts is served. The bodies: tests/request_bodies.py."""

from __future__ import annotations

import asyncio
import json
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

from ortpack.kernel.contracts import get_contract
from ortpack.serving.bodies import parse_body
from ortpack.serving.errors import ServeError
from tests.fakes import in_process
from tests.openapi_golden import CASES, document
from tests.request_bodies import BODIES, ROUTE_CASES, check_answers, path_of, request_schema, schema_accepts


def test_every_json_route_has_bodies() -> None:
    """A task's new JSON route needs its bodies here (the Open Inference Protocol's are checked by hand)."""
    routes = {
        (case, path)
        for case in CASES
        for path, operations in document(case)["paths"].items()
        if not path.startswith("/v2/")
        for op in operations.values()
        if "application/json" in op.get("requestBody", {}).get("content", {})
    }
    assert routes == {(case, path_of(route)) for route, case in ROUTE_CASES.items()}


@pytest.mark.parametrize("route", sorted(BODIES))
def test_the_request_model_agrees_with_the_published_schema(route: str) -> None:
    case = ROUTE_CASES[route]
    doc = document(case)
    model = getattr(
        import_module(get_contract(CASES[case]["task_settings"]["task"]).plugin), request_schema(doc, route)
    )
    for body, valid in BODIES[route]:
        assert schema_accepts(doc, request_schema(doc, route), body) == valid, ("schema", body)
        try:
            parse_body(model, body, {"dimensions": 64})
            parsed = True
        except ServeError:
            parsed = False
        assert parsed == valid, ("parser", body)


def test_the_embeddings_server_answers_as_its_schema_says(tiny_bundle: Path) -> None:
    async def body() -> tuple[dict[str, Any], list[tuple[dict[str, Any], int, Any]]]:
        async with in_process(tiny_bundle) as s:
            doc = (await s.client.get("/openapi.json")).json()
            out = []
            for request, _ in BODIES["/v1/embeddings"]:
                answer = await s.client.post("/v1/embeddings", content=json.dumps(request).encode())
                out.append((request, answer.status_code, answer.json()))
            return doc, out

    doc, answers = asyncio.run(body())
    check_answers(doc, "/v1/embeddings", answers)
