"""Serving Whisper (task `automatic-speech-recognition`): OpenAI `POST /v1/audio/transcriptions`,
and `POST /v1/audio/translations` for a multilingual model, as multipart forms
(serving/transcriptions.py parses them and writes every response format).

A request's file is decoded off the event loop (kernel/audio.py: WAV, FLAC, OGG Vorbis/Opus, MP3
to mono 16 kHz, refused with a 4xx when it cannot or may not be), cut into 30 s windows, and each
window encoded once (the bundle's encoder graph) and decoded as one sequence of the generation
loop, which this runtime starts once the server is warm and stops at shutdown. A recording's
windows go to the loop WINDOWS_AT_ONCE at a time (fewer when the loop holds fewer), so a long
recording holds a bounded share of the loop. The loop's capacity counts each window's cache and
its cross keys and values against the server's memory budget (`--max-memory`); a request that
does not fit now is refused with 429 and Retry-After. The body limit is the server's `--max-body-bytes`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.audio import decode_audio
from ortpack.kernel.engines.automatic_speech_recognition import SpeechRecognitionEngine
from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.engine import Event, Generator, LoopStoppedError
from ortpack.kernel.generation.scheduler import CacheFullError, Limits
from ortpack.kernel.generation.whisper import Segment, Transcriber, Window, windows
from ortpack.serving.errors import InferenceError, NotReadyError, OverloadedError, from_input_error
from ortpack.serving.generation.stream import EventQueue, collect
from ortpack.serving.http import RouteSpec, check_model, config_of, read_body
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as
from ortpack.serving.transcriptions import TranscriptionForm, parse_form, render

log = logging.getLogger("ortpack.serve")

ERRORS = (400, 404, 413, 415, 429, 503)
WINDOWS_AT_ONCE = 4  # of one recording, in the loop together


class SpeechRecognitionRuntime:
    """The HTTP side of a Whisper variant, and the generation loop it drives."""

    def __init__(self, ctx: LoadContext) -> None:
        from tokenizers import Tokenizer

        _check_audio_decoder()
        engine = engine_as(ctx, SpeechRecognitionEngine)
        self.engine = engine
        self.settings = engine.settings
        self.whisper = engine.whisper
        self.config = ctx.config
        self.tokenizer = Tokenizer.from_str(engine.tokenizer_json)
        self.transcriber: Transcriber | None = None
        self.generator: Generator | None = None
        self.windows_at_once = WINDOWS_AT_ONCE

    # -- lifecycle (ortpack.serving.service.ModelService.start / stop)

    async def start(self, service: Any) -> None:
        """Size the loop from the memory budget (a window's cache at its longest and its cross keys
        and values), warm its shapes and start it."""
        config, w = self.config, self.settings.whisper
        context = w.max_target_positions
        per_window = 2 * w.kv_bytes_per_token * context + w.cross_bytes
        windows_held = config.max_running_sequences
        budget = service.memory
        if budget.limit is not None:
            free = max(0, budget.limit - budget.held)
            windows_held = max(1, min(windows_held, int(free * config.kv_cache_share) // per_window))
            budget.shrink(windows_held * per_window)
        limits = Limits(
            capacity=windows_held * context,
            context=context,
            max_running=config.max_running_sequences,
            max_waiting=config.max_waiting_sequences,
        )
        decoder = self.engine.decoder
        if decoder is None or self.engine.encoder is None:
            raise RuntimeError("the engine has no session")
        generator = Generator(decoder, self.tokenizer, [self.whisper.end_of_text], limits)
        if config.warmup:
            seconds = await asyncio.to_thread(generator.warm_up)
            log.info("speech warm-up: %.2f s", seconds)
        generator.start()
        self.generator = generator
        self.windows_at_once = max(1, min(WINDOWS_AT_ONCE, windows_held))  # a recording never waits on itself
        self.transcriber = Transcriber(self.engine.encoder, generator, self.whisper)
        log.info(
            "speech: up to %d windows in the loop (%.0f MB of cache and cross keys/values)",
            windows_held,
            windows_held * per_window / 1e6,
        )

    async def stop(self) -> None:
        if self.generator is not None:
            await asyncio.to_thread(self.generator.stop, self.config.drain_timeout_s)

    # -- the routes

    async def transcriptions(self, request: Request) -> Response:
        return await self._answer(request, task="transcribe")

    async def translations(self, request: Request) -> Response:
        return await self._answer(request, task="translate")

    async def _answer(self, request: Request, *, task: str) -> Response:
        limit = config_of(request).max_body_bytes
        body = await read_body(request, limit)
        form = parse_form(
            body, request.headers.get("content-type"), max_file_bytes=limit, translation=task == "translate"
        )
        del body
        if form.model is not None:
            check_model(request, form.model, None)
        language = form.language if task == "transcribe" else None
        try:
            samples = await asyncio.to_thread(
                decode_audio,
                form.file,
                sampling_rate=self.whisper.sampling_rate,
                max_seconds=self.settings.max_seconds,
                max_bytes=limit,
            )
            parts = windows(samples, self.whisper)
            segments: list[Segment] = []
            step = self.windows_at_once
            for start in range(0, len(parts), step):  # the language detected on the first window holds for all
                language, more = await self._decode(parts[start : start + step], form, language, task)
                segments += more
        except InputError as exc:
            raise from_input_error(exc) from None
        assert self.transcriber is not None
        transcript = self.transcriber.transcript(samples, segments, language)
        content, media_type = render(transcript, form, task=task)
        return Response(content, media_type=media_type)

    async def _decode(
        self, parts: list[Window], form: TranscriptionForm, language: str | None, task: str
    ) -> tuple[str | None, list[Segment]]:
        """Windows encoded (off the event loop) and decoded by the loop together: their language
        (detected when none is given) and segments."""
        transcriber, generator = self.transcriber, self.generator
        if transcriber is None or generator is None:
            raise NotReadyError("the model is not ready yet (warming up)")
        prepared = await asyncio.to_thread(
            transcriber.requests,
            parts,
            language=language,
            task=task,
            temperature=form.temperature,
            logprobs=form.response_format == "verbose_json",
        )
        streams: list[tuple[EventQueue, Any]] = []
        try:
            for item in prepared.requests:
                queue = EventQueue()
                streams.append((queue, generator.submit(item, queue.put)))
        except CacheFullError as exc:
            for _, handle in streams:
                handle.cancel()
            raise OverloadedError(str(exc), headers={"Retry-After": str(generator.retry_after())}) from None
        except LoopStoppedError:
            for _, handle in streams:
                handle.cancel()
            raise NotReadyError("shutting down") from None
        finished = await collect(streams)
        for events in finished:
            _check(events[-1])
        segments = [transcriber.segment(part, events) for part, events in zip(parts, finished, strict=True)]
        return prepared.language, segments

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        raise InputError("this model transcribes through /v1/audio/transcriptions, not the v2 infer route")

    def routes(self) -> list[RouteSpec]:
        common: dict[str, Any] = {"method": "POST", "errors": ERRORS, "request_media": ("multipart/form-data",)}
        routes = [
            RouteSpec(
                path="/v1/audio/transcriptions",
                handler=self.transcriptions,
                summary="Transcribe audio (OpenAI audio transcriptions; multipart form with `file`)",
                operation_id="createTranscription",
                **common,
            )
        ]
        if self.whisper.multilingual:
            routes.append(
                RouteSpec(
                    path="/v1/audio/translations",
                    handler=self.translations,
                    summary="Translate audio into English text (OpenAI audio translations; multipart form)",
                    operation_id="createTranslation",
                    **common,
                )
            )
        return routes

    def schemas(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        routes = "/v1/audio/transcriptions" + (" and /v1/audio/translations" if self.whisper.multilingual else "")
        return f"speech recognition (Whisper): {routes}"


def _check_audio_decoder() -> None:
    """Refuse to serve a speech bundle where uploads could not be decoded (a server without the
    `audio` extra would answer every request 500)."""
    import importlib.util

    missing = [name for name in ("soundfile", "soxr") if importlib.util.find_spec(name) is None]
    if missing:
        raise RuntimeError(
            f"serving a speech bundle needs {' and '.join(missing)} to decode uploads: pip install 'ortpack[audio]'"
        )


def _check(last: Event) -> None:
    """A window that ended in an error fails its request (500, with the loop's reason)."""
    if last.finish_reason == "error":
        raise InferenceError(last.error or "the model failed")


TASK = ServingTask(name="automatic-speech-recognition", open=SpeechRecognitionRuntime)
