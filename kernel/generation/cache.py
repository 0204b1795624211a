"""The running sequences' key/value caches, side by side for one decode step.

Every decode step feeds each running sequence's next token after its cache. The graph takes one
batch of caches of one length, so shorter caches are padded on the left and masked: a row's real
tokens stay contiguous at the right, which keeps causal and sliding-window masks exact (they
compare distances between real tokens, and left padding shifts all of a row's tokens alike), and
its position ids are its own (fed explicitly, not counted from the mask).

The step's present cache is the next step's past, so a batch whose rows do not change is never
copied here (the graph's concatenation copies it once per step). Rows that finish, and rows whose
prefill has just ended, change the batch between steps: `rebuild` copies it once for all of them,
then drops the columns no row needs any more.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpack.kernel.generation.decoder import Cache, Decoder, as_array, cache_nbytes


@dataclass(frozen=True, slots=True)
class Joining:
    """A sequence entering the batch: its key, its own cache (batch 1, unpadded), the position of
    its next token and its context (batch 1; none for a decoder-only model)."""

    key: Hashable
    cache: Cache
    position: int
    context: Sequence[Any] = ()


class DecodeBatch:
    """The caches of the running sequences, left-padded to the longest, with their attention mask
    and next positions; `keys[i]` names row i."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.keys: list[Hashable] = []
        self.past: Cache = decoder.empty_cache(0)
        self.mask = np.zeros((0, 0), np.int64)
        self.positions = np.zeros(0, np.int64)
        self.context: Cache = decoder.empty_context(0)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def length(self) -> int:
        """The padded cache length: the longest row's."""
        return int(self.mask.shape[1])

    @property
    def nbytes(self) -> int:
        return cache_nbytes(self.past) + cache_nbytes(self.context)

    def real_tokens(self) -> int:
        return int(self.mask.sum())

    def rebuild(self, keep: Sequence[Hashable], joining: Sequence[Joining] = ()) -> None:
        """Keep the rows named in `keep` (in that order) and append `joining`; one copy of what
        stays, and the columns no remaining row uses are dropped."""
        rows = [self.keys.index(key) for key in keep]
        lengths = [int(self.mask[r].sum()) for r in rows] + [as_array(j.cache[0]).shape[2] for j in joining]
        width = max(lengths, default=0)
        batch = len(rows) + len(joining)
        d = self.decoder.settings
        past = [np.zeros((batch, d.kv_heads, width, d.head_dim), self.decoder.dtype) for _ in self.past]
        mask = np.zeros((batch, width), np.int64)
        for out, r in enumerate(rows):
            n = lengths[out]
            if n:
                for new, old in zip(past, self.past, strict=True):
                    new[out, :, width - n :] = as_array(old)[r, :, self.length - n :]
            mask[out, width - n :] = 1
        for out, j in enumerate(joining, start=len(rows)):
            n = lengths[out]
            if n:
                for new, own in zip(past, j.cache, strict=True):
                    new[out, :, width - n :] = as_array(own)[0]
            mask[out, width - n :] = 1
        self.past, self.mask = past, mask
        if self.context:  # whole rows, the same length for all: kept ones taken, joining ones appended
            self.context = [
                np.concatenate([mine[rows], *(j.context[i] for j in joining)]) for i, mine in enumerate(self.context)
            ]
        self.positions = np.array([*(self.positions[r] for r in rows), *(j.position for j in joining)], np.int64)
        self.keys = [*keep, *(j.key for j in joining)]

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Feed each row its next token (`tokens[i]` for row i); their logits `[batch, vocab]`."""
        batch = len(self.keys)
        mask = np.concatenate([self.mask, np.ones((batch, 1), np.int64)], axis=1)
        out = self.decoder.step(
            np.asarray(tokens, np.int64).reshape(batch, 1),
            self.positions.reshape(batch, 1).copy(),
            mask,
            self.past,
            context=self.context,
        )  # the present caches stay OrtValues: the next step's past, never copied here
        self.past, self.mask = out.present, mask
        self.positions = self.positions + 1
        return out.logits[:, -1]
