"""Text in, token ids out: the bundle's tokenizer, its limits, and length buckets.

Tokenization uses Hugging Face `tokenizers` with the bundle's tokenizer.json and settings, so
the server tokenizes exactly as the parity gate did. Long requests are tokenized off the event
loop (`encode_async`).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.errors import InvalidRequestError, PayloadTooLargeError

# Requests whose total text is longer than this are tokenized in a worker thread.
_INLINE_CHARS = 4096


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
class Encoded:
    payloads: list[np.ndarray]  # int64 token ids, one array per text
    buckets: list[int]  # each text's padded-length ceiling
    tokens: int  # real tokens in the request (for `usage`)


class TextEncoder:
    def __init__(self, tokenizer_file: Path, *, max_tokens: int, truncate: bool, buckets: Sequence[int]) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.max_tokens = max_tokens
        self.truncate = truncate
        if truncate:
            self.tokenizer.enable_truncation(max_tokens)
        else:
            self.tokenizer.no_truncation()
        ceilings = sorted({b for b in buckets if b < max_tokens} | {max_tokens})
        self.buckets = tuple(ceilings)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

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
        return Encoded(payloads=payloads, buckets=buckets, tokens=tokens)

    def encode(self, texts: Sequence[str]) -> Encoded:
        if len(texts) == 1:
            return self._finish([self.tokenizer.encode(texts[0]).ids])
        return self._finish([e.ids for e in self.tokenizer.encode_batch(list(texts))])

    async def encode_async(self, texts: Sequence[str]) -> Encoded:
        """Tokenize inline when small; in a worker thread when it could block the event loop."""
        if sum(len(t) for t in texts) <= _INLINE_CHARS:
            return self.encode(texts)
        return await asyncio.to_thread(self.encode, texts)

    def from_ids(self, id_lists: Sequence[Sequence[int]]) -> Encoded:
        """Token-id input (OpenAI allows it): used as given, checked against the vocabulary."""
        checked = []
        for index, ids in enumerate(id_lists):
            if len(ids) > self.max_tokens and self.truncate:
                ids = ids[: self.max_tokens]
            for token in ids:
                if not 0 <= token < self.vocab_size:
                    raise InvalidRequestError(f"input[{index}] has token id {token}, outside 0..{self.vocab_size - 1}")
            checked.append(ids)
        return self._finish(checked)
