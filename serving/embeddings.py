"""The OpenAI embeddings API as both embedding plugins speak it (serving/tasks/text_embedding.py,
serving/tasks/image_embedding.py): the request's fields other than `input` (each plugin declares its
own `input`), the answer's models, and the answer itself. The same models parse requests and write
the OpenAPI schemas."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from ortpack.serving.errors import InvalidRequestError


class EmbeddingsOptions(BaseModel):
    """OpenAI's embeddings request without `input`. `dimensions`, when sent, must be the model's
    own (the server reads it from the parse context); `user` is accepted and ignored."""

    model_config = ConfigDict(strict=True)

    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("dimensions", mode="wrap")
    @classmethod
    def _the_models_own(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        want = (info.context or {}).get("dimensions")
        try:
            fits = handler(value) in (None, want)
        except ValidationError:
            fits = False
        if not fits:
            raise InvalidRequestError(f"dimensions must be {want} for this model (got {value!r})")
        return value


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | Annotated[str, Field(description="base64 little-endian float32")]


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


# The handlers write this answer as a dict (orjson writes the numpy rows); tests check answers
# against the model.
class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


def embeddings_answer(rows: Sequence[np.ndarray], encoding: str | None, model: str, tokens: int) -> dict[str, Any]:
    """The `EmbeddingsResponse` for these vectors: floats, or base64 of little-endian float32 when
    `encoding` says so; `tokens` counted in `usage` (0 for images, which have none)."""
    if encoding == "base64":
        data: list[dict[str, Any]] = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()}
            for i, row in enumerate(rows)
        ]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
