"""Text in, token ids out: the bundle's tokenizer, its limits, and length buckets.

Tokenization uses Hugging Face `tokenizers` with the bundle's tokenizer.json and settings, so
the server tokenizes exactly as the parity gate did. A request of several texts (or a long one)
is tokenized off the event loop (`encode_async`): `encode_batch` releases the GIL and tokenizes
the texts in parallel, and the loop keeps serving other requests meanwhile (inline, 16 sentences
held the loop ~2.5 ms). Texts are bounded in characters before they are tokenized (a 4 MB text
would take seconds to tokenize only to be truncated to 256 tokens): with truncation on they are
cut at `max_chars` (100 characters per token by default, far beyond what `max_tokens` tokens
span in any real text, so the tokens kept are the same), with it off they are refused (413).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, Field, StrictInt, ValidationInfo

from ortpack.kernel.contracts import TextSettings
from ortpack.serving import context
from ortpack.serving.bodies import worded
from ortpack.serving.errors import InvalidRequestError, PayloadTooLargeError

# A request of one text up to this long is tokenized inline on the event loop (~50-70 us for a
# sentence: less than the hop to a thread); a longer text, or several texts, on a thread.
_INLINE_CHARS = 4096
# Default character bound per text: this many characters per token of --max-tokens.
CHARS_PER_TOKEN = 100


def default_buckets(max_tokens: int) -> tuple[int, ...]:
    """Ceilings 4 tokens apart up to 32, then 8 up to 64, 16 up to 128, 32 beyond; `max_tokens`
    is always the last. A batch is padded to its longest item, so fine buckets keep padding small
    (measured on short queries: 1.05x padded/real tokens against 1.11x with powers of two, and
    ~10% less CPU per request); on CPU, batching barely raises the model's throughput, so
    smaller batches cost little."""
    buckets, size = [], 8
    while size < max_tokens:
        buckets.append(size)
        size += 4 if size < 32 else 8 if size < 64 else 16 if size < 128 else 32
    buckets.append(max_tokens)
    return tuple(buckets)


@dataclass(frozen=True, slots=True)
class TokenPair:
    """A tokenized (query, document) pair: ids and segment ids. Its length is its token count."""

    ids: np.ndarray
    type_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class Encoded:
    payloads: list[Any]  # int64 token-id arrays, one per text (or a TokenPair per pair)
    buckets: list[int]  # each text's padded-length ceiling
    tokens: int  # real tokens in the request (for `usage`)


class TextEncoder:
    """`tokenizer_json` is the text of the bundle's tokenizer.json (read and verified by the caller:
    the server tokenizes with exactly the bytes it checked)."""

    def __init__(
        self, tokenizer_json: str, *, max_tokens: int, truncate: bool, buckets: Sequence[int], max_chars: int = 0
    ) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.no_padding()
        self.max_tokens = max_tokens
        self.max_chars = max_chars or CHARS_PER_TOKEN * max_tokens
        self.truncate = truncate
        if truncate:
            self.tokenizer.enable_truncation(max_tokens)
        else:
            self.tokenizer.no_truncation()
        ceilings = sorted({b for b in buckets if b < max_tokens} | {max_tokens})
        self.buckets = tuple(ceilings)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def for_server(cls, tokenizer_json: str, model_max_length: int, config: Any) -> TextEncoder:
        """The encoder a server uses: the bundle's tokenizer with the server's limits
        (--max-tokens, --truncate, --buckets, --max-text-chars from `config`)."""
        max_tokens = config.max_tokens or model_max_length
        if max_tokens > model_max_length:
            raise ValueError(f"--max-tokens {max_tokens} exceeds the model's {model_max_length}")
        return cls(
            tokenizer_json,
            max_tokens=max_tokens,
            truncate=config.truncate,
            buckets=config.buckets or default_buckets(max_tokens),
            max_chars=config.max_text_chars,
        )

    def warm_up_batches(self, max_batch_size: int) -> list[list[np.ndarray]]:
        """Batch 1 at every bucket ceiling and a full batch at the smallest, biggest first."""

        def ids(length: int) -> np.ndarray:
            return np.full(length, 1000 % self.vocab_size, dtype=np.int64)

        batches = [[ids(b)] for b in self.buckets] + [[ids(self.buckets[0])] * max_batch_size]
        return sorted(batches, key=lambda batch: -len(batch) * len(batch[0]))

    def bucket_of(self, length: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, length)]

    def _finish(self, id_lists: Sequence[Sequence[int]]) -> Encoded:
        payloads, buckets, tokens = [], [], 0
        for index, ids in enumerate(id_lists):
            if len(ids) > self.max_tokens:
                raise PayloadTooLargeError(
                    f"input[{index}] has {len(ids)} tokens; the limit is {self.max_tokens} "
                    "(this server does not truncate)"
                )
            payloads.append(np.asarray(ids, dtype=np.int64))
            buckets.append(self.bucket_of(len(ids)))
            tokens += len(ids)
        ctx = context.current()
        if ctx is not None:
            ctx.tokens += tokens
        return Encoded(payloads=payloads, buckets=buckets, tokens=tokens)

    def bound(self, texts: Sequence[str], where: str = "input") -> Sequence[str]:
        """Texts within `max_chars`: longer ones cut there (truncation on) or refused (413)."""
        limit, cut = self.max_chars, None
        for index, text in enumerate(texts):
            if len(text) > limit:
                if not self.truncate:
                    raise PayloadTooLargeError(
                        f"{where}[{index}] has {len(text)} characters; the limit is {limit} "
                        "(this server does not truncate)"
                    )
                cut = list(texts) if cut is None else cut
                cut[index] = text[:limit]
        return texts if cut is None else cut

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> Encoded:
        """(query, document) pairs as one sequence each, with segment ids; truncation (when on)
        shortens the longer text first, as Hugging Face tokenizers do."""
        pairs = [
            (a, b) for a, b in zip(self.bound([p[0] for p in pairs]), self.bound([p[1] for p in pairs]), strict=True)
        ]
        encodings = self.tokenizer.encode_batch(pairs)
        checked = self._finish([e.ids for e in encodings])
        payloads = [
            TokenPair(ids=ids, type_ids=np.asarray(e.type_ids, dtype=np.int64))
            for ids, e in zip(checked.payloads, encodings, strict=True)
        ]
        return Encoded(payloads=payloads, buckets=checked.buckets, tokens=checked.tokens)

    async def encode_pairs_async(self, pairs: Sequence[tuple[str, str]]) -> Encoded:
        started = time.perf_counter()
        if len(pairs) == 1 and len(pairs[0][0]) + len(pairs[0][1]) <= _INLINE_CHARS:
            encoded = self.encode_pairs(pairs)
        else:
            encoded = await asyncio.to_thread(self.encode_pairs, pairs)
            _check_deadline()
        _count_time(started)
        return encoded

    def encode(self, texts: Sequence[str]) -> Encoded:
        texts = self.bound(texts)
        if len(texts) == 1:
            return self._finish([self.tokenizer.encode(texts[0]).ids])
        return self._finish([e.ids for e in self.tokenizer.encode_batch(list(texts))])

    async def encode_async(self, texts: Sequence[str]) -> Encoded:
        """One short text inline; several texts, or a long one, on a thread (in parallel there)."""
        started = time.perf_counter()
        if len(texts) == 1 and len(texts[0]) <= _INLINE_CHARS:
            encoded = self.encode(texts)
        else:
            encoded = await asyncio.to_thread(self.encode, texts)
            _check_deadline()
        _count_time(started)
        return encoded

    def from_ids(self, id_lists: Sequence[Sequence[int]]) -> Encoded:
        """Token-id input (OpenAI allows it): used as given, checked against the vocabulary."""
        started = time.perf_counter()
        checked = []
        for index, ids in enumerate(id_lists):
            if len(ids) > self.max_tokens and self.truncate:
                ids = ids[: self.max_tokens]
            for token in ids:
                if not 0 <= token < self.vocab_size:
                    raise InvalidRequestError(f"input[{index}] has token id {token}, outside 0..{self.vocab_size - 1}")
            checked.append(ids)
        encoded = self._finish(checked)
        _count_time(started)
        return encoded


def _count_time(started: float) -> None:
    """Add the time since `started` to the current request's tokenize stage."""
    ctx = context.current()
    if ctx is not None:
        ctx.tokenize_s += time.perf_counter() - started


def payload_tokens(payload: Any) -> int:
    """Tokens of one text payload: an int64 id array or a TokenPair (its len() is its tokens)."""
    return len(payload)


class TokenizedRuntime:
    """What every text task's runtime shares: texts are token payloads of no cost beyond the
    token budget, warmed up at every bucket of its `encoder`, and probed with `_probe` (the
    bundle's tokenizer at its own max length: `probe_prepare`)."""

    encoder: TextEncoder
    _probe: Any

    def item_cost(self) -> tuple[None, float]:
        return None, float("inf")

    def item_tokens(self) -> Callable[[Any], int]:
        return payload_tokens

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        return list(self.encoder.warm_up_batches(max_batch_size))

    def probe_prepare(self) -> Any:
        return self._probe


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


def v2_texts(tensor: dict[str, Any]) -> list[str]:
    """The strings of an Open Inference Protocol BYTES tensor of shape [n] or [n, 1] (row-major
    data, flat or nested), checked against its shape."""
    name = tensor.get("name")
    shape, data = tensor.get("shape"), tensor.get("data")
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


def probe_prepare(settings: TextSettings, files: dict[str, bytes]) -> Any:
    """Probe inputs (texts, or (query, document) pairs) to token payloads with the bundle's
    tokenizer at the bundle's own max length, whatever --max-tokens the server uses: the probe
    checks the variant, not the server's limits."""
    tokenizer = settings.tokenizer
    length = tokenizer.max_length
    encoder = TextEncoder(files[tokenizer.file].decode(), max_tokens=length, truncate=True, buckets=(length,))

    def prepare(inputs: Sequence[Any]) -> list[Any]:
        if inputs and isinstance(inputs[0], tuple):
            return list(encoder.encode_pairs([(str(a), str(b)) for a, b in inputs]).payloads)
        return list(encoder.encode([str(t) for t in inputs]).payloads)

    return prepare
