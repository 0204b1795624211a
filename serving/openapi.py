"""The OpenAPI 3.1 document of the server, and a self-contained /docs page (no CDN, no scripts)."""

from __future__ import annotations

import html
from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}


def _answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"description": description}
    if schema is not None:
        body["content"] = {"application/json": {"schema": schema}}
    return body


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "invalid request",
        401: "missing or wrong API key",
        404: "unknown model",
        413: "too large",
        429: "queue full (see Retry-After)",
        503: "not ready or shutting down",
        504: "deadline exceeded",
    }
    return {str(c): _answer(text[c], _ERROR) for c in codes}


def openapi_document(model_name: str) -> dict[str, Any]:
    infer_errors = _errors(400, 401, 404, 413, 429, 503, 504)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ortpack server",
            "version": "1",
            "description": f"Serves {model_name}: OpenAI embeddings and the Open Inference Protocol v2.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type", "code"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "code": {"type": "integer"},
                            },
                        }
                    },
                },
                "EmbeddingsRequest": {
                    "type": "object",
                    "required": ["input"],
                    "properties": {
                        "input": {
                            "oneOf": [
                                {"type": "string"},
                                {"type": "array", "items": {"type": "string"}},
                                {"type": "array", "items": {"type": "integer"}},
                                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                            ]
                        },
                        "model": {"type": "string", "example": model_name},
                        "encoding_format": {"enum": ["float", "base64"], "default": "float"},
                        "dimensions": {"type": "integer"},
                        "user": {"type": "string"},
                    },
                },
                "EmbeddingsResponse": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "list"},
                        "model": {"type": "string"},
                        "data": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "object": {"const": "embedding"},
                                    "index": {"type": "integer"},
                                    "embedding": {
                                        "oneOf": [
                                            {"type": "array", "items": {"type": "number"}},
                                            {"type": "string", "description": "base64 little-endian float32"},
                                        ]
                                    },
                                },
                            },
                        },
                        "usage": {
                            "type": "object",
                            "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
                        },
                    },
                },
                "InferTensor": {
                    "type": "object",
                    "required": ["name", "shape", "datatype", "data"],
                    "properties": {
                        "name": {"type": "string"},
                        "shape": {"type": "array", "items": {"type": "integer"}},
                        "datatype": {"type": "string"},
                        "data": {"type": "array"},
                    },
                },
                "InferRequest": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/InferTensor"}},
                        "outputs": {
                            "type": "array",
                            "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                        },
                    },
                },
                "InferResponse": {
                    "type": "object",
                    "properties": {
                        "model_name": {"type": "string"},
                        "model_version": {"type": "string"},
                        "id": {"type": "string"},
                        "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/InferTensor"}},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/embeddings": {
                "post": {
                    "summary": "Embed texts (OpenAI-compatible)",
                    "operationId": "createEmbeddings",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EmbeddingsRequest"}}},
                    },
                    "responses": {
                        "200": _answer("embeddings", {"$ref": "#/components/schemas/EmbeddingsResponse"}),
                        **infer_errors,
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "List models (OpenAI-compatible)",
                    "operationId": "listModels",
                    "responses": {"200": _answer("models"), **_errors(401)},
                }
            },
            "/v2": {
                "get": {
                    "summary": "Server metadata",
                    "operationId": "serverMetadata",
                    "responses": {"200": _answer("metadata"), **_errors(401)},
                }
            },
            "/v2/health/live": {
                "get": {
                    "summary": "Liveness (no auth)",
                    "operationId": "live",
                    "security": [],
                    "responses": {"200": _answer("live")},
                }
            },
            "/v2/health/ready": {
                "get": {
                    "summary": "Readiness: 200 once warm-up is done (no auth)",
                    "operationId": "ready",
                    "security": [],
                    "responses": {"200": _answer("ready"), **_errors(503)},
                }
            },
            "/v2/models/{name}": {
                "get": {
                    "summary": "Model metadata",
                    "operationId": "modelMetadata",
                    "parameters": [_path("name")],
                    "responses": {"200": _answer("metadata"), **_errors(401, 404)},
                }
            },
            "/v2/models/{name}/ready": {
                "get": {
                    "summary": "Model readiness",
                    "operationId": "modelReady",
                    "parameters": [_path("name")],
                    "responses": {"200": _answer("ready"), **_errors(401, 404, 503)},
                }
            },
            "/v2/models/{name}/infer": {
                "post": {
                    "summary": "Infer (Open Inference Protocol v2): input 'text', BYTES, shape [n]",
                    "operationId": "modelInfer",
                    "parameters": [_path("name")],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}},
                    },
                    "responses": {
                        "200": _answer("outputs", {"$ref": "#/components/schemas/InferResponse"}),
                        **infer_errors,
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "operationId": "metrics",
                    "responses": {"200": {"description": "text exposition format"}, **_errors(401)},
                }
            },
        },
    }


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def docs_html(document: dict[str, Any]) -> str:
    rows = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            rows.append(
                f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                f"<td>{html.escape(op['summary'])}</td></tr>"
            )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ortpack server API</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em}td{padding:3px 10px;border-bottom:1px solid #ddd}"
        "</style></head><body>"
        f"<h1>{html.escape(document['info']['title'])}</h1><p>{html.escape(document['info']['description'])}</p>"
        f"<table>{''.join(rows)}</table><p>Full document: <a href='/openapi.json'>/openapi.json</a></p></body></html>"
    )
