"""Texts in requests: the body types every text task's requests share (`Texts`, `TextsOrTokens`),
Open Inference Protocol string tensors, and tokenizing off the event loop.

The tokenizer is the kernel's (ortpack.kernel.tokenizer: the bundle's tokenizer.json with the
server's limits). A request of several texts (or a long one) is tokenized on a thread here:
`encode_batch` releases the GIL and tokenizes the texts in parallel, and the loop keeps serving
other requests meanwhile (inline, 16 sentences held the loop ~2.5 ms). The time it takes is the
request's `tokenize` stage, its tokens are counted, and its deadline is checked after.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import AfterValidator, Field, StrictInt, ValidationInfo

from ortpack.kernel.tokenizer import Encoded, TextEncoder
from ortpack.serving import context
from ortpack.serving.bodies import worded
from ortpack.serving.errors import InvalidRequestError

if TYPE_CHECKING:
    from ortpack.serving.tasks.contract import InferInput

# A request of one text up to this long is tokenized inline on the event loop (~50-70 us for a
# sentence: less than the hop to a thread); a longer text, or several texts, on a thread.
INLINE_CHARS = 4096

T = TypeVar("T")


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _turn() -> asyncio.Semaphore:
    """The event loop's one tokenizing thread at a time (a semaphore belongs to one loop)."""
    loop = asyncio.get_running_loop()
    turn = _TURNS.get(loop)
    if turn is None:
        turn = _TURNS[loop] = asyncio.Semaphore(1)
    return turn


async def tokenize(work: Callable[[], T], inline: bool) -> T:
    """`work()` (a tokenization) inline or on a thread, timed as the request's tokenize stage; the
    request's deadline is checked after a thread's work, and an `Encoded` result's tokens counted.
    Threads tokenize one request at a time (`encode_batch` already uses every core): a burst of
    large requests tokenized all at once took the cores from the model calls admitted before them
    and made them late."""
    started = time.perf_counter()
    if inline:
        result = work()
    else:
        async with _turn():
            result = await asyncio.to_thread(work)
        _check_deadline()
    ctx = context.current()
    if ctx is not None:
        ctx.tokenize_s += time.perf_counter() - started
        if isinstance(result, Encoded):
            ctx.tokens += result.tokens
    return result


async def encode_texts(encoder: TextEncoder, texts: Sequence[str]) -> Encoded:
    """One short text inline; several texts, or a long one, on a thread (in parallel there)."""
    return await tokenize(lambda: encoder.encode(texts), len(texts) == 1 and len(texts[0]) <= INLINE_CHARS)


async def encode_pairs(encoder: TextEncoder, pairs: Sequence[tuple[str, str]]) -> Encoded:
    inline = len(pairs) == 1 and len(pairs[0][0]) + len(pairs[0][1]) <= INLINE_CHARS
    return await tokenize(lambda: encoder.encode_pairs(pairs), inline)


async def encode_ids(encoder: TextEncoder, id_lists: Sequence[Sequence[int]]) -> Encoded:
    """Token-id input (OpenAI allows it), checked against the vocabulary, inline."""
    return await tokenize(lambda: encoder.from_ids(id_lists), True)


def context_tokens(count: int) -> None:
    """Count `count` tokens to the current request (a tokenization `tokenize` did not see whole)."""
    ctx = context.current()
    if ctx is not None:
        ctx.tokens += count


def _check_deadline() -> None:
    ctx = context.current()
    if ctx is not None:
        ctx.check_deadline("while tokenizing")


def _no_blank(value: Any, info: ValidationInfo) -> Any:
    """Blank texts embed, classify and tag to nothing: refused, by index."""
    for i, text in enumerate([value] if isinstance(value, str) else value):
        if isinstance(text, str) and not text.strip():
            raise InvalidRequestError(f"{info.field_name}[{i}] is empty")
    return value


_TextList = Annotated[list[str], Field(min_length=1)]
_TokenIds = Annotated[list[StrictInt], Field(min_length=1)]

Texts = Annotated[
    str | _TextList,
    worded("must be a non-empty string or a non-empty list of strings"),
    AfterValidator(_no_blank),
]
"""A request's texts (a field of a request model): one string or a list of them, none blank."""

TextsOrTokens = Annotated[
    str | _TextList | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1)],
    worded("must be a non-empty string, a list of strings, a token-id array or a list of non-empty token-id arrays"),
    AfterValidator(_no_blank),
]
"""OpenAI's `input`: a string, a list of strings, a token-id array or a list of them."""


def texts_or_ids(value: str | list[Any]) -> tuple[list[str] | None, list[list[int]] | None]:
    """A validated `TextsOrTokens` as (texts, None) or (None, token-id lists)."""
    if isinstance(value, str):
        return [value], None
    if isinstance(value[0], str):
        return value, None
    if isinstance(value[0], int):
        return None, [value]
    return None, value


def v2_texts(tensor: InferInput) -> list[str]:
    """The strings of an Open Inference Protocol BYTES tensor of shape [n] or [n, 1] (row-major
    data, flat or nested), checked against its shape."""
    name, shape, data = tensor.name, tensor.shape, tensor.data
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or not 1 <= len(shape) <= 2
        or (len(shape) == 2 and shape[1] != 1)
    ):
        raise InvalidRequestError(f"input '{name}' shape must be [n] or [n, 1], got {shape!r}")
    if isinstance(data, list) and data and all(isinstance(d, list) for d in data):
        if not all(len(row) == 1 for row in data) or len(shape) != 2:
            raise InvalidRequestError(f"input '{name}' data does not match its shape {shape}")
        data = [x for row in data for x in row]  # row-major nested form
    if not isinstance(data, list) or len(data) != shape[0]:
        raise InvalidRequestError(
            f"input '{name}' has shape {shape} but {len(data) if isinstance(data, list) else 'no'} elements"
        )
    if not data or not all(isinstance(text, str) for text in data):
        raise InvalidRequestError(f"input '{name}' must hold one or more non-empty strings")
    for i, text in enumerate(data):
        if not text.strip():
            raise InvalidRequestError(f"inputs[0].data[{i}] is empty")
    return data
