"""The automatic-speech-recognition engine: a Whisper bundle's decoder session (the variant's
graph), its encoder session (the bundle's shared `encoder.onnx`), its tokenizer and settings, the
kind of engine speech serving drives (the generation loop decodes, kernel/generation/whisper.py).

It answers the single-pass `Engine` calls the shared machinery makes, for what they mean here:
the probe check replays each probe clip (a WAV file, decoded as an upload is) through `run`, which
gives the variant's greedy transcript of it; the validate step and every serving node gate those
against PyTorch's. Serving never batches through `run`: the generation loop owns the decoder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ortpack.kernel.audio import decode_audio
from ortpack.kernel.contracts.automatic_speech_recognition import (
    GATE_MAX_TOKENS,
    SpeechRecognitionSettings,
    token_metrics,
)
from ortpack.kernel.contracts.text_generation import DecoderSettings
from ortpack.kernel.engine import EngineContext, EngineSpec, Item
from ortpack.kernel.generation.decoder import Decoder
from ortpack.kernel.generation.whisper import Encoder, SuppressTokens, WhisperSettings, prompt_ids

TRANSCRIPT = "transcript"  # the probe's reference: PyTorch's greedy ids (without the end of text)


def open_encoder(
    graph: bytes, whisper: WhisperSettings, providers: Sequence[str] = ("CPUExecutionProvider",)
) -> Encoder:
    """A session of the encoder graph (its bytes, verified by the caller) on every core."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.log_severity_level = 3
    return Encoder(ort.InferenceSession(graph, options, providers=list(providers)), whisper)


def whisper_decoder(session: Any, settings: SpeechRecognitionSettings) -> Decoder:
    """The decoder step as the generation engine's Decoder (the cross keys and values are its context)."""
    w = settings.whisper
    geometry = DecoderSettings(
        model_type="whisper", layers=w.layers, kv_heads=w.heads, head_dim=w.head_dim, vocab_size=w.vocab_size
    )
    return Decoder(session, geometry)


class SpeechRecognitionEngine:
    """A Whisper bundle's sessions with its tokenizer and settings."""

    units = "seconds"
    padded = True
    max_batch_size = 1  # a probe clip at a time
    max_batch_cost = float("inf")
    cost_per_byte = 1 / 32000  # 16-bit PCM at 16 kHz: bytes to seconds, for a body's share of the memory budget
    batching = "continuous batching of the decoder (the generation loop)"

    def __init__(self, ctx: EngineContext, encoder: Encoder | None = None) -> None:
        settings = ctx.settings
        if not isinstance(settings, SpeechRecognitionSettings):
            raise ValueError(f"not an automatic-speech-recognition bundle: {settings.task}")
        self.context = ctx
        self.settings = settings
        self.whisper = settings.whisper.kernel()
        self.signature = ctx.signature
        self.session = ctx.session
        self.tokenizer_json = ctx.files[settings.tokenizer_file].decode()
        self.decoder = whisper_decoder(ctx.session, settings) if ctx.session is not None else None
        if encoder is None and ctx.session is not None:
            encoder = open_encoder(ctx.files[settings.encoder_file], self.whisper, ctx.session.get_providers())
        self.encoder = encoder
        self.rule = SuppressTokens(self.whisper)

    def on(self, session: Any) -> SpeechRecognitionEngine:
        return SpeechRecognitionEngine(replace(self.context, session=session), self.encoder)

    def cost(self, payload: Any) -> float:
        return float(len(payload)) / self.whisper.sampling_rate

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        return []  # the generation loop warms up its own shapes

    def probe_payloads(self, inputs: Sequence[Any]) -> list[Any]:
        """Each probe WAV decoded as an upload is (kernel/audio.py: to mono at the model's rate)."""
        limit = self.settings.max_seconds
        return [
            decode_audio(data, sampling_rate=self.whisper.sampling_rate, max_seconds=limit, max_bytes=len(data) + 1)
            for data in inputs
        ]

    def transcribe_window(self, samples: np.ndarray) -> np.ndarray:
        """One window's greedy transcript (English on a multilingual model), without the end of text."""
        if self.decoder is None or self.encoder is None:
            raise RuntimeError("the engine has no session yet")
        (context,) = self.encoder.encode([samples])
        language = "en" if self.whisper.multilingual else None
        end = self.whisper.end_of_text
        tokens = self.decoder.greedy(
            prompt_ids(self.whisper, language=language),
            GATE_MAX_TOKENS,
            context=context,
            rules=[self.rule],
            stop=frozenset([end]),
        )
        return tokens[tokens != end].astype(np.int64)

    def run(self, payloads: Sequence[Any]) -> list[Item]:
        return [{TRANSCRIPT: self.transcribe_window(samples)} for samples in payloads]


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    """Transcripts against PyTorch's, token for token (the word error rate is gated at build time,
    where the tokenizer decodes them)."""
    refs = [item[TRANSCRIPT].tolist() for item in reference]
    return token_metrics(refs, [item[TRANSCRIPT].tolist() for item in candidate])


ENGINE = EngineSpec(
    name="automatic-speech-recognition", open=SpeechRecognitionEngine, probe_metrics=probe_metrics, own_loop=True
)
