"""Chat templates: a conversation in, the model's prompt text out, rendered as transformers renders it.

A chat checkpoint ships its prompt format as a Jinja template (chat_template.jinja, or a string in
tokenizer_config.json). `ChatTemplate.render` gives the same text as transformers 5.24's
`tokenizer.apply_chat_template(..., tokenize=False)` without importing transformers or torch (the
serving image has neither): the same sandboxed environment (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls), the same `tojson` filter (non-ASCII kept, nothing
HTML-escaped), the same globals (`raise_exception`, `strftime_now`, a `dict` and a `namespace` that
give no way into Python internals), the `{% generation %}` tag, and the same variables: `messages`,
`add_generation_prompt`, `tools`, `documents`, the tokenizer's named special tokens (`bos_token`,
`eos_token`, ...) and any extra ones a template reads (`enable_thinking`). The inputs are prepared
as transformers prepares them: message keys whose value is None dropped, everything rebuilt from
plain JSON types (a rich object becomes an inert "<TypeName>"), a message's reasoning copied to
both `reasoning_content` and `thinking`. Content given as a list of parts passes through
unchanged, for the template to handle.

The template is code from the checkpoint run on a request's messages, so whatever stops it (its
own `raise_exception`, an undefined key, the sandbox refusing an attribute) is a
`ChatTemplateError`, an input error with one line of text (a server answers 400).
`openai_messages` turns OpenAI chat-completions messages into what a text model's template
expects, as `transformers serve` does.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import numpy as np
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from ortpack.kernel.errors import InputError, one_line

# Names the template's own arguments take; `extra` may not set them.
RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents"})
# Where a message's reasoning may come in, the name templates read first (transformers' _REASONING_FIELDS).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Older jinja2 releases have known sandbox escapes (transformers refuses them too).
MIN_JINJA2 = (3, 1, 6)


class ChatTemplateError(InputError):
    """A chat template that cannot be read or compiled, or that cannot render these messages: its own
    `raise_exception` (a server answers 400 with the template's words), a missing key, the sandbox."""


class _TemplateRaised(jinja2.TemplateError):
    """What the template's `raise_exception(message)` raises: its message is the template's own."""


@dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """A checkpoint's chat template and the special tokens it may reference. Compiled on creation (a
    template that does not compile is refused then) and once per process for each distinct source."""

    source: str  # the Jinja text
    special_tokens: Mapping[str, str] = field(default_factory=dict)  # {"bos_token": "<s>", ...}, see special_tokens_of

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise ChatTemplateError(f"a chat template is Jinja text, not {type(self.source).__name__}")
        _compile(self.source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages` ({"role", "content", ...} each). `tools` are JSON schemas
        ({"type": "function", "function": {...}}), `documents` ({"title", "text"}) are for templates
        that do retrieval; None and an empty list differ (a template may test `tools is not none`), so
        pass None when there are none. `extra` sets further variables (`enable_thinking`,
        `date_string`) and overrides the special tokens. Unlike transformers, `add_generation_prompt`
        defaults to True: a server renders a prompt to generate from."""
        variables = {**self.special_tokens, **(extra or {})}
        if clash := sorted(RESERVED_VARIABLES & variables.keys()):
            raise ChatTemplateError(f"extra template variables may not set {', '.join(clash)}: they are arguments")
        chat = _prepare_messages(messages)
        if tools is not None:
            if any(not isinstance(tool, Mapping) for tool in tools):
                raise ChatTemplateError("each tool must be a JSON schema object")
            tools = _plain(list(tools))
        if documents is not None:
            if any(not isinstance(document, Mapping) for document in documents):
                raise ChatTemplateError("each document must be an object with 'title' and 'text'")
            documents = _plain(list(documents))
        template = _compile(self.source)
        try:
            return template.render(
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **_plain(variables),
            )
        except _TemplateRaised as exc:
            raise ChatTemplateError(one_line(exc.message or "the chat template refused these messages")) from None
        except Exception as exc:  # the template is code run on the request: whatever it raises, it cannot render it
            raise ChatTemplateError(f"the chat template cannot render these messages: {one_line(exc)}") from exc


def load_chat_template(checkpoint_dir: Path) -> str | None:
    """The checkpoint's default template: chat_template.jinja (what transformers 5 saves), else
    tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}: the one named
    "default"), else chat_template.json's "chat_template"; None when there is none."""
    jinja_file = checkpoint_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    for name in ("tokenizer_config.json", "chat_template.json"):
        template = _default_template(_read_json(checkpoint_dir / name).get("chat_template"))
        if template is not None:
            return template
    return None


def special_tokens_of(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The *_token strings a template may reference (bos_token, eos_token, unk_token, pad_token, ...) from a
    tokenizer_config.json dict; an AddedToken-style dict {"content": ...} gives its content; None values
    are skipped. As transformers' `special_tokens_map`: model-specific names (`image_token`) count, and
    so do the named ones of a dict-valued "extra_special_tokens"; flags such as `add_bos_token` do not."""
    named = {key: value for key, value in tokenizer_config.items() if key.endswith("_token")}
    extra = tokenizer_config.get("extra_special_tokens")
    if isinstance(extra, Mapping):
        named.update(extra)
    tokens = {}
    for key, value in named.items():
        text = value.get("content") if isinstance(value, Mapping) else value
        if isinstance(text, str):
            tokens[key] = text
    return tokens


def openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat-completions messages as a text model's template expects them, converted as
    `transformers serve` converts them for a text model (BaseHandler.get_processor_inputs_from_messages):
    the text parts of a list content joined with spaces (other parts dropped), a tool call's JSON
    `arguments` string parsed to an object (templates `tojson` it), the content of a message with tool
    calls dropped, and only role, content, tool_calls and tool_call_id kept."""
    converted = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatTemplateError("each message must be an object with a 'role'")
        tool_calls = message.get("tool_calls")
        # The content beside tool calls is empty or the calls' own markup, which would confuse the template.
        content = [] if tool_calls else (message.get("content") or [])
        parsed: dict[str, Any] = {
            "role": message["role"],
            "content": content if isinstance(content, str) else " ".join(_text_parts(content)),
        }
        if tool_calls:
            parsed["tool_calls"] = [_parse_tool_call(call) for call in tool_calls]
        if "tool_call_id" in message:
            parsed["tool_call_id"] = message["tool_call_id"]
        converted.append(parsed)
    return converted


def _parse_tool_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise ChatTemplateError("each tool call must be an object")
    call = copy.deepcopy(dict(call))
    function = call.get("function") or call
    if not isinstance(function, dict) or "arguments" not in function:
        raise ChatTemplateError("a tool call has no function arguments")
    if isinstance(function["arguments"], str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError as exc:
            raise ChatTemplateError(f"a tool call's arguments are not JSON: {one_line(exc)}") from None
    return call


def _text_parts(content: Any) -> list[str]:
    if not isinstance(content, Sequence):
        raise ChatTemplateError("a message's content must be a string or a list of parts")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise ChatTemplateError("each content part must be an object with a 'type'")
        if part["type"] in ("text", "input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise ChatTemplateError(f"a {part['type']!r} content part has no 'text' string")
            texts.append(part["text"])
    return texts


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers hands them to the template: plain data, keys whose value is None
    dropped (APIs send `content: null` beside tool calls, and templates print None as "None"), a
    message's reasoning under every name templates read it by."""
    if not messages:
        raise ChatTemplateError("a chat needs at least one message")
    chat = []
    for message in messages:
        plain = _plain(message)
        if not isinstance(plain, dict):
            raise ChatTemplateError(f"each message must be an object, not {type(message).__name__}")
        plain = {key: value for key, value in plain.items() if value is not None}
        reasoning = next((plain[key] for key in REASONING_FIELDS if plain.get(key) is not None), None)
        if reasoning is not None:  # gpt-oss templates read `thinking`, the others `reasoning_content`
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        chat.append(plain)
    return chat


def _plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types, as transformers' _plain_template_data: the sandbox does
    not know which methods of a rich object are dangerous, and templates only test media for presence."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums, numpy strings) carry methods of their own
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):  # np.bool_(False) would otherwise be a truthy placeholder
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {item.name: _plain(getattr(value, item.name)) for item in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _default_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, Mapping)}
        value = named.get("default")
    elif isinstance(value, Mapping):
        value = value.get("default")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ChatTemplateError(f"{path.name} is not JSON: {one_line(exc)}") from None
    return data if isinstance(data, dict) else {}


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """`source` compiled in an environment set up as transformers' _compile_jinja_template sets it up."""
    version = tuple(int(part) for part in re.findall(r"\d+", jinja2.__version__)[:3])
    if version < MIN_JINJA2:
        raise RuntimeError(
            f"chat templates need jinja2>=3.1.6 (older ones have sandbox escapes), not {jinja2.__version__}"
        )
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _TemplateDict()
    environment.globals["namespace"] = _TemplateNamespace
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"the chat template does not compile: {one_line(exc.message or exc)} (line {exc.lineno})"
        ) from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {one_line(exc)}") from None


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; prompts want the JSON as written, non-ASCII included.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """The templates' `dict(...)` and `dict.fromkeys(...)`: jinja2's default global is the `dict` type
    itself, whose class attributes are a way out of the sandbox."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """jinja2's `namespace`, refusing attribute names that start with "_" (a way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # The signature trick of jinja2's Namespace, so that `namespace(self=...)` still works.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a chat template may not set the namespace attribute {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's part with it to mask
    training losses; rendering gives its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension declares it a plain set

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()
