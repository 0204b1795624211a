"""A text-generation graph as a step function: token ids, their positions, the attention mask and
the past keys and values in; the last positions' logits and the present keys and values out.

One step serves both phases of generation. A prefill step feeds a prompt (or a chunk of it) after
the sequence's own cache; a decode step feeds one new token per running sequence after their
caches side by side (ortpack.kernel.generation.cache). The graph's tensors are the contract's
(ortpack.kernel.contracts.text_generation); a graph without position ids (ALiBi) or without
`logits_to_keep` (a graph from another builder) is fed what it takes.

A graph may take more inputs than the contract's: a sequence's context, fixed for its whole life
and fed beside its cache at every step (Whisper's cross-attention keys and values, computed once
per audio window: ortpack.kernel.generation.whisper). Their shapes are static but for the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ortpack.kernel.contracts.text_generation import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    DecoderSettings,
    cache_names,
    past_name,
    present_name,
)

# every layer's keys and values, in the graph's order, [batch, heads, length, width]: numpy arrays, or
# ONNX Runtime's OrtValues as a step leaves them (fed back as they are: see `Decoder.step`)
Cache = list[Any]


def as_array(value: Any) -> np.ndarray:
    """A cache tensor as a numpy array (an OrtValue's own memory, not a copy: keep the OrtValue)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def cache_nbytes(cache: Cache) -> int:
    return sum(as_array(v).nbytes for v in cache)


class LogitsRule(Protocol):
    """A sequence's rule over its next token's logits (Whisper's suppressed tokens): called with the
    ids generated so far and the logits row, which it changes in place (-inf: never this token)."""

    def __call__(self, generated: Sequence[int], row: np.ndarray, /) -> None: ...


@dataclass(frozen=True, slots=True)
class StepOutput:
    logits: np.ndarray  # [batch, kept, vocab] float32
    present: Cache  # the past with the step's tokens appended, as OrtValues


class Decoder:
    """One session of a text-generation graph. Thread-compatible, not thread-safe: one caller at a
    time (the generation loop, or a check)."""

    def __init__(self, session: Any, settings: DecoderSettings) -> None:
        self.session = session
        self.settings = settings
        inputs = {i.name for i in session.get_inputs()}
        self.past_names = [past_name(i, kind) for i, kind in cache_names(settings.layers)]
        self.output_names = [LOGITS, *(present_name(i, kind) for i, kind in cache_names(settings.layers))]
        self.takes_positions = POSITION_IDS.name in inputs
        self.takes_keep = LOGITS_TO_KEEP.name in inputs
        self.dtype = np.dtype(settings.kv_dtype)
        known = {INPUT_IDS.name, ATTENTION_MASK.name, POSITION_IDS.name, LOGITS_TO_KEEP.name, *self.past_names}
        self.context_inputs = [i for i in session.get_inputs() if i.name not in known]
        self.context_names = [i.name for i in self.context_inputs]

    @property
    def vocab_size(self) -> int:
        return self.settings.vocab_size

    def empty_cache(self, batch: int = 1) -> Cache:
        d = self.settings
        return [np.zeros((batch, d.kv_heads, 0, d.head_dim), self.dtype) for _ in self.past_names]

    def empty_context(self, batch: int = 1) -> Cache:
        """Zeros in the shape of the graph's context inputs (none for a decoder-only model): what a
        warm-up feeds."""
        out = []
        for i in self.context_inputs:
            dims = i.shape[1:]
            if not all(isinstance(d, int) for d in dims):
                raise ValueError(f"the context input {i.name} has dynamic dimensions {dims} past the batch")
            out.append(np.zeros((batch, *dims), np.float32 if "float" in i.type else np.int64))
        return out

    def step(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        mask: np.ndarray,
        past: Sequence[Any],
        keep: int = 1,
        context: Sequence[Any] = (),
    ) -> StepOutput:
        """Run one step: `ids` and `positions` `[batch, sequence]`, `mask` `[batch, past + sequence]`
        (1 for a real token, 0 for padding), `past` as `empty_cache` or a previous step's present,
        `context` the rows' context tensors (`context_names`' order); the logits of the last `keep`
        positions.

        The cache goes in and out as OrtValues (`run_with_ort_values`): `run` would copy every
        present tensor into a new numpy array, and a cache fed back as numpy costs that copy every
        step (13 sequences of 1,500 tokens on the Qwen2-0.5B shape: 2.0 s a step against 0.65 s)."""
        import onnxruntime as ort

        wrap = ort.OrtValue.ortvalue_from_numpy
        feeds: dict[str, Any] = {INPUT_IDS.name: wrap(ids), ATTENTION_MASK.name: wrap(mask)}
        if self.takes_positions:
            feeds[POSITION_IDS.name] = wrap(np.ascontiguousarray(positions))
        if self.takes_keep:
            feeds[LOGITS_TO_KEEP.name] = wrap(np.array([keep], dtype=np.int64))
        for name, value in zip(self.past_names, past, strict=True):
            feeds[name] = wrap(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
        for name, value in zip(self.context_names, context, strict=True):
            feeds[name] = wrap(value) if isinstance(value, np.ndarray) else value
        logits, *present = self.session.run_with_ort_values(self.output_names, feeds)
        scores = np.array(logits.numpy())  # a copy: the logits outlive their OrtValue
        if not self.takes_keep:
            scores = scores[:, -keep:]
        return StepOutput(logits=scores, present=present)

    def prefill(
        self, ids: Sequence[int], past: Cache | None = None, *, keep: int = 1, context: Sequence[Any] = ()
    ) -> StepOutput:
        """One sequence's tokens after its own cache (`past`, unpadded; None: an empty one)."""
        past = self.empty_cache(1) if past is None else past
        start = as_array(past[0]).shape[2]
        tokens = np.asarray(ids, dtype=np.int64)[None]
        n = tokens.shape[1]
        positions = np.arange(start, start + n, dtype=np.int64)[None]
        return self.step(tokens, positions, np.ones((1, start + n), np.int64), past, keep, context)

    def greedy(
        self,
        prompt: Sequence[int],
        count: int,
        *,
        chunk: int = 0,
        context: Sequence[Any] = (),
        rules: Sequence[LogitsRule] = (),
        stop: frozenset[int] = frozenset(),
    ) -> np.ndarray:
        """`count` tokens of greedy continuation of one prompt, prefilled in chunks of `chunk`
        tokens (0: at once), each row of logits passed through `rules` first, ending early at a
        token in `stop` (kept): what a check compares with PyTorch's `generate`."""
        past: Cache | None = None
        ids = list(prompt)
        size = chunk or len(ids)
        for start in range(0, len(ids), size):
            out = self.prefill(ids[start : start + size], past, context=context)
            past = out.present
        tokens: list[int] = []
        for _ in range(count):
            row = out.logits[0, -1]
            for rule in rules:
                rule(tokens, row)
            token = int(np.argmax(row))
            tokens.append(token)
            if token in stop:
                break
            out = self.prefill([token], past, context=context)
            past = out.present
        return np.array(tokens, dtype=np.int64)

    def teacher_forced(
        self, prompt: Sequence[int], continuation: Sequence[int], *, context: Sequence[Any] = ()
    ) -> np.ndarray:
        """The logits of each continuation token's position given everything before it, in one
        step: `[len(continuation), vocab]` (row i predicts continuation[i])."""
        ids = [*prompt, *continuation[:-1]]
        out = self.prefill(ids, keep=len(continuation), context=context)
        return out.logits[0]
