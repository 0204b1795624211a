"""Text in, token ids out: the bundle's tokenizer, its limits, and length buckets.

Tokenization uses Hugging Face `tokenizers` with the bundle's tokenizer.json and settings, so a
server tokenizes exactly as the parity gate did. Texts are bounded in characters before they are
tokenized (a 4 MB text would take seconds to tokenize only to be truncated to 256 tokens): with
truncation on they are cut at `max_chars` (100 characters per token by default, far beyond what
`max_tokens` tokens span in any real text, so the tokens kept are the same), with it off they are
refused. `encode_batch` releases the GIL, so a caller may tokenize on a thread
(ortpack.serving.text does, off the event loop).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpack.kernel.errors import InputError, InputTooLargeError

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
    def with_limits(
        cls,
        tokenizer_json: str,
        model_max_length: int,
        *,
        max_tokens: int,
        truncate: bool,
        buckets: Sequence[int],
        max_chars: int,
    ) -> TextEncoder:
        """The encoder a server uses: the bundle's tokenizer with the server's limits (0 and ():
        the model's own max length and `default_buckets`)."""
        max_tokens = max_tokens or model_max_length
        if max_tokens > model_max_length:
            raise ValueError(f"--max-tokens {max_tokens} exceeds the model's {model_max_length}")
        return cls(
            tokenizer_json,
            max_tokens=max_tokens,
            truncate=truncate,
            buckets=buckets or default_buckets(max_tokens),
            max_chars=max_chars,
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
                raise InputTooLargeError(
                    f"input[{index}] has {len(ids)} tokens; the limit is {self.max_tokens} "
                    "(this server does not truncate)"
                )
            payloads.append(np.asarray(ids, dtype=np.int64))
            buckets.append(self.bucket_of(len(ids)))
            tokens += len(ids)
        return Encoded(payloads=payloads, buckets=buckets, tokens=tokens)

    def bound(self, texts: Sequence[str], where: str = "input") -> Sequence[str]:
        """Texts within `max_chars`: longer ones cut there (truncation on) or refused."""
        limit, cut = self.max_chars, None
        for index, text in enumerate(texts):
            if len(text) > limit:
                if not self.truncate:
                    raise InputTooLargeError(
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

    def encode(self, texts: Sequence[str]) -> Encoded:
        texts = self.bound(texts)
        if len(texts) == 1:
            return self._finish([self.tokenizer.encode(texts[0]).ids])
        return self._finish([e.ids for e in self.tokenizer.encode_batch(list(texts))])

    def from_ids(self, id_lists: Sequence[Sequence[int]]) -> Encoded:
        """Token-id input (OpenAI allows it): used as given, checked against the vocabulary."""
        checked = []
        for index, ids in enumerate(id_lists):
            if len(ids) > self.max_tokens and self.truncate:
                ids = ids[: self.max_tokens]
            for token in ids:
                if not 0 <= token < self.vocab_size:
                    raise InputError(f"input[{index}] has token id {token}, outside 0..{self.vocab_size - 1}")
            checked.append(ids)
        return self._finish(checked)


def payload_tokens(payload: Any) -> int:
    """Tokens of one text payload: an int64 id array or a TokenPair (its len() is its tokens)."""
    return len(payload)
