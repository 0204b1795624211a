"""Backends: what runs a batch. The batcher only needs `run(payloads) -> rows`.

`TextEmbeddingBackend` pads token ids to the batch's longest (never past its bucket's ceiling,
which the batcher guarantees), builds the attention mask, and runs one ONNX Runtime session.
ORT's `run` releases the GIL, so several worker threads run batches at once on one session.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ortpack.kernel.bundle import Variant


class Backend(Protocol):
    """Runs one batch of payloads and returns one output row per payload, in order."""

    def run(self, payloads: Sequence[Any]) -> np.ndarray: ...


class TextEmbeddingBackend:
    """Token-id arrays in, `sentence_embedding` rows out."""

    def __init__(self, session: Any, input_names: Sequence[str], pad_token_id: int, output_dim: int) -> None:
        self.session = session
        self.input_names = list(input_names)
        self.pad_token_id = pad_token_id
        self.output_dim = output_dim

    def feeds(self, payloads: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        width = max(len(p) for p in payloads)
        ids = np.full((len(payloads), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(payloads), width), dtype=np.int64)
        for row, tokens in enumerate(payloads):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {name: arrays[name] for name in self.input_names}

    def run(self, payloads: Sequence[np.ndarray]) -> np.ndarray:
        return self.session.run(None, self.feeds(payloads))[0]


def load_session(
    model: Path | bytes, variant: Variant, *, intra_op_threads: int, allow_spinning: bool = False
) -> tuple[Any, Any]:
    """An ORT session for a bundle variant, tuned for serving: `intra_op_threads` each (the
    server runs several calls at once instead) and, by default, no spin-waiting, which would
    steal the cores the HTTP layer needs. The lone session (a batch that runs alone on every
    core) spins: without it, its threads sleep between operators and two threads were slower
    than one (int8 MiniLM, b1 x ~19 tokens, AMD EPYC: 1 thread 3.55 ms, 2 threads 3.90 ms
    without spinning, 2.90 ms with it)."""
    from ortpack.kernel.runtime import create_session, plan_for

    plan = plan_for(variant)
    session = create_session(model, plan, intra_op_threads=intra_op_threads, allow_spinning=allow_spinning)
    return session, plan


class ImageClassifierBackend:
    """uint8 [H, W, 3] images of one size in, `probabilities` rows out (the full graph: resizing,
    cropping and normalising happen inside it)."""

    def __init__(self, session: Any, classes: int) -> None:
        self.session = session
        self.output_dim = classes

    def run(self, payloads: Sequence[np.ndarray]) -> np.ndarray:
        return self.session.run(None, {"images": np.stack(payloads)})[0]


class TextClassifierBackend(TextEmbeddingBackend):
    """Token ids (or `TokenPair`s, for cross-encoders) in, the classifier's output rows out
    (probabilities or relevance scores: the activation is in the graph)."""

    def feeds(self, payloads: Sequence[Any]) -> dict[str, np.ndarray]:
        arrays = super().feeds([getattr(p, "ids", p) for p in payloads])
        if "token_type_ids" in arrays and any(hasattr(p, "type_ids") for p in payloads):
            types = arrays["token_type_ids"]
            for row, payload in enumerate(payloads):
                segment = getattr(payload, "type_ids", None)
                if segment is not None:
                    types[row, : len(segment)] = segment
        return arrays
