"""Request bodies as pydantic models: one model per route both parses the request and writes the
route's OpenAPI schema, so parser and schema cannot drift.

- `read_body_as(request, Model)` reads the JSON object and validates it; the first problem is
  the answer (400 in the one error shape, serving/errors.py), in the project's wording: a
  validator's own `ServeError` as it is, a missing field as `missing 'input'`, a wrong type or
  choice as `model must be a string` or `encoding_format must be 'float' or 'base64'`, anything
  else as `where: pydantic's message`.
- `worded(says, item=...)` gives a field its own wording (`query must be a non-empty string`,
  `documents[2] must be ...`) where pydantic's would name union members.
- `component_schemas(requests, answers)` writes the models' OpenAPI component schemas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.json_schema import models_json_schema
from starlette.requests import Request

from ortpack.serving.errors import InvalidRequestError, ServeError
from ortpack.serving.http import check_model, read_json_object

M = TypeVar("M", bound=BaseModel)

# pydantic error type -> the project's wording ({where}: the field, as `documents[1].text`)
_WORDING = {
    "missing": "missing '{where}'",
    "string_type": "{where} must be a string",
    "int_type": "{where} must be an integer",
    "bool_type": "{where} must be true or false",
    "literal_error": "{where} must be {expected}",
}


def where_of(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the request spells it: ("documents", 1, "text") -> documents[1].text."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out or "body"


def request_error(exc: ValidationError) -> ServeError:
    """The first error of a request's validation as the project's error."""
    first = exc.errors()[0]
    raised = first.get("ctx", {}).get("error")
    if isinstance(raised, ServeError):
        return raised
    where = where_of(first["loc"])
    wording = _WORDING.get(first["type"])
    if wording is None:
        return InvalidRequestError(f"{where}: {first['msg']}")
    return InvalidRequestError(wording.format(where=where, **first.get("ctx", {})))


def parse_body(model: type[M], body: dict[str, Any], context: dict[str, Any] | None = None) -> M:
    """`body` validated by `model`; `context` holds what a validator checks against the served
    model (its dimensions, its number of labels)."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        raise request_error(exc) from None


async def read_body_as(
    request: Request, model: type[M], context: dict[str, Any] | None = None, lift: str | None = None
) -> M:
    """The body validated by `model`; `lift` names a member whose long string is left in the body
    (serving/http.py `read_json_object`: an image's base64)."""
    return parse_body(model, await read_json_object(request, lift), context)


async def read_request_for_model(
    request: Request, model: type[M], context: dict[str, Any] | None = None, lift: str | None = None
) -> M:
    """`read_body_as`, then the body's `model` field, when it names one, checked against the served
    model (404 otherwise): what every OpenAI-style route (embeddings, classify, rerank, ner) does."""
    body = await read_body_as(request, model, context, lift)
    name = getattr(body, "model", None)
    if name is not None:
        check_model(request, name, None)
    return body


def worded(says: str, *, item: str | None = None) -> WrapValidator:
    """A field's own wording when its value does not validate: `<field> <says>`, or, when one
    item of a list is wrong and `item` is given, `<field>[i] <item>`."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            if item is not None and loc and isinstance(loc[0], int):
                raise InvalidRequestError(f"{info.field_name}[{loc[0]}] {item}") from None
            raise InvalidRequestError(f"{info.field_name} {says}") from None

    return WrapValidator(check)


PositiveInt = Annotated[int, Field(ge=1), worded("must be a positive integer")]


def component_schemas(requests: Sequence[type[BaseModel]], answers: Sequence[type[BaseModel]]) -> dict[str, Any]:
    """OpenAPI component schemas of request models (as they validate) and answer models (as they
    serialize), and of every model they refer to."""
    _, doc = models_json_schema(
        [*((m, "validation") for m in requests), *((m, "serialization") for m in answers)],
        ref_template="#/components/schemas/{model}",
    )
    return dict(doc["$defs"])
