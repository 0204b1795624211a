"""The text-generation engine: a decoder's session, its tokenizer and the generation defaults, the
kind of engine that generation serving drives (ortpack.kernel.generation.engine runs its steps).

It still answers the single-pass `Engine` calls the shared machinery makes, for what they mean
here: the probe check replays each probe sequence (a prompt and PyTorch's greedy continuation of
it) through `run`, which gives the variant's own greedy continuation and its teacher-forced top
token at each position of PyTorch's; the validate step and every serving node gate those. Serving
never batches through `run`: the generation loop owns the session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ortpack.kernel.contracts.text_generation import TextGenerationSettings, greedy_metrics
from ortpack.kernel.engine import EngineContext, EngineSpec, Item
from ortpack.kernel.generation.decoder import Decoder

CONTINUATION = "continuation"  # the probe's reference: PyTorch's greedy ids
TEACHER_TOP1 = "teacher_top1"  # the variant's top token at each position of PyTorch's continuation


class TextGenerationEngine:
    """A decoder graph's session with its bundle's tokenizer and settings."""

    units = "tokens"
    padded = True
    max_batch_size = 1  # a probe sequence at a time
    max_batch_cost = float("inf")
    cost_per_byte = 0.125
    batching = "continuous batching (the generation loop)"

    def __init__(self, ctx: EngineContext) -> None:
        settings = ctx.settings
        if not isinstance(settings, TextGenerationSettings):
            raise ValueError(f"not a text-generation bundle: {settings.task}")
        self.context = ctx
        self.settings = settings
        self.signature = ctx.signature
        self.session = ctx.session
        self.tokenizer_json = ctx.files[settings.tokenizer.file].decode()
        self.chat_template = ctx.files[settings.chat.file].decode() if settings.chat is not None else None
        self.decoder = Decoder(ctx.session, settings.decoder) if ctx.session is not None else None

    def on(self, session: Any) -> TextGenerationEngine:
        return TextGenerationEngine(replace(self.context, session=session))

    def cost(self, payload: Any) -> float:
        prompt, continuation = payload
        return float(len(prompt) + len(continuation))

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        return []  # the generation loop warms up its own shapes

    def probe_payloads(self, inputs: Sequence[Any]) -> list[Any]:
        return [(np.asarray(p, np.int64), np.asarray(c, np.int64)) for p, c in inputs]

    def run(self, payloads: Sequence[Any]) -> list[Item]:
        """Per (prompt, PyTorch's continuation): the variant's greedy continuation of the same
        length and its top token at each position of PyTorch's continuation."""
        if self.decoder is None:
            raise RuntimeError("the engine has no session yet")
        items = []
        for prompt, continuation in payloads:
            greedy = self.decoder.greedy(prompt.tolist(), len(continuation))
            forced = self.decoder.teacher_forced(prompt.tolist(), continuation.tolist())
            items.append({CONTINUATION: greedy, TEACHER_TOP1: forced.argmax(-1).astype(np.int64)})
        return items


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    """Greedy continuations against PyTorch's, and the share of positions whose teacher-forced top
    token is PyTorch's (the next-token distributions themselves are gated at build time)."""
    refs = [item[CONTINUATION] for item in reference]
    values = greedy_metrics(refs, [item[CONTINUATION] for item in candidate])
    forced = np.concatenate([item[TEACHER_TOP1] for item in candidate])
    values["top1_agreement"] = float(np.mean(forced == np.concatenate(refs)))
    return values


ENGINE = EngineSpec(name="text-generation", open=TextGenerationEngine, probe_metrics=probe_metrics, own_loop=True)
