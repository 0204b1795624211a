"""The request and answer bodies of the generation routes, as pydantic models (the same models parse
requests and write the OpenAPI schemas): OpenAI chat completions and completions, and the Open
Inference Protocol's generate extension as Triton serves it.

Accepted beyond OpenAI's fields, as vLLM accepts them: `top_k`, `ignore_eos`, `stop_token_ids`,
`chat_template_kwargs` (such as `enable_thinking`) and `add_generation_prompt`. Refused with 400
rather than ignored, because an answer would silently differ from what was asked: `n` above
MAX_CHOICES, non-zero `presence_penalty`/`frequency_penalty`, `logit_bias`, `best_of` above 1,
`suffix`, `echo`, a `response_format` other than text, and `tool_choice` that forces a call (the
tools themselves go to the chat template, which may describe them to the model; no tool calls are
parsed out of the answer).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ortpack.serving.bodies import worded
from ortpack.serving.errors import InvalidRequestError

MAX_CHOICES = 16  # n x prompts a request may ask for
MAX_STOP = 8  # stop strings (OpenAI allows 4)

Temperature = Annotated[float, Field(ge=0.0, le=2.0), worded("must be a number from 0 to 2")]
TopP = Annotated[float, Field(gt=0.0, le=1.0), worded("must be a number above 0 and at most 1")]
TopK = Annotated[int, Field(ge=0), worded("must be a non-negative integer (0: off)")]
MaxTokens = Annotated[int, Field(ge=1), worded("must be a positive integer")]
Stop = Annotated[str | list[str] | None, worded(f"must be a string or a list of at most {MAX_STOP} strings")]


class Sampling(BaseModel):
    """What the OpenAI routes share: length, sampling, stopping, and the unsupported knobs."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES), worded(f"must be an integer from 1 to {MAX_CHOICES}")] = 1
    stream: bool = False
    stop: Stop = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _supported(self) -> Sampling:
        if self.presence_penalty or self.frequency_penalty:
            raise InvalidRequestError("presence_penalty and frequency_penalty are not supported (send 0)")
        if self.logit_bias:
            raise InvalidRequestError("logit_bias is not supported")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise InvalidRequestError(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them")
        return self

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class StreamOptions(BaseModel):
    include_usage: bool = False


class ResponseFormat(BaseModel):
    type: str = "text"


class ChatMessage(BaseModel):
    """One message of the conversation; `content` a string, a list of parts or null (an assistant
    turn with tool calls); other fields reach the template as they are."""

    model_config = ConfigDict(strict=True, extra="allow")

    role: Annotated[str, Field(min_length=1), worded("must be a non-empty string")]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(Sampling):
    """OpenAI's `POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1), worded("must be a non-empty list of messages")]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20), worded("must be an integer from 0 to 20")] | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        if self.response_format is not None and self.response_format.type != "text":
            raise InvalidRequestError(f"response_format {self.response_format.type!r} is not supported (only 'text')")
        if self.tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice may be 'none' or 'auto': this server does not parse tool calls")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true")
        return self

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(Sampling):
    """OpenAI's `POST /v1/completions`: one prompt (a string or token ids) or a list of them."""

    prompt: Annotated[
        str | list[str] | list[int] | list[list[int]],
        worded("must be a string, a list of strings, or token ids (a list of integers, or a list of such lists)"),
    ]
    logprobs: Annotated[int, Field(ge=0, le=20), worded("must be an integer from 0 to 20")] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if self.echo:
            raise InvalidRequestError("echo is not supported")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported")
        if self.best_of not in (None, 1):
            raise InvalidRequestError("best_of above 1 is not supported")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        if not p:
            raise InvalidRequestError("prompt must not be empty")
        return list(p)  # type: ignore[arg-type]


# ---------------------------------------------------------------- answers


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class GenerateParameters(BaseModel):
    """The generate extension's `parameters` (Triton's vLLM and TensorRT-LLM backends' names)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: int | None = None
    stop: Stop = None
    ignore_eos: bool = False
    stream: bool = False


class GenerateRequest(BaseModel):
    """`POST /v2/models/{name}/generate` (and `generate_stream`): a text and its parameters."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text_input: Annotated[str, Field(min_length=1), worded("must be a non-empty string")]
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    # Triton also takes the parameters at the top level
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    stream: bool | None = None


class GenerateResponse(BaseModel):
    model_name: str
    model_version: str
    text_output: str
    finish_reason: str | None = None
    usage: Usage | None = None
