"""What the engines of text tasks share: the bundle's tokenizer with the caller's limits, payloads
of token ids padded per batch to the longest, a cost in tokens, warm-up at every bucket, and probe
texts tokenized at the bundle's own max length.

ONNX Runtime's `run` releases the GIL, so several worker threads run batches at once on one
session.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ortpack.kernel.contracts import TextSettings
from ortpack.kernel.engine import EngineContext, Item, as_items, declared_cost
from ortpack.kernel.tokenizer import TextEncoder


class TokenEngine:
    """Token-id payloads (int64 arrays, or `TokenPair`s for pairs) in, the graph's one output per
    item out (`post` may reshape each batch's output first)."""

    units = "tokens"
    padded = True
    max_batch_size = 0  # any
    cost_per_byte = 0.125  # a body byte's tokens before any request was seen: ~8 bytes of JSON text per token

    def __init__(self, ctx: EngineContext) -> None:
        settings = ctx.settings
        if not isinstance(settings, TextSettings):
            raise ValueError(f"not a text bundle: {settings.task}")
        tokenizer = settings.tokenizer
        options = ctx.options
        self.signature = ctx.signature
        self.session = ctx.session
        self.cost = declared_cost(ctx.signature.inputs[0])  # tokens (sequence), pixels (height x width)
        self.output = ctx.signature.outputs[0].name
        self.input_names = list(tokenizer.model_input_names)
        self.pad_token_id = tokenizer.pad_token_id
        self.max_length = tokenizer.max_length
        self._tokenizer_json = ctx.files[tokenizer.file].decode()
        self.encoder = TextEncoder.with_limits(
            self._tokenizer_json,
            tokenizer.max_length,
            max_tokens=options.max_tokens,
            truncate=options.truncate,
            buckets=options.buckets,
            max_chars=options.max_text_chars,
        )
        self.max_batch_cost = float(options.max_batch_tokens or math.inf)
        self.batching = f"buckets {self.encoder.buckets}"
        self._probe_encoder: TextEncoder | None = None

    def feeds(self, payloads: Sequence[Any]) -> dict[str, np.ndarray]:
        """Ids and attention mask padded to the batch's longest; segment ids from `TokenPair`s."""
        width = max(len(p) for p in payloads)
        ids = np.full((len(payloads), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(payloads), width), dtype=np.int64)
        types = np.zeros_like(ids)
        for row, payload in enumerate(payloads):
            tokens = getattr(payload, "ids", payload)
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
            segment = getattr(payload, "type_ids", None)
            if segment is not None:
                types[row, : len(segment)] = segment
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: arrays[name] for name in self.input_names}

    def post(self, payloads: Sequence[Any], output: np.ndarray) -> np.ndarray:
        """The batch's output rows as served (the graph's, unless a task pads or trims them)."""
        return output

    def run(self, payloads: Sequence[Any]) -> list[Item]:
        output = self.session.run(None, self.feeds(payloads))[0]
        return as_items(self.output, self.post(payloads, output))

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        return list(self.encoder.warm_up_batches(max_batch_size))

    def probe_payloads(self, inputs: Sequence[Any]) -> list[Any]:
        """Probe texts (or (query, document) pairs) with the bundle's tokenizer at the bundle's own
        max length, whatever limits the caller set: the probe checks the variant, not a server's
        limits."""
        if self._probe_encoder is None:
            length = self.max_length
            self._probe_encoder = TextEncoder(self._tokenizer_json, max_tokens=length, truncate=True, buckets=(length,))
        encoder = self._probe_encoder
        if inputs and isinstance(inputs[0], tuple):
            return list(encoder.encode_pairs([(str(a), str(b)) for a, b in inputs]).payloads)
        return list(encoder.encode([str(t) for t in inputs]).payloads)

    def on(self, session: Any) -> TokenEngine:
        other = copy.copy(self)
        other.session = session
        return other
