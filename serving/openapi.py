"""The OpenAPI 3.1 document, generated from the routes a server registered (and the schemas their
modules declare), and a self-contained /docs page (no CDN, no scripts) that shows each route's
example request."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ortpack import __version__

if TYPE_CHECKING:
    from ortpack.serving.http import RouteSpec

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "integer"}},
        }
    },
}


def openapi_document(
    routes: Sequence[RouteSpec], schemas: dict[str, Any], *, model_name: str, description: str
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of exactly the routes this server registered."""
    paths: dict[str, dict[str, Any]] = {}
    for spec in routes:
        paths.setdefault(spec.path, {})[spec.method.lower()] = spec.operation()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ortpack server",
            "version": __version__,
            "description": f"Serves {model_name}: {description}.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR_SCHEMA, **schemas},
        },
        "security": [{"bearer": []}],
        "paths": dict(sorted(paths.items())),
    }


def request_example(operation: dict[str, Any]) -> Any:
    """The example JSON body of an operation, or None."""
    return operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("example")


def docs_html(document: dict[str, Any]) -> str:
    rows = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            rows.append(
                f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                f"<td>{html.escape(op['summary'])}</td></tr>"
            )
            example = request_example(op)
            if example is not None:
                body = html.escape(json.dumps(example, indent=2, ensure_ascii=False))
                rows.append(
                    "<tr><td></td><td colspan='2'><details><summary>example request "
                    "(<code>Content-Type: application/json</code>)</summary>"
                    f"<pre>{body}</pre></details></td></tr>"
                )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ortpack server API</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em}td{padding:3px 10px;border-bottom:1px solid #ddd}"
        "pre{margin:4px 0;white-space:pre-wrap;word-break:break-all}</style></head><body>"
        f"<h1>{html.escape(document['info']['title'])}</h1><p>{html.escape(document['info']['description'])}</p>"
        f"<table>{''.join(rows)}</table><p>Full document: <a href='/openapi.json'>/openapi.json</a></p></body></html>"
    )
