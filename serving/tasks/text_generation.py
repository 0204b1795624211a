"""Serving a decoder language model (task `text-generation`): OpenAI `POST /v1/chat/completions` and
`POST /v1/completions`, whole or streamed as server-sent events, and the Open Inference Protocol's
generate extension (`/v2/models/{name}/generate` and `generate_stream`, as Triton serves it).

The routes turn a request into prompt token ids (the chat template rendered as transformers
renders it, then the bundle's tokenizer) and submit one sequence per choice to the generation loop
(ortpack.kernel.generation.engine), which this runtime starts once the server is warm and stops at
shutdown. The loop's key/value cache is sized from the server's memory budget (`--max-memory`):
`--kv-cache-share` of what is left once the model is loaded, counted per token of prompt plus
max_tokens; a request that does not fit now is refused with 429 and Retry-After.

The request deadline (`--request-timeout-ms`, or a client's shorter `X-Request-Timeout`) bounds
the wait for the first token: a request still queued or prefilling then is answered 504. Once
tokens flow, the sequence runs to its stop or its max_tokens; a client that goes away frees its
place at the loop's next step.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ortpack.kernel.engines.text_generation import TextGenerationEngine
from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.chat import ChatTemplate, ChatTemplateError, openai_messages
from ortpack.kernel.generation.decoder import Decoder
from ortpack.kernel.generation.engine import Event, GenerationRequest, Generator, Handle, LoopStoppedError
from ortpack.kernel.generation.sampling import SamplingParams
from ortpack.kernel.generation.scheduler import CacheFullError, Limits
from ortpack.serving import context
from ortpack.serving.bodies import component_schemas, parse_body, read_request_for_model
from ortpack.serving.errors import (
    ClientClosedError,
    DeadlineExceededError,
    InferenceError,
    InvalidRequestError,
    NotReadyError,
    OverloadedError,
    ServeError,
    error_body,
    from_input_error,
)
from ortpack.serving.generation.api import (
    MAX_CHOICES,
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    GenerateRequest,
    GenerateResponse,
    Sampling,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from ortpack.serving.generation.metrics import GenerationMetrics
from ortpack.serving.generation.stream import DONE, SSE_HEADERS, EventQueue, collect, merged, sse
from ortpack.serving.http import RouteSpec, check_model, json_response, read_json_object, service_of
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as

log = logging.getLogger("ortpack.serve")

ERRORS = (400, 404, 413, 415, 429, 503, 504)
Streams = list[tuple[EventQueue, Handle]]


class TextGenerationRuntime:
    """The HTTP side of a text-generation variant, and the generation loop it drives."""

    def __init__(self, ctx: LoadContext) -> None:
        engine = engine_as(ctx, TextGenerationEngine)
        from tokenizers import Tokenizer

        self.engine = engine
        self.settings = engine.settings
        self.config = ctx.config
        self.tokenizer = Tokenizer.from_str(engine.tokenizer_json)
        self.vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        chat = engine.settings.chat
        self.template = (
            ChatTemplate(source=engine.chat_template, special_tokens=chat.special_tokens)
            if chat is not None and engine.chat_template is not None
            else None
        )
        self.context = engine.settings.tokenizer.max_length
        self.version = ctx.manifest.version
        self.fingerprint = f"{ctx.manifest.name}-{ctx.variant.id}"
        self.generator: Generator | None = None

    # -- lifecycle (ortpack.serving.service.ModelService.start / stop)

    async def start(self, service: Any) -> None:
        """Size the cache from the memory budget, warm the loop's shapes and start it."""
        config = self.config
        per_token = 2 * self.settings.decoder.kv_bytes_per_token  # the past and the present copy of a step
        budget = service.memory
        most = config.max_running_sequences * self.context
        if budget.limit is None:
            capacity = most
        else:
            free = max(0, budget.limit - budget.held)
            capacity = min(most, int(free * config.kv_cache_share) // per_token)
            budget.shrink(capacity * per_token)  # the cache's, for good: request bodies share the rest
        if capacity < self.context // 4:
            log.warning(
                "the key/value cache holds %d tokens: %.1f MB of memory per token of context; give the server "
                "more --max-memory for long requests",
                capacity,
                per_token / 1e6,
            )
        limits = Limits(
            capacity=max(1, capacity),
            context=self.context,
            max_running=config.max_running_sequences,
            max_waiting=config.max_waiting_sequences,
            max_chunk=config.prefill_chunk,
            prefill_share=config.prefill_share,
        )
        decoder = Decoder(self.engine.session, self.settings.decoder)
        generator = Generator(decoder, self.tokenizer, self.settings.generation.eos_token_ids, limits)
        generator.observer = GenerationMetrics(service.metrics.registry, generator)
        if config.warmup:
            seconds = await asyncio.to_thread(generator.warm_up)
            log.info("generation warm-up: %.2f s", seconds)
        generator.start()
        self.generator = generator
        log.info(
            "generation: cache of %d tokens (%.0f MB), context %d, up to %d sequences, prefill chunks up to %d",
            limits.capacity,
            limits.capacity * per_token / 1e6,
            self.context,
            limits.max_running,
            limits.max_chunk,
        )

    async def stop(self) -> None:
        if self.generator is not None:
            await asyncio.to_thread(self.generator.stop, self.config.drain_timeout_s)

    # -- prompts

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt must not be empty")
            return list(self.tokenizer.encode(prompt).ids)
        bad = next((t for t in prompt if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt has token id {bad}, outside 0..{self.vocab - 1}")
        return list(prompt)

    def chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        if self.template is None:
            raise InvalidRequestError("this model has no chat template: use /v1/completions")
        messages = openai_messages([m.model_dump(exclude_none=True) for m in body.messages])
        try:
            text = self.template.render(
                messages,
                add_generation_prompt=body.add_generation_prompt,
                tools=body.tools or None,
                extra=body.chat_template_kwargs,
            )
        except ChatTemplateError as exc:
            raise InvalidRequestError(f"messages: {exc}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    # -- submitting

    def request(
        self, prompt: list[int], body: Sampling, limit: int | None, logprobs: int | None, choice: int
    ) -> GenerationRequest:
        room = self.context - len(prompt)
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {len(prompt)} tokens; this model's context is {self.context} tokens"
            )
        if limit is not None and limit > room:
            raise InvalidRequestError(
                f"the prompt ({len(prompt)} tokens) and max_tokens ({limit}) exceed this model's context of "
                f"{self.context} tokens"
            )
        defaults = self.settings.generation
        sampling = SamplingParams(
            temperature=body.temperature if body.temperature is not None else defaults.temperature,
            top_p=body.top_p if body.top_p is not None else defaults.top_p,
            top_k=body.top_k if body.top_k is not None else defaults.top_k,
            seed=None if body.seed is None else body.seed + choice,
            logprobs=logprobs,
        )
        ctx = context.current()
        return GenerationRequest(
            prompt=prompt,
            max_tokens=limit or min(self.config.default_max_tokens, room),
            sampling=sampling,
            stop=body.stops(),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            deadline=ctx.deadline if ctx is not None else None,
        )

    def submit(self, requests: Sequence[GenerationRequest]) -> Streams:
        """Submit every choice's sequence, or none: one refused cancels those already in."""
        generator = self.generator
        if generator is None:
            raise NotReadyError("the model is not ready yet (warming up)")
        streams: Streams = []
        try:
            for request in requests:
                queue = EventQueue()
                streams.append((queue, generator.submit(request, queue.put)))
        except CacheFullError as exc:
            self._cancel(streams)
            raise OverloadedError(str(exc), headers={"Retry-After": str(generator.retry_after())}) from None
        except LoopStoppedError:
            self._cancel(streams)
            raise NotReadyError("shutting down") from None
        except InputError as exc:
            self._cancel(streams)
            raise from_input_error(exc) from None
        return streams

    @staticmethod
    def _cancel(streams: Streams) -> None:
        for _, handle in streams:
            handle.cancel()

    # -- OpenAI chat completions

    async def chat(self, request: Request) -> Response:
        body = await read_request_for_model(request, ChatCompletionRequest)
        prompt = self.chat_ids(body)
        top = (body.top_logprobs or 0) if body.logprobs else None
        requests = [self.request(prompt, body, body.limit, top, i) for i in range(body.n)]
        streams = self.submit(requests)
        model, created, rid = service_of(request).model_name, int(time.time()), _id("chatcmpl")
        if body.stream:
            with_usage = body.stream_options is not None and body.stream_options.include_usage
            return _stream(self._chat_chunks(streams, model, created, rid, with_usage, len(prompt)))
        finished = await collect(streams)
        choices = []
        for index, events in enumerate(finished):
            last = _check(events)
            choices.append(
                ChatChoice(
                    index=index,
                    message=AssistantMessage(content="".join(e.text for e in events)),
                    logprobs=ChoiceLogprobs(content=self._token_logprobs(events)) if body.logprobs else None,
                    finish_reason=last.finish_reason,
                )
            )
        answer = ChatCompletion(
            id=rid,
            created=created,
            model=model,
            choices=choices,
            usage=_usage(len(prompt), finished),
            system_fingerprint=self.fingerprint,
        )
        return json_response(answer.model_dump())

    async def _chat_chunks(
        self, streams: Streams, model: str, created: int, rid: str, usage: bool, prompt: int
    ) -> AsyncIterator[bytes]:
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        head["system_fingerprint"] = self.fingerprint
        for index in range(len(streams)):  # the role first, as OpenAI sends it
            delta = {"role": "assistant", "content": ""}
            yield sse({**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]})
        counts = [0] * len(streams)

        def chunk(index: int, event: Event) -> list[Any]:
            counts[index] = event.completion_tokens or counts[index]
            if event.finish_reason is not None and event.finish_reason not in ("stop", "length"):
                return [_stream_error(event)]
            logprobs = {"content": [p.model_dump() for p in self._token_logprobs([event])]} if event.logprobs else None
            delta = {"content": event.text} if event.text else {}
            out = []
            if delta or logprobs:
                out.append(
                    {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}]}
                )
            if event.finish_reason is not None:
                out.append(
                    {
                        **head,
                        "choices": [
                            {"index": index, "delta": {}, "logprobs": None, "finish_reason": event.finish_reason}
                        ],
                    }
                )
            return out

        async for data in merged(streams, chunk):
            yield data
        for data in _closing(head, usage, prompt, counts):
            yield data

    def _token_logprobs(self, events: list[Event]) -> list[TokenLogprob]:
        out = []
        for event in events:
            for pick in event.logprobs:
                text = self._token_text(pick.token)
                out.append(
                    TokenLogprob(
                        token=text,
                        logprob=_finite(pick.logprob),
                        bytes=list(text.encode("utf-8")),
                        top_logprobs=[
                            TopLogprob(
                                token=(t := self._token_text(i)), logprob=_finite(lp), bytes=list(t.encode("utf-8"))
                            )
                            for i, lp in pick.top
                        ],
                    )
                )
        return out

    def _token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    # -- OpenAI completions

    async def complete(self, request: Request) -> Response:
        body = await read_request_for_model(request, CompletionRequest)
        prompts = [self.prompt_ids(p) for p in body.prompts()]
        if len(prompts) * body.n > MAX_CHOICES:
            raise InvalidRequestError(f"{len(prompts)} prompts x n={body.n} choices; at most {MAX_CHOICES}")
        limit = body.max_tokens if body.max_tokens is not None else None
        requests = [
            self.request(p, body, limit if limit is not None else min(16, self.context - len(p)), body.logprobs, i)
            for p in prompts
            for i in range(body.n)
        ]
        streams = self.submit(requests)
        model, created, rid = service_of(request).model_name, int(time.time()), _id("cmpl")
        prompt_tokens = sum(len(p) for p in prompts) * body.n
        if body.stream:
            with_usage = body.stream_options is not None and body.stream_options.include_usage
            chunks = self._completion_chunks(streams, model, created, rid, with_usage, prompt_tokens, body.logprobs)
            return _stream(chunks)
        finished = await collect(streams)
        choices = []
        for index, events in enumerate(finished):
            last = _check(events)
            text = "".join(e.text for e in events)
            logprobs = self._completion_logprobs(events, 0) if body.logprobs is not None else None
            choices.append(
                CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=last.finish_reason)
            )
        completion_tokens = sum(events[-1].completion_tokens for events in finished)
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        answer = Completion(
            id=rid, created=created, model=model, choices=choices, usage=usage, system_fingerprint=self.fingerprint
        )
        return json_response(answer.model_dump())

    async def _completion_chunks(
        self, streams: Streams, model: str, created: int, rid: str, usage: bool, prompt: int, logprobs: int | None
    ) -> AsyncIterator[bytes]:
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        counts, offsets = [0] * len(streams), [0] * len(streams)

        def chunk(index: int, event: Event) -> list[Any]:
            counts[index] = event.completion_tokens or counts[index]
            if event.finish_reason is not None and event.finish_reason not in ("stop", "length"):
                return [_stream_error(event)]
            lp = self._completion_logprobs([event], offsets[index]).model_dump() if logprobs is not None else None
            offsets[index] += len(event.text)
            choice = {"index": index, "text": event.text, "logprobs": lp, "finish_reason": event.finish_reason}
            return [{**head, "choices": [choice]}] if event.text or event.finish_reason or lp else []

        async for data in merged(streams, chunk):
            yield data
        for data in _closing(head, usage, prompt, counts):
            yield data

    def _completion_logprobs(self, events: list[Event], offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for event in events:
            for pick in event.logprobs:
                token = self._token_text(pick.token)
                out.tokens.append(token)
                out.token_logprobs.append(_finite(pick.logprob) if pick.logprob is not None else None)
                out.top_logprobs.append({self._token_text(i): _finite(lp) for i, lp in pick.top} if pick.top else None)
                out.text_offset.append(offset)
                offset += len(token)
        return out

    # -- the Open Inference Protocol's generate extension

    async def generate(self, request: Request) -> Response:
        return await self._generate(request, stream=False)

    async def generate_stream(self, request: Request) -> Response:
        return await self._generate(request, stream=True)

    async def _generate(self, request: Request, *, stream: bool) -> Response:
        check_model(request)
        body = parse_body(GenerateRequest, await read_json_object(request))
        params = body.parameters
        sampling = Sampling(
            temperature=body.temperature if body.temperature is not None else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            stop=params.stop,
            ignore_eos=params.ignore_eos,
        )
        prompt = self.prompt_ids(body.text_input)
        limit = body.max_tokens or params.max_tokens
        streams = self.submit([self.request(prompt, sampling, limit, None, 0)])
        name = service_of(request).model_name
        if stream or body.stream or params.stream:

            def chunk(_: int, event: Event) -> list[Any]:
                if event.finish_reason is not None and event.finish_reason not in ("stop", "length"):
                    return [_stream_error(event)]
                answer = {"model_name": name, "model_version": self.version, "text_output": event.text}
                if event.finish_reason is not None:
                    answer["finish_reason"] = event.finish_reason
                return [answer] if event.text or event.finish_reason else []

            return _stream(merged(streams, chunk))
        events = (await collect(streams))[0]
        last = _check(events)
        answer = GenerateResponse(
            model_name=name,
            model_version=self.version,
            text_output="".join(e.text for e in events),
            finish_reason=last.finish_reason,
            usage=_usage(len(prompt), [events]),
        )
        return json_response(answer.model_dump(exclude_none=True))

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        raise InvalidRequestError(
            "a text-generation model answers /v2/models/{name}/generate and generate_stream, not infer"
        )

    # -- the routes

    def routes(self) -> list[RouteSpec]:
        routes = [
            RouteSpec(
                path="/v1/completions",
                method="POST",
                handler=self.complete,
                summary="Complete a prompt (OpenAI completions; stream: server-sent events)",
                operation_id="createCompletion",
                request_schema="CompletionRequest",
                request_example={"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0},
                response_schema="Completion",
                errors=ERRORS,
            ),
            RouteSpec(
                path="/v2/models/{name}/generate",
                method="POST",
                handler=self.generate,
                summary="Generate text (Open Inference Protocol generate extension)",
                operation_id="generate",
                request_schema="GenerateRequest",
                request_example={"text_input": "Once upon a time", "parameters": {"max_tokens": 32}},
                response_schema="GenerateResponse",
                errors=ERRORS,
            ),
            RouteSpec(
                path="/v2/models/{name}/generate_stream",
                method="POST",
                handler=self.generate_stream,
                summary="Generate text as server-sent events (Open Inference Protocol generate extension)",
                operation_id="generateStream",
                request_schema="GenerateRequest",
                request_example={"text_input": "Once upon a time", "parameters": {"max_tokens": 32}},
                errors=ERRORS,
            ),
        ]
        if self.template is not None:
            routes.insert(
                0,
                RouteSpec(
                    path="/v1/chat/completions",
                    method="POST",
                    handler=self.chat,
                    summary="Chat (OpenAI chat completions; stream: server-sent events)",
                    operation_id="createChatCompletion",
                    request_schema="ChatCompletionRequest",
                    request_example={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 32},
                    response_schema="ChatCompletion",
                    errors=ERRORS,
                ),
            )
        return routes

    def schemas(self) -> dict[str, Any]:
        return component_schemas(
            [ChatCompletionRequest, CompletionRequest, GenerateRequest], [ChatCompletion, Completion, GenerateResponse]
        )

    def describe(self) -> str:
        chat = "/v1/chat/completions, " if self.template is not None else ""
        return f"text generation: {chat}/v1/completions and the Open Inference Protocol generate extension"


def _finite(logprob: float | None) -> float:
    """A logprob JSON can carry: a token the model rules out (-inf) as -9999.0, as vLLM sends it."""
    return max(float(logprob if logprob is not None else 0.0), -9999.0)


def _id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def _check(events: list[Event]) -> Event:
    """A choice's last event, or the error its finish reason means."""
    last = events[-1]
    if last.finish_reason == "deadline":
        raise DeadlineExceededError("no token before the request deadline (--request-timeout-ms, X-Request-Timeout)")
    if last.finish_reason == "cancelled":
        raise ClientClosedError("the request was cancelled")
    if last.finish_reason == "error":
        raise InferenceError(last.error or "the model failed")
    return last


def _closing(head: dict[str, Any], usage: bool, prompt: int, counts: list[int]) -> list[bytes]:
    """A stream's last events: the usage chunk (no choices) when `stream_options.include_usage`
    asked for it, then `[DONE]`."""
    if not usage:
        return [DONE]
    total = sum(counts)
    tokens = Usage(prompt_tokens=prompt, completion_tokens=total, total_tokens=prompt + total)
    return [sse({**head, "choices": [], "usage": tokens.model_dump()}), DONE]


def _usage(prompt: int, finished: list[list[Event]]) -> Usage:
    completion = sum(events[-1].completion_tokens for events in finished)
    return Usage(
        prompt_tokens=prompt * len(finished),
        completion_tokens=completion,
        total_tokens=prompt * len(finished) + completion,
    )


def _stream_error(event: Event) -> dict[str, Any]:
    """The event a stream ends with when its sequence did not finish normally (vLLM's shape)."""
    error: ServeError
    try:
        _check([event])
        error = InferenceError("the sequence ended")
    except ServeError as exc:
        error = exc
    return error_body(error)


def _stream(body: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


TASK = ServingTask(name="text-generation", open=TextGenerationRuntime)
