"""The HTTP side of OpenAI's audio API (`POST /v1/audio/transcriptions` and `/v1/audio/translations`):
the multipart form in, the answer in the asked `response_format` out. Pure: no model, no I/O; the
speech task reads the body (within the server's byte limit), calls `parse_form`, transcribes, and
answers what `render` gives.

`parse_form(body, content_type, max_file_bytes=..., translation=...)` takes the form's fields as
OpenAI's clients send them (`file`, `model`, `language`, `prompt`, `response_format`,
`temperature`, `timestamp_granularities[]`, repeated; other fields, such as `include[]` or
`chunking_strategy`, are ignored) and refuses, in one line naming the field: a body that is not
multipart/form-data (415), a file over `max_file_bytes` (413), and anything else wrong (400): a
malformed body, no file or an empty one, a field given twice, an unknown `response_format`, a
temperature outside [0, 1], word timestamps, timestamp granularities without `verbose_json`,
`stream=true`, a language on a translation (OpenAI's translations take none). An empty field is as
if it were absent.

`render(transcript, form, task=...)` writes `json`, `text`, `verbose_json` (OpenAI's shape, with
openai-whisper's compression ratio per segment), `srt` and `vtt`; segments without text are left
out of the last three.

Why its own splitter and not the standard library's email parser: python-multipart is not a
dependency, and `email.parser.BytesParser` (with `email.policy.HTTP`) parses a form byte-exactly
but cuts the whole body into lines at every CR and LF, file included: 0.72 s for a 25 MB file of
random bytes (2-core AMD EPYC), where `parse_form` takes 14-22 ms (the delimiters found with
`bytes.find`, the file copied once); and it ends a part at a boundary after a lone CR or LF, where
RFC 2046 has only CRLF. So the body
is split here at `CRLF--boundary`, exactly as RFC 2046 section 5.1.1 writes it (CRLF line ends
only, as every client sends), and each part's few header lines are parsed by the standard library
(quoted and escaped names, RFC 2231 `filename*=`, raw UTF-8 filenames). The file stays a view of
the body until it is within the limit, then is copied once.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.parser import HeaderParser
from email.policy import HTTP
from typing import TYPE_CHECKING, Literal, NamedTuple, cast, get_args

from ortpack.serving.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError
from ortpack.serving.http import JSON, json_bytes

if TYPE_CHECKING:
    from ortpack.kernel.generation.whisper import Segment, Transcript

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
RESPONSE_FORMATS: tuple[str, ...] = get_args(ResponseFormat)
TEXT = "text/plain; charset=utf-8"
VTT = "text/vtt; charset=utf-8"
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", "stream")
GRANULARITIES = ("timestamp_granularities[]", "timestamp_granularities")  # may repeat
MAX_PARTS = 64  # OpenAI's form has about ten fields; each part's headers cost a header parse
MAX_PART_HEADER_BYTES = 8192

# Whisper's languages, code -> the name OpenAI's verbose_json gives (openai-whisper's and transformers'
# LANGUAGES: 99, and Cantonese, which large-v3 added)
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian", "kn": "kannada",
    "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be": "belarusian",
    "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TranscriptionForm:
    """One request's form, checked: `language` lowercased, None where absent or empty."""

    file: bytes = field(repr=False)
    filename: str  # "" where the part had none
    model: str | None
    language: str | None
    prompt: str | None
    response_format: ResponseFormat = "json"
    temperature: float = 0.0
    timestamp_granularities: tuple[str, ...] = ()


class _Part(NamedTuple):
    name: str
    filename: str | None
    content: memoryview  # of the body: copied only where kept


def parse_form(
    body: bytes | bytearray | memoryview, content_type: str | None, *, max_file_bytes: int, translation: bool = False
) -> TranscriptionForm:
    """The form of a transcription (or, with `translation`, a translation) request: `body` is the
    request's body as read, `content_type` its Content-Type header."""
    data = bytes(body)  # the same object where it is bytes already
    known: dict[str, _Part] = {}
    granularities: list[str] = []
    for part in _parts(data, _boundary(content_type)):
        if part.name in GRANULARITIES:
            granularities.append(_text(part))
        elif part.name in known:
            raise InvalidRequestError(f"{part.name} is given more than once")
        elif part.name in FIELDS:
            known[part.name] = part
    return _form(known, tuple(granularities), max_file_bytes, translation)


def _boundary(content_type: str | None) -> bytes:
    header = HTTP.header_factory("content-type", content_type or "")
    if header.content_type != "multipart/form-data":
        kind = (content_type or "").split(";")[0].strip().lower()
        given = f", not {kind!r}" if kind else "; the request has no Content-Type"
        raise UnsupportedMediaTypeError(f"send the form as multipart/form-data{given}")
    boundary = header.params.get("boundary")
    if not boundary:
        raise UnsupportedMediaTypeError("Content-Type multipart/form-data needs its boundary parameter")
    if not boundary.isascii():
        raise InvalidRequestError("the multipart boundary must be ASCII")
    return boundary.encode()


def _parts(data: bytes, boundary: bytes) -> Iterator[_Part]:
    """The body's parts in order (RFC 2046 5.1.1): after an optional preamble, `--boundary`, then
    parts each ended by `CRLF--boundary`, the last by `CRLF--boundary--`. A boundary line may end
    in spaces or tabs before its CRLF; what follows the last is ignored."""
    dash, delimiter = b"--" + boundary, b"\r\n--" + boundary
    preamble_end = -2 if data.startswith(dash) else data.find(delimiter)
    if preamble_end == -1:
        raise InvalidRequestError("malformed multipart body: no boundary line")
    view, at, count = memoryview(data), preamble_end + len(delimiter), 0
    while not data.startswith(b"--", at):
        line_end = data.find(b"\r\n", at)
        if line_end < 0 or data[at:line_end].strip(b" \t"):
            raise InvalidRequestError("malformed multipart body: a boundary line has more than the boundary")
        end = data.find(delimiter, line_end)
        if end < 0:
            raise InvalidRequestError("malformed multipart body: it ends before its closing boundary")
        count += 1
        if count > MAX_PARTS:
            raise InvalidRequestError(f"the form has more than {MAX_PARTS} parts")
        yield _part(data, view, line_end, end)
        at = end + len(delimiter)


def _part(data: bytes, view: memoryview, start: int, end: int) -> _Part:
    """The part between `start` (the CRLF that ends its boundary line) and `end` (its delimiter):
    header lines, a blank line, the content."""
    blank = data.find(b"\r\n\r\n", start, min(end, start + MAX_PART_HEADER_BYTES))
    if blank < 0:
        raise InvalidRequestError(
            f"malformed multipart body: no blank line ends a part's headers within {MAX_PART_HEADER_BYTES} bytes"
        )
    headers = HeaderParser(policy=HTTP).parsestr(data[start + 2 : blank + 2].decode("utf-8", "replace"))
    name = headers.get_param("name", header="content-disposition")
    if headers.get_content_disposition() != "form-data" or not isinstance(name, str):
        raise InvalidRequestError("malformed multipart body: a part has no Content-Disposition form-data name")
    return _Part(name, headers.get_filename(), view[blank + 4 : end])


def _text(part: _Part) -> str:
    try:
        return str(part.content, "utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{part.name} must be UTF-8 text") from None


def _form(
    known: dict[str, _Part], granularities: tuple[str, ...], max_file_bytes: int, translation: bool
) -> TranscriptionForm:
    file = known.pop("file", None)
    if file is None:
        raise InvalidRequestError("missing 'file'")
    if not file.content:
        raise InvalidRequestError("file is empty")
    if len(file.content) > max_file_bytes:
        raise PayloadTooLargeError(f"file is {len(file.content)} bytes; the limit is {max_file_bytes}")
    text = {name: value for name, part in known.items() if (value := _text(part))}
    if text.get("stream", "").strip().lower() == "true":
        raise InvalidRequestError("stream=true is not supported: transcriptions are answered whole, not streamed")
    response_format = text.get("response_format", "json")
    if response_format not in RESPONSE_FORMATS:
        raise InvalidRequestError("response_format must be 'json', 'text', 'srt', 'verbose_json' or 'vtt'")
    _check_granularities(granularities, response_format)
    language = text.get("language", "").strip().lower() or None
    if translation and language is not None:
        raise InvalidRequestError("language is not a field of translations (they are always into English)")
    return TranscriptionForm(
        file=bytes(file.content),
        filename=file.filename or "",
        model=text.get("model"),
        language=language,
        prompt=text.get("prompt"),
        response_format=cast(ResponseFormat, response_format),  # checked above
        temperature=_temperature(text.get("temperature")),
        timestamp_granularities=granularities,
    )


def _temperature(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        raise InvalidRequestError(f"temperature must be a number, got {value!r}") from None
    if not 0.0 <= temperature <= 1.0:  # NaN too
        raise InvalidRequestError(f"temperature must be between 0 and 1, got {value}")
    return temperature


def _check_granularities(granularities: tuple[str, ...], response_format: str) -> None:
    for value in granularities:
        if value != "segment":
            why = "; word timestamps are not supported" if value == "word" else ""
            raise InvalidRequestError(f"timestamp_granularities[] must be 'segment', got {value!r}{why}")
    if granularities and response_format != "verbose_json":
        raise InvalidRequestError("timestamp_granularities[] needs response_format 'verbose_json'")


def render(transcript: Transcript, form: TranscriptionForm, *, task: str) -> tuple[bytes, str]:
    """The answer's body and media type in the form's `response_format`; `task` is "transcribe"
    or "translate" (verbose_json says which)."""
    spoken = [segment for segment in transcript.segments if segment.text.strip()]
    match form.response_format:
        case "json":
            return json_bytes({"text": transcript.text}), JSON
        case "text":
            return f"{transcript.text}\n".encode(), TEXT
        case "verbose_json":
            return json_bytes(_verbose(transcript, spoken, form.temperature, task)), JSON
        case "srt":
            cues = (f"{i}\n{_cue(segment, ',')}" for i, segment in enumerate(spoken, 1))
            return "".join(cues).encode(), TEXT
        case "vtt":
            return "".join(["WEBVTT\n\n", *(_cue(segment, ".") for segment in spoken)]).encode(), VTT


def _verbose(transcript: Transcript, spoken: list[Segment], temperature: float, task: str) -> dict[str, object]:
    """OpenAI's verbose_json; no_speech_prob is not computed (null)."""
    code = transcript.language
    return {
        "task": task,
        "language": LANGUAGES.get(code, code) if code else None,
        "duration": transcript.duration_s,
        "text": transcript.text,
        "segments": [
            {
                "id": i,
                "seek": round(segment.start_s * 100),  # in 10 ms frames, as openai-whisper counts
                "start": segment.start_s,
                "end": segment.end_s,
                "text": segment.text,
                "tokens": list(segment.tokens),
                "temperature": temperature,
                "avg_logprob": getattr(segment, "avg_logprob", None),
                "compression_ratio": compression_ratio(segment.text),
                "no_speech_prob": None,
            }
            for i, segment in enumerate(spoken)
        ],
    }


def compression_ratio(text: str) -> float:
    """openai-whisper's: the UTF-8 text's length over its zlib-compressed length (0.0 for no text)."""
    encoded = text.encode()
    return len(encoded) / len(zlib.compress(encoded))


def _cue(segment: Segment, decimal_marker: str) -> str:
    """One SRT or WebVTT cue after its number: the times, the text on one line (whitespace runs
    as one space, `-->` written `->`, as openai-whisper's writers do), a blank line."""
    text = " ".join(segment.text.split()).replace("-->", "->")
    start, end = _timestamp(segment.start_s, decimal_marker), _timestamp(segment.end_s, decimal_marker)
    return f"{start} --> {end}\n{text}\n\n"


def _timestamp(seconds: float, decimal_marker: str) -> str:
    """hh:mm:ss,mmm (SRT) or hh:mm:ss.mmm (WebVTT), hours always two digits or more."""
    hours, rest = divmod(max(0, round(seconds * 1000)), 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{decimal_marker}{millis:03d}"
