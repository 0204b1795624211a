"""The automatic-speech-recognition contract: a Whisper checkpoint as two graphs, its tokenizer and
its generation settings, gated on transcripts of shipped speech against PyTorch's.

The variant's graph (`model.onnx`) is the decoder step, the text-generation contract's tensors
with every layer's cross-attention keys and values as inputs too (`cross_key_values.N.key` /
`.value`, `[batch, heads, frames, head_dim]`). The encoder graph (`encoder.onnx`: mono waveforms
`audio` `[batch, samples]` to those cross keys and values, Whisper's log-mel front end inside) is
one file of the bundle that every variant shares, like the tokenizer: a variant's precision is its
decoder's (ortpack.kernel.generation.whisper says how the two run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import Field

from ortpack.kernel.contracts.base import Strict, TaskContract, TaskOptions, TaskSettings
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.contracts.text_generation import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    cache_names,
    matched_prefix,
    past_name,
    present_name,
)
from ortpack.kernel.gates import ceiling, floor, gate_table
from ortpack.kernel.generation.whisper import WhisperSettings, cross_name

TASK = "automatic-speech-recognition"
ENCODER_FILE = "encoder.onnx"
AUDIO_REQUEST = (Tensor("audio", "float32", (BATCH, "samples")),)  # mono samples at the model's rate

# The longest transcript the gate and the probe compare (a shipped clip's is 12-16 tokens; a model
# that runs on, random weights for one, is compared up to here, PyTorch's `generate` stopped alike)
GATE_MAX_TOKENS = 128

# How long a recording the server takes by default (its windows decode side by side): 10 minutes
MAX_SECONDS = 600.0


class SpeechRecognitionOptions(TaskOptions):
    """A Whisper export takes no options beyond its source."""


class WhisperSection(Strict):
    """The checkpoint's decoder geometry, special tokens and suppressed tokens (the kernel's
    `WhisperSettings`, as the manifest records it)."""

    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_target_positions: int = Field(gt=4)
    sampling_rate: int = Field(gt=0)
    chunk_samples: int = Field(gt=0)
    frames: int = Field(gt=0)
    start_of_transcript: int
    end_of_text: int
    transcribe: int
    translate: int | None = None
    no_timestamps: int
    start_of_prev: int | None = None
    languages: dict[str, int] = Field(default_factory=dict)
    suppress_tokens: list[int] = Field(default_factory=list)
    begin_suppress_tokens: list[int] = Field(default_factory=list)

    def kernel(self) -> WhisperSettings:
        data = self.model_dump()
        data["suppress_tokens"] = tuple(data["suppress_tokens"])
        data["begin_suppress_tokens"] = tuple(data["begin_suppress_tokens"])
        return WhisperSettings(**data)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.heads * self.head_dim * 4

    @property
    def cross_bytes(self) -> int:
        """One window's cross keys and values, held beside its sequence while it decodes."""
        return self.layers * 2 * self.heads * self.frames * self.head_dim * 4


class SpeechRecognitionSettings(TaskSettings):
    task: Literal["automatic-speech-recognition"] = "automatic-speech-recognition"
    tokenizer_file: str = "tokenizer.json"
    encoder_file: str = ENCODER_FILE
    whisper: WhisperSection
    max_seconds: float = Field(default=MAX_SECONDS, gt=0)

    def shared_files(self) -> list[str]:
        return [self.tokenizer_file, self.encoder_file]


def signature(settings: SpeechRecognitionSettings) -> Signature:
    """The decoder step's tensors for this checkpoint's geometry."""
    w = settings.whisper
    past = tuple(
        Tensor(past_name(i, kind), "float32", (BATCH, w.heads, "past_sequence", w.head_dim))
        for i, kind in cache_names(w.layers)
    )
    cross = tuple(
        Tensor(cross_name(i, kind), "float32", (BATCH, w.heads, w.frames, w.head_dim))
        for i, kind in cache_names(w.layers)
    )
    present = tuple(
        Tensor(present_name(i, kind), "float32", (BATCH, w.heads, "total_sequence", w.head_dim))
        for i, kind in cache_names(w.layers)
    )
    return Signature(
        inputs=(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS_TO_KEEP, *past, *cross),
        outputs=(Tensor(LOGITS, "float32", (BATCH, "kept", w.vocab_size)), *present),
        request=AUDIO_REQUEST,
    )


CONTRACT = TaskContract(
    name=TASK,
    options=SpeechRecognitionOptions,
    settings=SpeechRecognitionSettings,
    signature=signature,
    gates=gate_table(
        # the share of the shipped clips whose greedy transcript equals PyTorch's token for token
        floor("exact_match"),
        # words of the variant's transcripts against PyTorch's (not against what was said: the
        # gate is the packaging's, not the model's)
        ceiling("word_error_rate"),
        # the shortest greedy transcript's share that matches PyTorch's from the start
        floor("greedy_match"),
    ),
    engine="ortpack.kernel.engines.automatic_speech_recognition",
    plugin="ortpack.serving.tasks.automatic_speech_recognition",
)


# ---------------------------------------------------------------- benchmark inputs

BENCH_PAST = 32  # transcript tokens in the cache of a benchmarked decode step
BENCH_BATCHES = (1, 8)


def decode_step_feeds(w: WhisperSection, batch: int, past: int = BENCH_PAST) -> dict[str, np.ndarray]:
    """One decode step's feeds: a token per row after `past` cached ones, with random caches and
    cross keys and values (what the benchmark times, PyTorch's step and each variant's)."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        INPUT_IDS.name: rng.integers(0, w.vocab_size, (batch, 1), dtype=np.int64),
        ATTENTION_MASK.name: np.ones((batch, past + 1), np.int64),
        POSITION_IDS.name: np.full((batch, 1), past, np.int64),
        LOGITS_TO_KEEP.name: np.array([1], np.int64),
    }
    for i, kind in cache_names(w.layers):
        feeds[past_name(i, kind)] = rng.standard_normal((batch, w.heads, past, w.head_dim)).astype(np.float32)
    for i, kind in cache_names(w.layers):
        feeds[cross_name(i, kind)] = rng.standard_normal((batch, w.heads, w.frames, w.head_dim)).astype(np.float32)
    return feeds


# ---------------------------------------------------------------- the gate's arithmetic


def words(text: str) -> list[str]:
    """A transcript's words for the error rate: lowercased, punctuation stripped (as WER is
    usually counted: "Hello, world." and "hello world" are the same words)."""
    kept = "".join(c.lower() if c.isalnum() or c.isspace() or c == "'" else " " for c in text)
    return kept.split()


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Word substitutions, deletions and insertions that turn `reference` into `hypothesis`."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, start=1):
        current = [i]
        for j, hyp in enumerate(hypothesis, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def token_metrics(references: list[list[int]], candidates: list[list[int]]) -> dict[str, float]:
    """Transcripts (token ids, without the end of text) against PyTorch's, token for token: the share
    equal, and the least and mean share of each matched from the start (what the probe measures)."""
    shares = [
        matched_prefix(np.asarray(r), np.asarray(c)) / max(len(r), 1)
        for r, c in zip(references, candidates, strict=True)
    ]
    return {
        "exact_match": float(np.mean([r == c for r, c in zip(references, candidates, strict=True)])),
        "greedy_match": float(min(shares)),
        "mean_greedy_match": float(np.mean(shares)),
    }


def transcript_metrics(
    references: list[list[int]], candidates: list[list[int]], decode: Callable[[list[int]], str]
) -> dict[str, float]:
    """`token_metrics`, and the word error rate over all clips (words of the decoded texts)."""
    errors = sum(edit_distance(words(decode(r)), words(decode(c))) for r, c in zip(references, candidates, strict=True))
    total = sum(len(words(decode(r))) for r in references)
    return {**token_metrics(references, candidates), "word_error_rate": float(errors / max(total, 1))}
