"""Serving text classifiers and cross-encoder rerankers (task `text-classification`).

- Classifiers (softmax or sigmoid over labels): `POST /v1/classify` with `{"input": text or
  [texts], "top_k"}` answers each text's labels with probabilities, best first; the Open
  Inference Protocol takes `text` (BYTES, `[n]`) and answers `probabilities` `[n, labels]`.
- Cross-encoders (one output): `POST /v1/rerank` with `{"query", "documents", "top_n",
  "return_documents"}` answers the documents' relevance scores, best first (the shape Cohere,
  Jina and TEI clients read: `results: [{index, relevance_score, document?}]`); pairs are
  tokenized with the bundle's tokenizer, segment ids included. v2 takes `text` BYTES `[n, 2]`
  (query, document rows) and answers `scores` `[n, 1]`.

The request and answer bodies are the pydantic models below: the same models parse requests and
write the OpenAPI schemas.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.base import TEXT
from ortpack.kernel.contracts.text_classification import TextClassificationSettings
from ortpack.kernel.engine import stack
from ortpack.kernel.engines.tokens import TokenEngine
from ortpack.kernel.tokenizer import Encoded
from ortpack.serving.bodies import PositiveInt, component_schemas, read_request_for_model, worded
from ortpack.serving.errors import InvalidRequestError, PayloadTooLargeError
from ortpack.serving.http import RouteSpec, json_response, service_of
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as
from ortpack.serving.text import Texts, encode_pairs, encode_texts, v2_texts

# ---------------------------------------------------------------- requests and answers

NonBlank = Annotated[str, Field(pattern=r"\S")]


class TextClassifyRequest(BaseModel):
    """Texts to classify; `top_k` labels each (at most the model's labels)."""

    model_config = ConfigDict(strict=True)

    input: Texts
    model: str | None = None
    top_k: PositiveInt | None = 5


class Prediction(BaseModel):
    label: str
    index: int
    probability: float


class TextPredictions(BaseModel):
    index: int
    predictions: list[Prediction]


class Usage(BaseModel):
    total_tokens: int


class TextClassification(BaseModel):
    object: Literal["list"] = "list"
    model: str
    data: list[TextPredictions]
    usage: Usage


class RerankDocument(BaseModel):
    text: NonBlank


class RerankRequest(BaseModel):
    """A query and its documents (strings or `{"text": ...}` objects); the best `top_n` answer
    (default all), with their text when `return_documents`."""

    model_config = ConfigDict(strict=True)

    query: Annotated[NonBlank, worded("must be a non-empty string")]
    documents: Annotated[
        list[NonBlank | RerankDocument],
        Field(min_length=1),
        worded(
            "must be a non-empty list of strings (or {'text': ...} objects)",
            item="must be a non-empty string or {'text': string}",
        ),
    ]
    top_n: PositiveInt | None = None
    return_documents: bool = False
    model: str | None = None


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    model: str
    results: list[RerankResult]
    usage: Usage


# ---------------------------------------------------------------- the runtime


class TextClassificationRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        settings = ctx.manifest.task_settings
        if not isinstance(settings, TextClassificationSettings):
            raise ValueError(f"not a text-classification bundle: {ctx.manifest.task}")
        self.pairs = settings.classification.pairs
        self.max_items = ctx.config.max_items
        self.encoder = engine_as(ctx, TokenEngine).encoder
        self.output_name = ctx.manifest.signature.outputs[0].name
        self.output_dim = 1 if self.pairs else ctx.manifest.sizes["labels"]
        self.labels = settings.labels or [f"LABEL_{i}" for i in range(self.output_dim)]

    async def encode(self, texts: list[str], where: str, pairs_with: str | None = None) -> Encoded:
        if len(texts) > self.max_items:
            raise PayloadTooLargeError(f"{where} has {len(texts)} items; the limit is {self.max_items}")
        if pairs_with is not None:
            return await encode_pairs(self.encoder, [(pairs_with, t) for t in texts])
        return await encode_texts(self.encoder, texts)

    async def infer(self, request: Request, encoded: Encoded) -> np.ndarray:
        items = await service_of(request).infer(encoded.payloads, encoded.buckets)
        return stack(items, self.output_name)

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        tensor = inputs[TEXT.name]
        if not self.pairs:
            encoded = await self.encode(v2_texts(tensor), "inputs[0].data")
            return encoded.payloads, encoded.buckets
        shape, data = tensor.shape, tensor.data
        if not (
            isinstance(shape, list)
            and len(shape) == 2
            and shape[1] == 2
            and isinstance(shape[0], int)
            and not isinstance(shape[0], bool)
            and shape[0] > 0
        ):
            raise InvalidRequestError(f"input 'text' shape must be [n, 2] (query, document rows), got {shape!r}")
        if isinstance(data, list) and data and all(isinstance(row, list) for row in data):
            data = [x for row in data for x in row]
        if (
            not isinstance(data, list)
            or len(data) != 2 * shape[0]
            or not all(isinstance(x, str) and x.strip() for x in data)
        ):
            raise InvalidRequestError(f"input 'text' must hold {shape[0]} rows of two non-empty strings")
        if shape[0] > self.max_items:
            raise PayloadTooLargeError(f"inputs[0] has {shape[0]} pairs; the limit is {self.max_items}")
        encoded = await encode_pairs(self.encoder, list(zip(data[0::2], data[1::2], strict=True)))
        return encoded.payloads, encoded.buckets

    def routes(self) -> list[RouteSpec]:
        errors = (400, 404, 413, 415, 429, 503, 504)
        if self.pairs:
            return [
                RouteSpec(
                    path="/v1/rerank",
                    method="POST",
                    handler=self.rerank,
                    summary="Rerank documents for a query (cross-encoder; Cohere/Jina/TEI-style answer)",
                    operation_id="rerank",
                    request_schema="RerankRequest",
                    request_example={
                        "query": "What is ONNX?",
                        "documents": ["ONNX is an open format for machine learning models.", "Paris is in France."],
                        "top_n": 2,
                    },
                    response_schema="RerankResponse",
                    errors=errors,
                )
            ]
        return [
            RouteSpec(
                path="/v1/classify",
                method="POST",
                handler=self.classify,
                summary="Classify texts: labels with probabilities, best first",
                operation_id="classifyText",
                request_schema="TextClassifyRequest",
                request_example={"input": ["I loved this film.", "The plot made no sense."]},
                response_schema="TextClassification",
                errors=errors,
            )
        ]

    def schemas(self) -> dict[str, Any]:
        if self.pairs:
            return component_schemas([RerankRequest], [RerankResponse])
        return component_schemas([TextClassifyRequest], [TextClassification])

    def describe(self) -> str:
        if self.pairs:
            return "reranking with a cross-encoder: /v1/rerank and the Open Inference Protocol v2"
        return "text classification: /v1/classify and the Open Inference Protocol v2"

    async def classify(self, request: Request) -> Response:
        service = service_of(request)
        body = await read_request_for_model(request, TextClassifyRequest)
        texts = [body.input] if isinstance(body.input, str) else body.input
        k = min(body.top_k or 5, self.output_dim)
        encoded = await self.encode(texts, "input")
        rows = await self.infer(request, encoded)
        data = []
        for i, row in enumerate(rows):
            best = np.argsort(-row, kind="stable")[:k]
            predictions = [Prediction(label=self.labels[j], index=int(j), probability=float(row[j])) for j in best]
            data.append(TextPredictions(index=i, predictions=predictions))
        answer = TextClassification(model=service.model_name, data=data, usage=Usage(total_tokens=encoded.tokens))
        return json_response(answer.model_dump())

    async def rerank(self, request: Request) -> Response:
        service = service_of(request)
        body = await read_request_for_model(request, RerankRequest)
        texts = [d if isinstance(d, str) else d.text for d in body.documents]
        encoded = await self.encode(texts, "documents", pairs_with=body.query)
        scores = (await self.infer(request, encoded))[:, 0]
        results = [
            RerankResult(
                index=int(i),
                relevance_score=float(scores[i]),
                document=RerankDocument(text=texts[i]) if body.return_documents else None,
            )
            for i in np.argsort(-scores, kind="stable")[: body.top_n or len(texts)]
        ]
        answer = RerankResponse(model=service.model_name, results=results, usage=Usage(total_tokens=encoded.tokens))
        return json_response(answer.model_dump(exclude_none=True))


TASK = ServingTask(name="text-classification", open=TextClassificationRuntime)
