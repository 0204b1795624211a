"""Serving token classifiers (task `token-classification`: named-entity recognition, tagging).

- `POST /v1/ner` with `{"input": text or [texts], "aggregation": "first" | "none"}` answers each
  text's entities with character offsets, as Hugging Face's token-classification pipeline does:
  "first" gives a word its first token's label and joins `B-X`/`I-X` words (or repeated plain
  tags) into one entity scored by the mean of its words; "none" answers every token. Tokens
  labelled `O` are left out. The request and answer bodies are the pydantic models below: the
  same models parse requests and write the OpenAPI schemas, so the two cannot drift.
- The Open Inference Protocol takes `text` (BYTES, `[n]`) and answers `probabilities`
  `[n, max_length, labels]`, -1 past each text's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.base import TEXT
from ortpack.kernel.contracts.token_classification import OUTPUT, TokenClassificationSettings
from ortpack.kernel.engine import stack
from ortpack.kernel.engines.tokens import TokenEngine
from ortpack.kernel.tokenizer import Encoded
from ortpack.serving.bodies import component_schemas, read_request_for_model
from ortpack.serving.errors import PayloadTooLargeError
from ortpack.serving.http import RouteSpec, json_response, service_of
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as
from ortpack.serving.text import Texts, context_tokens, tokenize, v2_texts

INLINE_CHARS = 2048  # tokenize on the event loop up to this many characters; in a thread beyond


# ---------------------------------------------------------------- request and answer


class NerRequest(BaseModel):
    """Texts to tag; `aggregation` overrides the bundle's default."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"input": "Ada Lovelace met Babbage."}]}
    )

    input: Texts
    model: str | None = None
    aggregation: Literal["first", "none"] | None = None


class Entity(BaseModel):
    entity: str  # the entity type ("PER") with "first", the token's label ("B-PER") with "none"
    score: float
    word: str  # the text's characters from start to end
    start: int
    end: int


class NerResult(BaseModel):
    index: int
    entities: list[Entity]


class Usage(BaseModel):
    total_tokens: int


class NerResponse(BaseModel):
    object: Literal["list"] = "list"
    model: str
    data: list[NerResult]
    usage: Usage


# ---------------------------------------------------------------- words and entities


def _split(label: str) -> tuple[str, str]:
    """(B or I, entity type): `B-PER` -> (B, PER); a plain tag continues a run of itself."""
    if label[:2] in ("B-", "I-"):
        return label[0], label[2:]
    return "I", label


def tag(text: str, encoding: Any, probs: np.ndarray, labels: Sequence[str], aggregation: str) -> list[Entity]:
    """The entities of one text from its tokenizer encoding (word ids, character offsets) and its
    `[tokens, labels]` probabilities; tokens labelled `O` and special tokens are left out."""
    best = probs.argmax(axis=1)
    tokens = [
        (t, w, s, e)
        for t, (w, (s, e)) in enumerate(zip(encoding.word_ids, encoding.offsets, strict=True))
        if w is not None
    ]
    if aggregation == "none":
        return [
            Entity(entity=labels[best[t]], score=float(probs[t, best[t]]), word=text[s:e], start=s, end=e)
            for t, _, s, e in tokens
            if labels[best[t]] != "O"
        ]
    words: list[list[Any]] = []  # [word id, label, score, start, end]: a word takes its first token's label
    for t, w, s, e in tokens:
        if words and words[-1][0] == w:
            words[-1][4] = e
        else:
            words.append([w, labels[best[t]], float(probs[t, best[t]]), s, e])
    entities: list[Entity] = []
    run: list[list[Any]] = []

    def close() -> None:
        if run:
            start, end = run[0][3], run[-1][4]
            score = float(np.mean([w[2] for w in run]))
            entities.append(
                Entity(entity=_split(run[0][1])[1], score=score, word=text[start:end], start=start, end=end)
            )
            run.clear()

    for word in words:
        if word[1] == "O":
            close()
            continue
        prefix, kind = _split(word[1])
        if not (prefix == "I" and run and _split(run[-1][1])[1] == kind):
            close()
        run.append(word)
    close()
    return entities


# ---------------------------------------------------------------- the runtime


class TokenClassificationRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        settings = ctx.manifest.task_settings
        if not isinstance(settings, TokenClassificationSettings):
            raise ValueError(f"not a token-classification bundle: {ctx.manifest.task}")
        self.labels = settings.labels
        self.aggregation = settings.aggregation
        self.max_items = ctx.config.max_items
        self.encoder = engine_as(ctx, TokenEngine).encoder

    def _tokenize(self, texts: list[str]) -> tuple[list[Any], Encoded]:
        encodings = self.encoder.tokenizer.encode_batch(list(self.encoder.bound(texts)))
        return encodings, self.encoder.from_ids([e.ids for e in encodings])

    async def tokenize(self, texts: list[str], where: str) -> tuple[list[str], list[Any], Encoded]:
        """(the texts as tokenized, after --max-text-chars; their encodings; the payloads)."""
        if len(texts) > self.max_items:
            raise PayloadTooLargeError(f"{where} has {len(texts)} items; the limit is {self.max_items}")
        encodings, encoded = await tokenize(lambda: self._tokenize(texts), sum(len(t) for t in texts) <= INLINE_CHARS)
        context_tokens(encoded.tokens)
        return list(self.encoder.bound(texts)), encodings, encoded

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        _, _, encoded = await self.tokenize(v2_texts(inputs[TEXT.name]), "inputs[0].data")
        return encoded.payloads, encoded.buckets

    def routes(self) -> list[RouteSpec]:
        return [
            RouteSpec(
                path="/v1/ner",
                method="POST",
                handler=self.recognize,
                summary="Tag texts: their entities (or labelled tokens) with character offsets",
                operation_id="recognizeEntities",
                request_schema="NerRequest",
                request_example={"input": ["Ada Lovelace worked with Charles Babbage in London."]},
                response_schema="NerResponse",
                errors=(400, 404, 413, 415, 429, 503, 504),
            )
        ]

    def schemas(self) -> dict[str, Any]:
        return component_schemas([NerRequest], [NerResponse])

    def describe(self) -> str:
        return "token classification (named entities): /v1/ner and the Open Inference Protocol v2"

    async def recognize(self, request: Request) -> Response:
        service = service_of(request)
        body = await read_request_for_model(request, NerRequest)
        texts = [body.input] if isinstance(body.input, str) else body.input
        texts, encodings, encoded = await self.tokenize(texts, "input")
        rows = stack(await service.infer(encoded.payloads, encoded.buckets), OUTPUT)
        aggregation = body.aggregation or self.aggregation
        data = [
            NerResult(index=i, entities=tag(text, enc, rows[i, : len(enc.ids)], self.labels, aggregation))
            for i, (text, enc) in enumerate(zip(texts, encodings, strict=True))
        ]
        answer = NerResponse(model=service.model_name, data=data, usage=Usage(total_tokens=encoded.tokens))
        return json_response(answer.model_dump())


TASK = ServingTask(name="token-classification", open=TokenClassificationRuntime)
