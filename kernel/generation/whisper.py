"""Whisper on the generation engine: the encoder graph once per 30 s window, the decoder graph as the
engine's step function with the window's cross-attention keys and values beside each sequence's
own cache.

The two graphs (exported by components/core/exporters/speech_recognition.py):

- the encoder: mono 16 kHz waveforms `audio` float32 `[batch, samples]` (at most one window; the
  log-mel front end is inside the graph) to every decoder layer's cross-attention keys and values,
  `cross_key_values.N.key` / `.value` float32 `[batch, heads, frames, head_dim]` (1,500 frames
  for 30 s). Computing them once per window is what an encoder-decoder step would otherwise redo
  every token (6 layers x 2 projections of 1,500 x 512 x 512 for whisper-base: 4.7 GFLOP a token).
- the decoder: the text-generation step (ortpack.kernel.generation.decoder: `input_ids`,
  `attention_mask`, `position_ids`, `logits_to_keep`, `past_key_values.N.*` in; `logits`,
  `present.N.*` out) with the cross keys and values as inputs too: the engine feeds them as the
  sequence's context (`GenerationRequest.context`), stacked row by row like the cache.

This module holds what is Whisper's own: its settings (special tokens, suppressed tokens, the
window), the prompt (start of transcript, language, task, no timestamps), the rules that mask
logits as Whisper's `generate` masks them, and the windows of long audio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.engine import GenerationRequest
from ortpack.kernel.generation.sampling import SamplingParams

AUDIO = "audio"  # the encoder's input: mono waveforms at the model's sampling rate


def cross_name(layer: int, kind: str) -> str:
    """The encoder's output and the decoder's input for a layer's cross-attention keys or values."""
    return f"cross_key_values.{layer}.{kind}"


def cross_names(layers: int) -> list[str]:
    return [cross_name(layer, kind) for layer in range(layers) for kind in ("key", "value")]


@dataclass(frozen=True, kw_only=True)
class WhisperSettings:
    """What the loop needs of a Whisper checkpoint (its config and generation_config.json)."""

    layers: int
    heads: int
    head_dim: int
    vocab_size: int
    max_target_positions: int  # the decoder's learned positions: prompt and transcript together
    sampling_rate: int = 16_000
    chunk_samples: int = 480_000  # one window: 30 s
    frames: int = 1_500  # encoder frames per window (cross-attention length)
    start_of_transcript: int
    end_of_text: int
    transcribe: int
    translate: int | None
    no_timestamps: int
    start_of_prev: int | None = None
    languages: dict[str, int] = field(default_factory=dict)  # "en" -> <|en|>'s id; empty: English-only
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)


def whisper_settings(config: Any, generation: Any) -> WhisperSettings:
    """The settings of a transformers WhisperConfig and its GenerationConfig."""
    heads = int(config.decoder_attention_heads)
    langs = dict(getattr(generation, "lang_to_id", None) or {})
    tasks = dict(getattr(generation, "task_to_id", None) or {})
    multilingual = bool(getattr(generation, "is_multilingual", bool(langs)))
    return WhisperSettings(
        layers=int(config.decoder_layers),
        heads=heads,
        head_dim=int(config.d_model) // heads,
        vocab_size=int(config.vocab_size),
        max_target_positions=int(config.max_target_positions),
        frames=int(config.max_source_positions),
        start_of_transcript=int(generation.decoder_start_token_id),
        end_of_text=int(generation.eos_token_id),
        transcribe=int(tasks.get("transcribe", generation.decoder_start_token_id + 1)),
        translate=int(tasks["translate"]) if multilingual and "translate" in tasks else None,
        no_timestamps=int(generation.no_timestamps_token_id),
        start_of_prev=getattr(generation, "prev_sot_token_id", None),
        languages={k.strip("<|>"): int(v) for k, v in langs.items()} if multilingual else {},
        suppress_tokens=tuple(int(t) for t in (generation.suppress_tokens or ())),
        begin_suppress_tokens=tuple(int(t) for t in (generation.begin_suppress_tokens or ())),
    )


def prompt_ids(settings: WhisperSettings, *, language: str | None = None, task: str = "transcribe") -> list[int]:
    """The decoder's prompt: start of transcript, then (multilingual models) the language and the
    task, then no timestamps. `language` is a code ("en", "de"); None on a multilingual model is
    English (`detect_language` finds it first where a request names none). An English-only model
    takes "en" or None."""
    if task not in ("transcribe", "translate"):
        raise InputError(f"task must be 'transcribe' or 'translate', got {task!r}")
    ids = [settings.start_of_transcript]
    if not settings.multilingual:
        if language not in (None, "en"):
            raise InputError(f"this model is English-only; language {language!r} is not one it takes")
        if task == "translate":
            raise InputError("this model is English-only and does not translate")
    else:
        code = (language or "en").lower()
        if code not in settings.languages:
            raise InputError(
                f"unknown language {language!r}; this model takes {len(settings.languages)} language codes"
            )
        ids.append(settings.languages[code])
        ids.append(settings.transcribe if task == "transcribe" else settings.translate)  # type: ignore[arg-type]
    ids.append(settings.no_timestamps)
    return ids


def detect_language(decoder: Any, settings: WhisperSettings, context: Sequence[Any]) -> str:
    """The language of a window: the language token likeliest right after start of transcript
    (Whisper's own detection, as transformers' `generate` and openai-whisper run it)."""
    out = decoder.prefill([settings.start_of_transcript], context=context)
    codes = list(settings.languages)
    scores = out.logits[0, -1][np.array([settings.languages[c] for c in codes])]
    return codes[int(np.argmax(scores))]


class SuppressTokens:
    """The logits rules of Whisper's `generate` without timestamps (transformers'
    SuppressTokensLogitsProcessor and SuppressTokensAtBeginLogitsProcessor): the checkpoint's
    suppressed tokens never, its begin-suppressed tokens (a blank, end of text) not as the first.
    Called by the loop with the sequence's generated ids and its logits row (changed in place)."""

    def __init__(self, settings: WhisperSettings) -> None:
        size = settings.vocab_size
        self.always = np.array([t for t in settings.suppress_tokens if t < size], np.int64)
        first = {*settings.suppress_tokens, *settings.begin_suppress_tokens}
        self.first = np.array(sorted(t for t in first if t < size), np.int64)

    def __call__(self, generated: Sequence[int], row: np.ndarray) -> None:
        row[self.first if not generated else self.always] = -np.inf


@dataclass(frozen=True, slots=True)
class Window:
    """One 30 s window of a recording: its samples (at most a chunk) and where it starts."""

    index: int
    start_s: float
    samples: np.ndarray


def windows(audio: np.ndarray, settings: WhisperSettings) -> list[Window]:
    """A recording cut into consecutive windows of one chunk (the last shorter; the graph pads it)."""
    if audio.ndim != 1 or not len(audio):
        raise InputError("the audio has no samples")
    size = settings.chunk_samples
    return [
        Window(index=i, start_s=start / settings.sampling_rate, samples=audio[start : start + size])
        for i, start in enumerate(range(0, len(audio), size))
    ]


class Encoder:
    """One session of the encoder graph: windows of audio to their cross-attention keys and values.
    Calls from several threads run one at a time: the session already uses every core it was given,
    and eight callers at once on 2 cores took longer together than one after another (measured,
    bench/whisper.py)."""

    def __init__(self, session: Any, settings: WhisperSettings) -> None:
        import threading

        self.session = session
        self.settings = settings
        self.output_names = cross_names(settings.layers)
        self._lock = threading.Lock()

    def encode(self, samples: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """Each window's cross keys and values (batch 1 each, in the decoder's input order). Windows
        are padded with zeros to the longest, which leaves their features unchanged."""
        width = max(len(s) for s in samples)
        batch = np.zeros((len(samples), width), np.float32)
        for row, s in enumerate(samples):
            batch[row, : len(s)] = s
        with self._lock:
            outputs = self.session.run(self.output_names, {AUDIO: batch})
        return [[np.ascontiguousarray(o[row : row + 1]) for o in outputs] for row in range(len(samples))]


@dataclass(frozen=True, slots=True)
class Segment:
    """One window's transcript and where it lies in the recording (seconds); `avg_logprob`: the
    mean log-probability of its tokens, when they were asked for."""

    start_s: float
    end_s: float
    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    avg_logprob: float | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """Windows ready for the loop: their requests, and the language they are transcribed in (the
    request's, or the one detected on the first window; None for an English-only model)."""

    language: str | None
    requests: list[GenerationRequest]


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str
    segments: tuple[Segment, ...]
    duration_s: float
    language: str | None


class Transcriber:
    """Recordings to transcripts: each 30 s window encoded once, then decoded by the generation
    loop (`generator`, over the decoder graph) as one sequence whose context is the window's cross
    keys and values. The windows of one recording are independent (no previous text is fed as a
    prompt, no timestamps), so they decode side by side in the running batch, with other
    requests' windows. `requests` and `transcript` are the two halves a server drives itself
    (ortpack.serving.tasks.automatic_speech_recognition); `transcribe` runs both, blocking."""

    def __init__(self, encoder: Encoder, generator: Any, settings: WhisperSettings) -> None:
        self.encoder = encoder
        self.generator = generator
        self.settings = settings
        self.rule = SuppressTokens(settings)

    def requests(
        self,
        parts: Sequence[Window],
        *,
        language: str | None = None,
        task: str = "transcribe",
        temperature: float = 0.0,
        logprobs: bool = False,
    ) -> Prepared:
        """The generation requests of windows (encoded here, one call for all), in order: greedy at
        temperature 0 (OpenAI's default for transcriptions), else sampled at that temperature. A
        multilingual model told no language detects it on the first window, for them all (as
        openai-whisper does for a recording)."""
        contexts = self.encoder.encode([part.samples for part in parts])
        if language is None and self.settings.multilingual:
            language = detect_language(self.generator.decoder, self.settings, contexts[0])
        prompt = prompt_ids(self.settings, language=language, task=task)
        sampling = SamplingParams(temperature=temperature, logprobs=0 if logprobs else None)
        budget = self.settings.max_target_positions - len(prompt)
        requests = [
            GenerationRequest(prompt=prompt, max_tokens=budget, sampling=sampling, context=c, rules=(self.rule,))
            for c in contexts
        ]
        return Prepared(language=language, requests=requests)

    def segment(self, part: Window, events: Sequence[Any]) -> Segment:
        """A window's segment from its generation events (the last one has the finish reason)."""
        end = self.settings.end_of_text
        picks = [p.logprob for e in events for p in e.logprobs if p.logprob is not None]
        last = events[-1]
        return Segment(
            start_s=part.start_s,
            end_s=part.start_s + len(part.samples) / self.settings.sampling_rate,
            text="".join(e.text for e in events).strip(),
            tokens=tuple(t for e in events for t in e.tokens if t != end),
            finish_reason=last.error or last.finish_reason or "",
            avg_logprob=float(np.mean(picks)) if picks else None,
        )

    def transcript(self, audio: np.ndarray, segments: Sequence[Segment], language: str | None) -> Transcript:
        return Transcript(
            text=" ".join(s.text for s in segments if s.text),
            segments=tuple(segments),
            duration_s=len(audio) / self.settings.sampling_rate,
            language=language or (None if self.settings.multilingual else "en"),
        )

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        language: str | None = None,
        task: str = "transcribe",
        temperature: float = 0.0,
        timeout_s: float = 600.0,
    ) -> Transcript:
        """Transcribe a mono recording at the model's sampling rate, blocking until every window is
        decoded (TimeoutError past `timeout_s`)."""
        import threading

        parts = windows(audio, self.settings)
        prepared = self.requests(parts, language=language, task=task, temperature=temperature)
        requests, language = prepared.requests, prepared.language
        done = [threading.Event() for _ in parts]
        events: list[list[Any]] = [[] for _ in parts]

        def sink_for(i: int) -> Any:
            def sink(event: Any) -> None:
                events[i].append(event)
                if event.finish_reason is not None:
                    done[i].set()

            return sink

        handles = []
        try:
            for i, request in enumerate(requests):
                handles.append(self.generator.submit(request, sink_for(i)))
            for i, finished in enumerate(done):
                if not finished.wait(timeout_s):
                    raise TimeoutError(f"window {i} of the recording was not transcribed in {timeout_s:.0f} s")
        finally:
            for handle in handles:
                handle.cancel()  # a no-op for the finished ones
        segments = [self.segment(part, evs) for part, evs in zip(parts, events, strict=True)]
        return self.transcript(audio, segments, language)
