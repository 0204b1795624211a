"""Chat templates rendered as transformers 5.24 renders them (ortpack.kernel.generation.chat).

Each real template below (written out as its checkpoint ships it) renders the same conversation
twice: with `tokenizer.apply_chat_template` and with `ChatTemplate.render`; the texts must be equal,
and so must transformers' token ids and those of the serving side's `tokenizers.Tokenizer` for the
text. The tokenizer is the tiny byte-level BPE of tests/causal_lms.py (built offline in about a
second), with <s> and <unk> added so that templates have a bos_token to write.
"""

# The templates are written out line for line as their checkpoints ship them, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest
from jinja2.exceptions import SecurityError

from ortpack.kernel.errors import InputError
from ortpack.kernel.generation import chat
from ortpack.kernel.generation.chat import (
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
    openai_messages,
    special_tokens_of,
)
from tests.causal_lms import CHATML, make_bpe_tokenizer

# Qwen/Qwen2.5-7B-Instruct: a default system turn, tools as JSON lines (tojson), tool calls and responses.
QWEN2_5 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# meta-llama/Llama-3.2-1B-Instruct: bos_token, today's date (strftime_now), tools with tojson(indent=4) in
# the first user turn, raise_exception on more than one tool call.
LLAMA_3_2 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# google/gemma-7b-it: no system role, strictly alternating turns (raise_exception), `trim`.
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)

# mistralai/Mixtral-8x7B-Instruct-v0.1: [INST] turns, eos_token after each answer, alternation enforced.
MIXTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# microsoft/Phi-3.5-mini-instruct: an empty system turn skipped, eos_token when no answer is prompted.
PHI_3_5 = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# Qwen/Qwen3 (hybrid thinking): enable_thinking, reasoning_content, a namespace, string methods, messages[::-1].
QWEN3 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


# Qwen/Qwen2-VL-7B-Instruct: content as a list of parts, literal newlines around block tags (trim_blocks).
QWEN2_VL = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)

# Not a model's: every variable a template is given, as JSON, to compare what each side passes in.
VARIABLES = (
    "{{ messages | tojson }}\n{{ tools | tojson }}\n{{ documents | tojson }}\n{{ add_generation_prompt }}\n"
    "{{ bos_token }} {{ eos_token }} {{ unk_token }} {{ pad_token }}\n{{ enable_thinking | default('-') }}\n"
    "{% generation %}{{ 'inside a generation tag' }}{% endgeneration %}\n"
    "{{ dict(a=1) | tojson }} {{ dict.fromkeys(['x'], 0) | tojson }}"
)


@dataclass(frozen=True, kw_only=True)
class Reference:
    """transformers' tokenizer beside the serving side's, to render and tokenize the same chat on both."""

    tokenizer: Any  # transformers' PreTrainedTokenizerFast
    encoder: Any  # tokenizers.Tokenizer read from the same tokenizer.json, as a server reads it
    special_tokens: dict[str, str]

    def expect(self, template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """transformers' text for `messages`; its token ids asserted equal to the serving tokenizer's."""
        self.tokenizer.chat_template = template
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        assert self.tokenizer(text, add_special_tokens=False)["input_ids"] == ids
        assert self.encoder.encode(text, add_special_tokens=False).ids == ids
        return text

    def render(
        self,
        template: str,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Our text for `messages`, asserted equal to transformers' (and so their token ids)."""
        rendered = ChatTemplate(source=template, special_tokens=self.special_tokens).render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, documents=documents, extra=extra
        )
        expected = self.expect(
            template, messages, add_generation_prompt=add_generation_prompt, tools=tools, documents=documents, **extra
        )
        assert rendered == expected
        return rendered

    def refusal(self, template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """Our ChatTemplateError's message; transformers must fail on the same chat with the same words."""
        with pytest.raises(ChatTemplateError) as ours:
            ChatTemplate(source=template, special_tokens=self.special_tokens).render(messages, **kwargs)
        self.tokenizer.chat_template = template
        with pytest.raises(jinja2.TemplateError) as theirs:
            self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        assert str(ours.value) == " ".join(str(theirs.value).split())
        return str(ours.value)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The tiny tokenizer saved as transformers saves it, with a bos_token and an unk_token added."""
    out = tmp_path_factory.mktemp("chat") / "tokenizer"
    tokenizer = make_bpe_tokenizer(out)
    tokenizer.add_special_tokens({"bos_token": "<s>", "unk_token": "<unk>"})
    tokenizer.save_pretrained(out)
    return out, tokenizer


@pytest.fixture(scope="module")
def reference(checkpoint: tuple[Path, Any]) -> Reference:
    from tokenizers import Tokenizer

    out, tokenizer = checkpoint
    config = json.loads((out / "tokenizer_config.json").read_text())
    encoder = Tokenizer.from_file(str(out / "tokenizer.json"))
    return Reference(tokenizer=tokenizer, encoder=encoder, special_tokens=special_tokens_of(config))


CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "  Paris.  "},
    {"role": "user", "content": "And of Japan? Answer in Japanese: 日本の首都は？"},
]
SYSTEM = {"role": "system", "content": "You are terse. Ünïcödé is welcome."}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Température actuelle à une ville — 東京 included",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "Name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
TOOL_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Zürich and Tōkyō?"},
    {
        "role": "assistant",
        "content": None,  # as OpenAI clients send it; transformers drops None values
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}},
        ],
    },
    {"role": "tool", "content": '{"celsius": 21}'},
    {"role": "tool", "content": '{"celsius": 18}'},
]


@pytest.mark.parametrize("template", [CHATML, QWEN2_5, PHI_3_5, QWEN3], ids=["chatml", "qwen2.5", "phi-3.5", "qwen3"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("system", [True, False], ids=["system", "no-system"])
def test_multi_turn_chats_render_as_transformers_renders_them(
    reference: Reference, template: str, add_generation_prompt: bool, system: bool
) -> None:
    messages = [SYSTEM, *CONVERSATION] if system else CONVERSATION
    rendered = reference.render(template, messages, add_generation_prompt=add_generation_prompt)
    assert "日本の首都は？" in rendered
    assert ("You are terse." in rendered) is system


def test_the_templates_control_tokens_become_single_special_ids(reference: Reference) -> None:
    rendered = reference.render(QWEN2_5, CONVERSATION, add_generation_prompt=True)
    ids = reference.encoder.encode(rendered, add_special_tokens=False).ids
    im_start = reference.encoder.token_to_id("<|im_start|>")
    assert ids.count(im_start) == rendered.count("<|im_start|>") == 5  # the default system turn, 3 turns, the prompt


# Qwen3's template reads an answer's content even beside tool calls ('</think>' in message.content).
@pytest.mark.parametrize(("template", "content"), [(QWEN2_5, None), (QWEN3, "")], ids=["qwen2.5", "qwen3"])
def test_tools_and_tool_calls_are_written_as_json_with_non_ascii_kept(
    reference: Reference, template: str, content: str | None
) -> None:
    messages = [SYSTEM, TOOL_TURNS[0], {**TOOL_TURNS[1], "content": content}, *TOOL_TURNS[2:]]
    rendered = reference.render(template, messages, add_generation_prompt=True, tools=[WEATHER_TOOL])
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in rendered  # tojson: compact, nothing escaped
    assert '{"city": "東京"}' in rendered
    assert "\\u" not in rendered and "None" not in rendered


def test_without_tools_a_tool_template_takes_its_plain_branch(reference: Reference) -> None:
    rendered = reference.render(QWEN2_5, CONVERSATION, add_generation_prompt=True, tools=None)
    assert "<tools>" not in rendered


class FrozenClock(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> FrozenClock:
        return cls(2025, 2, 3, 12, 0)


def test_llama_3_2_writes_todays_date_bos_and_tools(reference: Reference, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.utils import chat_template_utils

    monkeypatch.setattr(chat_template_utils, "datetime", FrozenClock)
    monkeypatch.setattr(chat, "datetime", FrozenClock)
    plain = reference.render(LLAMA_3_2, [SYSTEM, *CONVERSATION], add_generation_prompt=True)
    assert plain.startswith("<s><|start_header_id|>system<|end_header_id|>\n\n")
    assert "Today Date: 03 Feb 2025\n" in plain
    assert "<|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|>" in plain  # `trim`
    with_tools = reference.render(LLAMA_3_2, CONVERSATION, add_generation_prompt=False, tools=[WEATHER_TOOL])
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False, indent=4) in with_tools
    dated = reference.render(LLAMA_3_2, CONVERSATION, add_generation_prompt=True, date_string="26 Jul 2024")
    assert "Today Date: 26 Jul 2024\n" in dated


def test_llama_3_2_tool_call_and_its_refusal_of_two(reference: Reference) -> None:
    one_call = [TOOL_TURNS[0], {**TOOL_TURNS[1], "tool_calls": TOOL_TURNS[1]["tool_calls"][:1]}, TOOL_TURNS[2]]
    rendered = reference.render(LLAMA_3_2, one_call, add_generation_prompt=True, tools=[WEATHER_TOOL])
    assert '{"name": "get_weather", "parameters": {"city": "Zürich"}}<|eot_id|>' in rendered
    message = reference.refusal(LLAMA_3_2, TOOL_TURNS, add_generation_prompt=True, tools=[WEATHER_TOOL])
    assert message == "This model only supports single tool-calls at once!"


def test_gemma_renders_alternating_turns_with_bos(reference: Reference) -> None:
    rendered = reference.render(GEMMA, CONVERSATION, add_generation_prompt=True)
    assert rendered.startswith("<s><start_of_turn>user\n")
    assert rendered.endswith("<start_of_turn>model\n")
    assert "<start_of_turn>model\nParis.<end_of_turn>" in rendered


@pytest.mark.parametrize(
    ("template", "messages", "message"),
    [
        (GEMMA, [SYSTEM, *CONVERSATION], "System role not supported"),
        (
            GEMMA,
            [CONVERSATION[0], CONVERSATION[0]],
            "Conversation roles must alternate user/assistant/user/assistant/...",
        ),
        (
            MIXTRAL,
            CONVERSATION[:2] + CONVERSATION[1:],
            "Conversation roles must alternate user/assistant/user/assistant/...",
        ),
        (
            MIXTRAL,
            [*CONVERSATION[:2], {"role": "tool", "content": "{}"}],
            "Conversation roles must alternate user/assistant/user/assistant/...",
        ),
        (MIXTRAL, [*CONVERSATION, {"role": "system", "content": "x"}], "Only user and assistant roles are supported!"),
    ],
    ids=[
        "gemma-system",
        "gemma-twice-user",
        "mixtral-twice-assistant",
        "mixtral-tool-out-of-turn",
        "mixtral-system-role",
    ],
)
def test_a_templates_raise_exception_is_a_chat_template_error_in_its_words(
    reference: Reference, template: str, messages: list[dict[str, Any]], message: str
) -> None:
    assert reference.refusal(template, messages, add_generation_prompt=True) == message


def test_mistral_inst_turns_end_answers_with_eos(reference: Reference) -> None:
    rendered = reference.render(MIXTRAL, CONVERSATION, add_generation_prompt=True)
    assert rendered == (
        "<s>[INST] What is the capital of France? [/INST]  Paris.  <|im_end|>"
        "[INST] And of Japan? Answer in Japanese: 日本の首都は？ [/INST]"
    )


def test_phi_3_5_ends_with_eos_without_a_generation_prompt(reference: Reference) -> None:
    rendered = reference.render(
        PHI_3_5, [{"role": "system", "content": ""}, *CONVERSATION], add_generation_prompt=False
    )
    assert rendered.startswith("<|user|>\n") and rendered.endswith("<|end|>\n<|im_end|>")


@pytest.mark.parametrize("enable_thinking", [True, False, None], ids=["thinking", "not-thinking", "unset"])
def test_qwen3_enable_thinking_as_an_extra_variable(reference: Reference, enable_thinking: bool | None) -> None:
    extra: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    rendered = reference.render(QWEN3, CONVERSATION, add_generation_prompt=True, **extra)
    assert rendered.endswith("<think>\n\n</think>\n\n") is (enable_thinking is False)


def test_qwen3_keeps_the_last_answers_reasoning_under_any_of_its_names(reference: Reference) -> None:
    messages = [
        CONVERSATION[0],
        {"role": "assistant", "content": "Paris.", "reasoning": "France's capital is Paris."},  # aliased
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "<think>\nYes, it is.\n</think>\n\nYes."},
    ]
    rendered = reference.render(QWEN3, messages, add_generation_prompt=False)
    assert rendered.endswith("<|im_start|>assistant\n<think>\nYes, it is.\n</think>\n\nYes.<|im_end|>\n")
    assert "France's capital" not in rendered  # reasoning before the last user turn is dropped by the template


CONTENT_PARTS: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "Be brief."},
        ],
    }
]


def test_content_parts_pass_through_to_a_template_that_reads_them(reference: Reference) -> None:
    rendered = reference.render(QWEN2_VL, [*CONTENT_PARTS, CONVERSATION[1]], add_generation_prompt=True)
    assert "<|im_start|>user\nWhat is in this picture?<|vision_start|><|image_pad|><|vision_end|>Be brief." in rendered
    with_ids = reference.render(QWEN2_VL, CONTENT_PARTS, add_generation_prompt=True, add_vision_id=True)
    assert "Picture 1: <|vision_start|>" in with_ids


def test_content_parts_reach_a_string_template_unchanged_as_in_transformers(reference: Reference) -> None:
    rendered = reference.render(LLAMA_3_2, CONTENT_PARTS, add_generation_prompt=True, date_string="26 Jul 2024")
    assert "[{'type': 'text', 'text': 'What is in this picture?'}" in rendered  # the template prints the list
    with pytest.raises(ChatTemplateError, match=r"^the chat template cannot render these messages: can only"):
        ChatTemplate(source=CHATML).render(CONTENT_PARTS)  # '...' + message['content']: str + list


def test_the_variables_handed_to_a_template_match_transformers(reference: Reference) -> None:
    class Colour(StrEnum):
        RED = "red"

    @dataclass
    class Attachment:
        name: str
        size: int

    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi", "name": None, "colour": Colour.RED, "score": np.float32(0.5)},
        {"role": "assistant", "content": "Hello", "thinking": "greet back", "flags": (np.bool_(False), 2)},
        {"role": "user", "content": "Look", "attachment": Attachment("a.txt", 3), "blob": object()},
    ]
    documents = [{"title": "Köln", "text": "Dom"}]
    rendered = reference.render(
        VARIABLES,
        messages,
        add_generation_prompt=False,
        tools=[WEATHER_TOOL],
        documents=documents,
        enable_thinking=False,
    )
    sent = json.loads(rendered.splitlines()[0])
    assert "name" not in sent[0] and sent[0]["colour"] == "red" and sent[0]["score"] == 0.5
    assert sent[1]["reasoning_content"] == sent[1]["thinking"] == "greet back"
    assert sent[1]["flags"] == [False, 2] and sent[2]["blob"] == "<object>"
    assert rendered.splitlines()[3:6] == ["False", "<s> <|im_end|> <unk> <|endoftext|>", "False"]


def test_extra_variables_override_special_tokens_but_not_arguments(reference: Reference) -> None:
    rendered = reference.render(GEMMA, CONVERSATION, add_generation_prompt=True, bos_token="<bos>")
    assert rendered.startswith("<bos><start_of_turn>")
    with pytest.raises(ChatTemplateError, match="may not set messages, tools"):
        ChatTemplate(source=GEMMA).render(CONVERSATION, extra={"tools": [], "messages": []})


@pytest.mark.parametrize(
    "source",
    [
        "{% for message in messages %}{{ message.content }",
        "{% if messages %}{{ messages }}",
        "{{ messages | no_such_filter }}",
        "{% endgeneration %}",
    ],
)
def test_a_template_that_does_not_compile_is_refused_in_one_line(source: str) -> None:
    with pytest.raises(ChatTemplateError, match=r"^the chat template does not compile: ") as refused:
        ChatTemplate(source=source)
    assert "\n" not in str(refused.value) and isinstance(refused.value, ValueError)


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update(role='system') }}",
        "{{ raise_exception.__globals__['os'] }}",
        "{{ strftime_now.__globals__.datetime }}",
        "{{ dict.__class__.__init__.__globals__ }}",
        "{% set ns = namespace(_private=1) %}{{ ns }}",
        "{% set ns = namespace() %}{% set ns.__class__ = 1 %}{{ ns }}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_the_sandbox_refuses_python_internals_and_mutation(reference: Reference, source: str) -> None:
    with pytest.raises(ChatTemplateError, match="^the chat template cannot render these messages: "):
        ChatTemplate(source=source).render(CONVERSATION)
    reference.tokenizer.chat_template = source
    with pytest.raises(SecurityError):  # transformers refuses it too
        reference.tokenizer.apply_chat_template(CONVERSATION, tokenize=False)


def test_an_unsafe_attribute_alone_is_undefined_and_prints_nothing(reference: Reference) -> None:
    assert (
        reference.render(
            "{{ raise_exception.__globals__ }}{{ messages.__class__ }}", CONVERSATION, add_generation_prompt=True
        )
        == ""
    )


def test_an_undefined_key_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="has no attribute 'missing'") as refused:
        ChatTemplate(source="{{ messages[0].missing.deeper }}").render(CONVERSATION)
    assert isinstance(refused.value, InputError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"messages": []}, "a chat needs at least one message"),
        ({"messages": ["hello"]}, "each message must be an object, not str"),
        ({"messages": CONVERSATION, "tools": ["get_weather"]}, "each tool must be a JSON schema object"),
        ({"messages": CONVERSATION, "documents": ["text"]}, "each document must be an object"),
    ],
)
def test_malformed_inputs_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate(source=CHATML).render(**kwargs)


def test_a_template_is_compiled_once_per_source() -> None:
    source = CHATML + "{# compiled once #}"
    ChatTemplate(source=source).render(CONVERSATION)
    before = chat._compile.cache_info()
    ChatTemplate(source=source).render(CONVERSATION)
    after = chat._compile.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 2)  # on creation and on rendering


OPENAI_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather in"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "Zürich?"},
        ],
        "name": "alice",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    {"role": "assistant", "content": "21 °C."},
    {"role": "user", "content": "Thanks!"},
]


def test_openai_messages_are_converted_as_transformers_serve_converts_them(reference: Reference) -> None:
    from transformers.cli.serving.utils import BaseHandler, Modality

    converted = openai_messages(OPENAI_MESSAGES)
    assert converted == BaseHandler.get_processor_inputs_from_messages(OPENAI_MESSAGES, Modality.LLM)
    assert converted[1]["content"] == "Weather in Zürich?"
    assert converted[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Zürich"}
    assert OPENAI_MESSAGES[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Zürich"}'  # a copy
    rendered = reference.render(QWEN2_5, converted, add_generation_prompt=True, tools=[WEATHER_TOOL])
    assert '"arguments": {"city": "Zürich"}}\n</tool_call>' in rendered


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"content": "no role"}, "each message must be an object with a 'role'"),
        ({"role": "user", "content": [{"text": "no type"}]}, "each content part must be an object with a 'type'"),
        ({"role": "user", "content": [{"type": "text"}]}, "a 'text' content part has no 'text' string"),
        ({"role": "user", "content": {"type": "text", "text": "x"}}, "must be a string or a list of parts"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, "a tool call has no function arguments"),
        ({"role": "assistant", "tool_calls": [{"function": {"arguments": "{'x'"}}]}, "arguments are not JSON"),
    ],
)
def test_malformed_openai_messages_are_refused(message: dict[str, Any], error: str) -> None:
    with pytest.raises(ChatTemplateError, match=error):
        openai_messages([message])


def test_load_chat_template_from_what_transformers_saves(checkpoint: tuple[Path, Any]) -> None:
    out, _ = checkpoint
    assert (out / "chat_template.jinja").is_file()
    assert load_chat_template(out) == CHATML


def test_load_chat_template_layouts_in_order(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "from chat_template.json"}))
    assert load_chat_template(tmp_path) == "from chat_template.json"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": None}))
    assert load_chat_template(tmp_path) == "from chat_template.json"
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "from the list"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert load_chat_template(tmp_path) == "from the list"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "from tokenizer_config.json"}))
    assert load_chat_template(tmp_path) == "from tokenizer_config.json"
    (tmp_path / "chat_template.jinja").write_text("from chat_template.jinja ✓\n", encoding="utf-8")
    assert load_chat_template(tmp_path) == "from chat_template.jinja ✓\n"


def test_load_chat_template_refuses_a_broken_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": ')
    with pytest.raises(ChatTemplateError, match=r"^tokenizer_config.json is not JSON: "):
        load_chat_template(tmp_path)


def test_special_tokens_of_a_saved_tokenizer_are_its_special_tokens_map(checkpoint: tuple[Path, Any]) -> None:
    out, tokenizer = checkpoint
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert special_tokens_of(config) == tokenizer.special_tokens_map
    assert special_tokens_of(config) == {
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "pad_token": "<|endoftext|>",
    }


def test_special_tokens_of_added_token_dicts_and_model_specific_names(
    checkpoint: tuple[Path, Any], tmp_path: Path
) -> None:
    from transformers import PreTrainedTokenizerFast

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "special": True},
        "eos_token": "<|im_end|>",
        "pad_token": None,
        "image_token": "<|endoftext|>",
        "extra_special_tokens": {"audio_token": "<|im_start|>"},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_bytes((checkpoint[0] / "tokenizer.json").read_bytes())
    expected = PreTrainedTokenizerFast.from_pretrained(tmp_path).special_tokens_map
    assert special_tokens_of(config) == expected
    assert special_tokens_of(config) == {
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "image_token": "<|endoftext|>",
        "audio_token": "<|im_start|>",
    }


def test_chat_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys; import ortpack.kernel.generation.chat; "
        "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
