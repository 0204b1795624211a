"""OpenAI's audio transcription form and answers (serving/transcriptions.py).

The forms are real clients' encodings: httpx's (what the openai client sends through), requests'
and urllib3's, and the openai client itself, whose requests go to a mock transport that parses
them and answers with `render`, so the client also reads every answer format back. Hand-written
bodies cover what those clients never send: a quoted boundary with spaces, RFC 2231 `filename*=`,
a preamble, an epilogue and padding after a boundary, and malformed bodies.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ortpack.kernel.generation.whisper import Segment, Transcript
from ortpack.serving.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    ServeError,
    UnsupportedMediaTypeError,
    error_body,
    status_of,
)
from ortpack.serving.transcriptions import LANGUAGES, TranscriptionForm, compression_ratio, parse_form, render

URL = "http://x/v1/audio/transcriptions"
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "  # the file's bytes: only their round trip matters here
LIMIT = 1 << 20
Files = list[tuple[str, tuple[str | None, bytes, str]]]
Data = dict[str, str | list[str]]


def httpx_form(data: Data, files: Files) -> tuple[bytes, str]:
    request = httpx.Request("POST", URL, data=data, files=files)
    return request.read(), request.headers["content-type"]


def requests_form(data: Data, files: Files) -> tuple[bytes, str]:
    requests = pytest.importorskip("requests")
    prepared = requests.Request("POST", URL, data=data, files=files).prepare()
    return prepared.body, prepared.headers["Content-Type"]


def urllib3_form(data: Data, files: Files) -> tuple[bytes, str]:
    urllib3 = pytest.importorskip("urllib3")
    items = [
        (name, value) for name, values in data.items() for value in ([values] if isinstance(values, str) else values)
    ]
    return urllib3.encode_multipart_formdata([*items, *files])


ENCODERS: dict[str, Callable[[Data, Files], tuple[bytes, str]]] = {
    "httpx": httpx_form,
    "requests": requests_form,
    "urllib3": urllib3_form,
}


def parse(data: Data | None = None, file: bytes | None = WAV, **options: Any) -> TranscriptionForm:
    """`file` None: the audio sent under another name (httpx sends a form without files urlencoded)."""
    files: Files = (
        [("audio", ("a.wav", WAV, "audio/wav"))] if file is None else [("file", ("a.wav", file, "audio/wav"))]
    )
    body, content_type = httpx_form(data or {}, files)
    return parse_form(body, content_type, max_file_bytes=options.pop("max_file_bytes", LIMIT), **options)


def refused(error: type[ServeError], data: Data | None = None, file: bytes | None = WAV, **options: Any) -> str:
    with pytest.raises(error) as raised:
        parse(data, file, **options)
    return raised.value.message


def hand_made(parts: list[bytes], boundary: bytes = b"b0und", *, preamble: bytes = b"", epilogue: bytes = b"") -> bytes:
    """A body as RFC 2046 writes it: `parts` are each one part's header lines, blank line and content."""
    dash = b"--" + boundary
    start = preamble + b"\r\n" if preamble else b""
    return start + dash + b"\r\n" + (b"\r\n" + dash + b"\r\n").join(parts) + b"\r\n" + dash + b"--\r\n" + epilogue


def field_part(name: str, value: bytes, extra: str = "") -> bytes:
    return f'Content-Disposition: form-data; name="{name}"{extra}\r\n\r\n'.encode() + value


# ---- the form -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_every_field(encoder: str) -> None:
    data: Data = {
        "model": "whisper-1",
        "language": "DE",
        "prompt": "Grüße, ein Prompt.",
        "response_format": "verbose_json",
        "temperature": "0.25",
        "timestamp_granularities[]": ["segment", "segment"],
    }
    body, content_type = ENCODERS[encoder](data, [("file", ("rede.wav", WAV, "audio/wav"))])
    form = parse_form(body, content_type, max_file_bytes=LIMIT)
    assert form == TranscriptionForm(
        file=WAV,
        filename="rede.wav",
        model="whisper-1",
        language="de",
        prompt="Grüße, ein Prompt.",
        response_format="verbose_json",
        temperature=0.25,
        timestamp_granularities=("segment", "segment"),
    )
    assert "file=" not in repr(form)  # a 25 MB file kept out of logs


def test_defaults_and_empty_fields_as_absent() -> None:
    empty = {name: "" for name in ("model", "language", "prompt", "response_format", "temperature", "stream")}
    for data in ({}, empty):
        form = parse(data)
        assert (form.model, form.language, form.prompt) == (None, None, None)
        assert (form.response_format, form.temperature, form.timestamp_granularities) == ("json", 0.0, ())


@pytest.mark.parametrize(
    "file",
    [
        bytes(range(256)),
        bytes(range(256))[::-1] * 3,
        b"\r\n--b0und\r\n--\r\n\r\n--",  # delimiters of other bodies, blank lines, dashes
        b"\r\n",
        b"\r",
        b"\n\n",
        b"--",
        b"x\r\n",
        b'\r\nContent-Disposition: form-data; name="model"\r\n\r\nevil',
    ],
    ids=["all-256", "all-256-reversed", "delimiters", "crlf", "cr", "lflf", "dashes", "ends-crlf", "fake-part"],
)
@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_file_bytes_round_trip_exactly(encoder: str, file: bytes) -> None:
    body, content_type = ENCODERS[encoder]({"model": "m"}, [("file", ("a.wav", file, "audio/wav"))])
    form = parse_form(body, content_type, max_file_bytes=LIMIT)
    assert (form.file, form.model) == (file, "m")


def test_the_boundary_inside_the_file_bytes_but_not_after_a_crlf() -> None:
    request = httpx.Request("POST", URL, files={"file": ("a.wav", b"x", "audio/wav")})
    boundary = request.headers["content-type"].split("boundary=")[1].encode()
    tricky = b"--" + boundary + b"\n--" + boundary + b"\r--" + boundary + b"--"
    body, content_type = httpx_form({}, [("file", ("a.wav", tricky, "audio/wav"))])
    assert boundary in body  # httpx picks a fresh boundary, so the file's never matches it
    assert parse_form(body, content_type, max_file_bytes=LIMIT).file == tricky
    # a hand-made body whose boundary is the file's: only CRLF--boundary delimits (RFC 2046)
    own = b"x--b0und\n--b0und\r--b0und--x"  # not after CRLF: content may not start with it
    body = hand_made([field_part("file", own, '; filename="a.wav"')])
    assert parse_form(body, "multipart/form-data; boundary=b0und", max_file_bytes=LIMIT).file == own


def test_body_as_bytearray_and_memoryview() -> None:
    body, content_type = httpx_form({"model": "m"}, [("file", ("a.wav", WAV, "audio/wav"))])
    for view in (bytearray(body), memoryview(body), memoryview(b"padding" + body)[7:]):
        assert parse_form(view, content_type, max_file_bytes=LIMIT).file == WAV


def test_file_without_filename_and_filename_forms() -> None:
    body, content_type = httpx_form({}, [("file", (None, WAV, "audio/wav"))])
    assert b"filename" not in body
    assert parse_form(body, content_type, max_file_bytes=LIMIT).filename == ""
    body, content_type = httpx_form({}, [("file", ("Grüße aus Köln.wav", WAV, "audio/wav"))])  # raw UTF-8
    assert parse_form(body, content_type, max_file_bytes=LIMIT).filename == "Grüße aus Köln.wav"
    for disposition, name in [
        ("; filename*=utf-8''Gr%C3%BC%C3%9Fe%20a.wav", "Grüße a.wav"),  # RFC 2231 / 5987
        ('; filename="a \\"b\\".wav"', 'a "b".wav'),  # quoted-pair escapes
        ("; filename=plain.wav", "plain.wav"),
    ]:
        body = hand_made([field_part("file", WAV, disposition)])
        assert parse_form(body, "multipart/form-data; boundary=b0und", max_file_bytes=LIMIT).filename == name


def test_quoted_boundary_preamble_padding_and_epilogue() -> None:
    boundary = b"a b:c'()+_,-./=?"
    parts = [field_part("model", b"m"), field_part("file", WAV, '; filename="a.wav"')]
    body = hand_made(parts, boundary, preamble=b"This is a preamble.\r\n--not it", epilogue=b"the epilogue\r\n")
    body = body.replace(b"--" + boundary + b"\r\n", b"--" + boundary + b" \t\r\n", 1)  # transport padding
    content_type = 'Multipart/Form-Data; charset=utf-8; boundary="a b:c\'()+_,-./=?"'
    form = parse_form(body, content_type, max_file_bytes=LIMIT)
    assert (form.file, form.model) == (WAV, "m")


def test_curl_style_body_and_part_without_headers() -> None:
    boundary = b"------------------------d74496d66958873e"
    body = hand_made(
        [b"\r\nheaderless", field_part("file", WAV, '; filename="a.wav"\r\nContent-Type: audio/wav')], boundary
    )
    with pytest.raises(InvalidRequestError, match="Content-Disposition"):
        parse_form(body, f"multipart/form-data; boundary={boundary.decode()}", max_file_bytes=LIMIT)
    body = hand_made([field_part("file", WAV, '; filename="a.wav"\r\nContent-Type: audio/wav')], boundary)
    assert parse_form(body, f"multipart/form-data; boundary={boundary.decode()}", max_file_bytes=LIMIT).file == WAV


def test_unknown_fields_are_ignored_even_repeated() -> None:
    data: Data = {"include[]": ["logprobs", "x"], "chunking_strategy": "auto", "stream": "false", "_charset_": "utf-8"}
    form = parse(data)
    assert form == parse()


def test_timestamp_granularities_without_brackets() -> None:
    form = parse({"response_format": "verbose_json", "timestamp_granularities": "segment"})
    assert form.timestamp_granularities == ("segment",)


def test_translation_form() -> None:
    form = parse({"model": "whisper-1", "prompt": "p", "response_format": "text"}, translation=True)
    assert (form.model, form.prompt, form.response_format, form.language) == ("whisper-1", "p", "text", None)
    assert parse({"language": ""}, translation=True).language is None  # empty is absent


def test_size_limit() -> None:
    assert parse(file=b"x" * 100, max_file_bytes=100).file == b"x" * 100
    message = refused(PayloadTooLargeError, file=b"x" * 101, max_file_bytes=100)
    assert message == "file is 101 bytes; the limit is 100"


# ---- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "application/json",
        "application/x-www-form-urlencoded",
        "text/plain",
        "multipart/mixed; boundary=x",
        "multipart/form-data",
        "multipart/form-data; boundary=",
        "garbage",
    ],
)
def test_not_multipart_form_data_is_415(content_type: str | None) -> None:
    body, _ = httpx_form({}, [("file", ("a.wav", WAV, "audio/wav"))])
    with pytest.raises(UnsupportedMediaTypeError) as raised:
        parse_form(body, content_type, max_file_bytes=LIMIT)
    assert "multipart/form-data" in raised.value.message
    assert "\n" not in raised.value.message
    assert status_of(raised.value) == 415


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "no boundary line"),
        (b"nothing here", "no boundary line"),
        (hand_made([field_part("file", WAV)])[:-12], "ends before its closing boundary"),
        (b"--b0und\r\n" + field_part("file", WAV), "ends before its closing boundary"),
        (b"--b0und", "boundary line"),
        (b"--b0undX\r\n" + field_part("file", WAV) + b"\r\n--b0und--", "boundary line"),
        (hand_made([b'Content-Disposition: form-data; name="file"' + WAV]), "blank line"),
        (hand_made([b"Content-Type: text/plain\r\n\r\nx"]), "Content-Disposition"),
        (hand_made([b'Content-Disposition: attachment; name="file"\r\n\r\nx']), "Content-Disposition"),
        (hand_made([b"Content-Disposition: form-data\r\n\r\nx"]), "Content-Disposition"),
        (hand_made([b"Content-Disposition: form-data; name=" + b"x" * 9000 + b"\r\n\r\nx"]), "blank line"),
        (hand_made([field_part("include[]", b"x")] * 65), "more than 64 parts"),
        (
            hand_made([field_part("file", WAV, '; filename="a"'), field_part("model", b"\xff\xfe")]),
            "model must be UTF-8",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_malformed_bodies(body: bytes, says: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        parse_form(body, "multipart/form-data; boundary=b0und", max_file_bytes=LIMIT)
    assert says in raised.value.message


def test_non_ascii_boundary() -> None:
    with pytest.raises(InvalidRequestError, match="boundary must be ASCII"):
        parse_form(b"", 'multipart/form-data; boundary="gr\u00fc\u00dfe"', max_file_bytes=LIMIT)


REFUSALS: dict[str, tuple[Data, bytes | None, dict[str, Any], tuple[str, ...]]] = {
    # name: form fields, file, parse_form options, what the message says
    "no-file": ({"model": "m"}, None, {}, ("missing 'file'",)),
    "empty-file": ({}, b"", {}, ("file is empty",)),
    "model-twice": ({"model": ["a", "b"]}, WAV, {}, ("model is given more than once",)),
    "language-twice": ({"language": ["en", "de"]}, WAV, {}, ("language",)),
    "format-unknown": ({"response_format": "xml"}, WAV, {}, ("response_format must be", "'verbose_json'")),
    "temperature-word": ({"temperature": "hot"}, WAV, {}, ("temperature must be a number",)),
    "temperature-high": ({"temperature": "1.5"}, WAV, {}, ("temperature must be between 0 and 1",)),
    "temperature-negative": ({"temperature": "-0.1"}, WAV, {}, ("temperature must be between 0 and 1",)),
    "temperature-nan": ({"temperature": "nan"}, WAV, {}, ("temperature",)),
    "temperature-inf": ({"temperature": "inf"}, WAV, {}, ("temperature",)),
    "word-timestamps": (
        {"response_format": "verbose_json", "timestamp_granularities[]": ["segment", "word"]},
        WAV,
        {},
        ("timestamp_granularities[]", "word timestamps are not supported"),
    ),
    "granularity-unknown": (
        {"response_format": "verbose_json", "timestamp_granularities[]": "char"},
        WAV,
        {},
        ("timestamp_granularities[] must be 'segment'", "'char'"),
    ),
    "granularities-not-verbose": (
        {"timestamp_granularities[]": "segment"},
        WAV,
        {},
        ("timestamp_granularities[]", "verbose_json"),
    ),
    "granularities-with-text": (
        {"response_format": "text", "timestamp_granularities": "segment"},
        WAV,
        {},
        ("verbose_json",),
    ),
    "stream": ({"stream": "true"}, WAV, {}, ("stream", "not supported")),
    "stream-capital": ({"stream": "True"}, WAV, {}, ("stream",)),
    "language-on-translation": ({"language": "de"}, WAV, {"translation": True}, ("language",)),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_name_the_field(name: str) -> None:
    data, file, options, says = REFUSALS[name]
    message = refused(InvalidRequestError, data, file, **options)
    assert all(part in message for part in says), message
    assert "\n" not in message
    assert error_body(InvalidRequestError(message))["error"]["code"] == 400


def test_file_given_twice() -> None:
    files: Files = [("file", ("a.wav", WAV, "audio/wav")), ("file", ("b.wav", WAV, "audio/wav"))]
    body, content_type = httpx_form({}, files)
    with pytest.raises(InvalidRequestError, match="file is given more than once"):
        parse_form(body, content_type, max_file_bytes=LIMIT)


# ---- the answers ----------------------------------------------------------------------------------------


def segment(start: float, end: float, text: str, avg_logprob: float | None = None) -> Any:
    """A Segment; with `avg_logprob`, a stand-in that has it where Segment has no such field yet."""
    tokens = (50364, *range(len(text)))
    kwargs: dict[str, Any] = dict(start_s=start, end_s=end, text=text, tokens=tokens, finish_reason="stop")
    if "avg_logprob" in {f.name for f in fields(Segment)}:
        return Segment(**kwargs, avg_logprob=avg_logprob)
    return Segment(**kwargs) if avg_logprob is None else SimpleNamespace(**kwargs, avg_logprob=avg_logprob)


SPOKEN = [" Hello, world.", " Zweite Zeile --> mit\nPfeil.", " Über eine Stunde."]
TRANSCRIPT = Transcript(
    text="".join(SPOKEN),
    segments=(
        segment(0.0, 30.0, SPOKEN[0]),
        segment(30.0, 60.0, SPOKEN[1]),
        segment(60.0, 90.0, ""),  # a window with no speech: left out
        segment(90.0, 120.0, "  "),  # only spaces: left out too
        segment(3600.0, 3723.456, SPOKEN[2]),
    ),
    duration_s=3723.456,
    language="de",
)


def answer(
    response_format: str, temperature: float = 0.0, task: str = "transcribe", transcript: Transcript = TRANSCRIPT
) -> tuple[bytes, str]:
    form = TranscriptionForm(WAV, "a.wav", None, None, None, response_format, temperature)  # type: ignore[arg-type]
    return render(transcript, form, task=task)


def test_json_and_text() -> None:
    expected = '{"text":" Hello, world. Zweite Zeile --> mit\\nPfeil. Über eine Stunde."}'  # compact, UTF-8
    assert answer("json") == (expected.encode(), "application/json")
    assert answer("text") == (f"{TRANSCRIPT.text}\n".encode(), "text/plain; charset=utf-8")


def test_srt() -> None:
    body, media_type = answer("srt")
    assert media_type == "text/plain; charset=utf-8"
    assert body.decode() == (
        "1\n00:00:00,000 --> 00:00:30,000\nHello, world.\n\n"
        "2\n00:00:30,000 --> 00:01:00,000\nZweite Zeile -> mit Pfeil.\n\n"
        "3\n01:00:00,000 --> 01:02:03,456\nÜber eine Stunde.\n\n"
    )


def test_vtt() -> None:
    body, media_type = answer("vtt")
    assert media_type == "text/vtt; charset=utf-8"
    assert body.decode() == (
        "WEBVTT\n\n"
        "00:00:00.000 --> 00:00:30.000\nHello, world.\n\n"
        "00:00:30.000 --> 00:01:00.000\nZweite Zeile -> mit Pfeil.\n\n"
        "01:00:00.000 --> 01:02:03.456\nÜber eine Stunde.\n\n"
    )


def test_verbose_json() -> None:
    body, media_type = answer("verbose_json", temperature=0.2, task="translate")
    assert media_type == "application/json"
    assert "Über".encode() in body  # UTF-8, not \u escapes
    assert body.startswith(b'{"task":"translate","language":"german","duration":3723.456,"text":')  # compact
    times = [(0.0, 30.0, 0), (30.0, 60.0, 3000), (3600.0, 3723.456, 360000)]
    assert json.loads(body) == {
        "task": "translate",
        "language": "german",
        "duration": 3723.456,
        "text": TRANSCRIPT.text,
        "segments": [
            {
                "id": i,
                "seek": seek,
                "start": start,
                "end": end,
                "text": text,
                "tokens": [50364, *range(len(text))],
                "temperature": 0.2,
                "avg_logprob": None,
                "compression_ratio": len(text.encode()) / len(zlib.compress(text.encode())),
                "no_speech_prob": None,
            }
            for i, ((start, end, seek), text) in enumerate(zip(times, SPOKEN, strict=True))
        ],
    }


def test_verbose_json_average_logprob_and_languages() -> None:
    transcript = Transcript("x", (segment(0.0, 1.5, " x", avg_logprob=-0.25),), 1.5, None)
    body, _ = answer("verbose_json", transcript=transcript)
    assert body.startswith(b'{"task":"transcribe","language":null,"duration":1.5,')
    assert json.loads(body)["segments"][0]["avg_logprob"] == -0.25
    other = Transcript("x", (), 1.5, "xx")
    assert json.loads(answer("verbose_json", transcript=other)[0])["language"] == "xx"  # an unknown code as it is


def test_compression_ratio_as_openai_whisper() -> None:
    assert compression_ratio("") == 0.0
    assert compression_ratio("ha" * 200) > 10  # repetition, what openai-whisper's 2.4 threshold catches
    assert compression_ratio(" Hello.") == 7 / len(zlib.compress(b" Hello."))


def test_language_table_is_whispers() -> None:
    tokenization = pytest.importorskip("transformers.models.whisper.tokenization_whisper")
    assert tokenization.LANGUAGES == LANGUAGES
    assert len(LANGUAGES) == 100  # 99, and Cantonese (large-v3)


def test_no_segments() -> None:
    transcript = Transcript("", (segment(0.0, 30.0, ""),), 30.0, "en")
    assert answer("srt", transcript=transcript)[0] == b""
    assert answer("vtt", transcript=transcript)[0] == b"WEBVTT\n\n"
    assert json.loads(answer("verbose_json", transcript=transcript)[0])["segments"] == []
    assert answer("text", transcript=transcript)[0] == b"\n"


# ---- the openai client ----------------------------------------------------------------------------------


class Server:
    """A mock transport for the openai client: each request parsed by `parse_form` and answered by
    `render` (TRANSCRIPT), or with the error's status and body."""

    def __init__(self) -> None:
        self.forms: list[TranscriptionForm] = []
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        self.bodies.append(body)
        translation = request.url.path.endswith("/translations")
        try:
            form = parse_form(body, request.headers.get("content-type"), max_file_bytes=LIMIT, translation=translation)
        except ServeError as error:
            return httpx.Response(status_of(error), json=error_body(error))
        self.forms.append(form)
        content, media_type = render(TRANSCRIPT, form, task="translate" if translation else "transcribe")
        return httpx.Response(200, content=content, headers={"content-type": media_type})


@pytest.fixture
def client() -> Iterator[tuple[Any, Server]]:
    openai = pytest.importorskip("openai")
    server = Server()
    http = httpx.Client(transport=httpx.MockTransport(server))
    with openai.OpenAI(api_key="k", base_url="http://x/v1", http_client=http, max_retries=0) as made:
        yield made, server


def test_openai_client_every_field_and_verbose_json(client: tuple[Any, Server]) -> None:
    openai_client, server = client
    file = bytes(range(256)) * 4 + b"\r\n--"
    result = openai_client.audio.transcriptions.create(
        file=("rede.wav", file, "audio/wav"),
        model="whisper-1",
        language="DE",
        prompt="Grüße",
        response_format="verbose_json",
        temperature=0.3,
        timestamp_granularities=["segment"],
        include=["logprobs"],
        chunking_strategy="auto",
    )
    assert b'name="timestamp_granularities[]"' in server.bodies[0]  # as the client sends a list
    assert b'name="include[]"' in server.bodies[0]
    (form,) = server.forms
    assert (form.file, form.filename, form.model, form.language, form.prompt) == (
        file,
        "rede.wav",
        "whisper-1",
        "de",
        "Grüße",
    )
    assert (form.response_format, form.temperature, form.timestamp_granularities) == ("verbose_json", 0.3, ("segment",))
    assert (result.language, result.duration, result.text) == ("german", 3723.456, TRANSCRIPT.text)
    assert [(s.id, s.seek, s.start, s.end) for s in result.segments] == [
        (0, 0, 0.0, 30.0),
        (1, 3000, 30.0, 60.0),
        (2, 360000, 3600.0, 3723.456),
    ]
    assert result.segments[0].temperature == 0.3


@pytest.mark.parametrize("response_format", ["json", "text", "srt", "vtt"])
def test_openai_client_reads_each_format(client: tuple[Any, Server], response_format: str) -> None:
    openai_client, _ = client
    result = openai_client.audio.transcriptions.create(
        file=("a.wav", WAV, "audio/wav"), model="whisper-1", response_format=response_format
    )
    if response_format == "json":
        assert result.text == TRANSCRIPT.text
    else:
        assert result == answer(response_format)[0].decode()


def test_openai_client_refusals(client: tuple[Any, Server]) -> None:
    openai = pytest.importorskip("openai")
    openai_client, _ = client
    audio = openai_client.audio
    with pytest.raises(openai.BadRequestError, match="word timestamps are not supported"):
        audio.transcriptions.create(
            file=("a.wav", WAV), model="m", response_format="verbose_json", timestamp_granularities=["word"]
        )
    with pytest.raises(openai.BadRequestError, match="stream=true is not supported"):
        audio.transcriptions.create(file=("a.wav", WAV), model="m", stream=True)
    with pytest.raises(openai.BadRequestError, match="language is not a field of translations"):
        audio.translations.create(file=("a.wav", WAV), model="m", extra_body={"language": "de"})
    assert audio.translations.create(file=("a.wav", WAV), model="m", prompt="p").text == TRANSCRIPT.text
