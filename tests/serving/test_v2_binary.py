"""The Open Inference Protocol's binary tensor data extension on a real server on 127.0.0.1: raw
tensor bytes after the JSON header (`Inference-Header-Content-Length`), in requests and answers,
encoded here as tritonclient and KServe clients encode them; and bad binary input answered 4xx in
the one JSON error shape."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ortpack.serving.binary_tensors import attach_binary_inputs
from ortpack.serving.errors import InvalidRequestError
from tests.servers import RunningServer, running_server

TEXTS = ["The quick brown fox jumps over the lazy dog.", "日本語の文も埋め込めます。", "ok"]
MAX_BODY = 65536
HEADER = "Inference-Header-Content-Length"
NO_HEADER = "no header"  # in BAD: send the body as a JSON request, without the header


@pytest.fixture(scope="module")
def server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(
        tiny_bundle, "--max-body-bytes", str(MAX_BODY), log_dir=tmp_path_factory.mktemp("logs")
    ) as running:
        yield running


# --- a client-side encoder, as tritonclient's --------------------------------------------------


def bytes_elements(texts: list[str]) -> bytes:
    """A BYTES tensor's binary data: each element as a 4-byte little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in (t.encode() for t in texts))


def binary_body(header: dict[str, Any], *tensors: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(tensors), {HEADER: str(len(head)), "Content-Type": "application/octet-stream"}


def text_input(texts: list[str], *, binary: bool = False, shape: list[int] | None = None) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": "text", "datatype": "BYTES", "shape": shape or [len(texts)]}
    if binary:
        tensor["parameters"] = {"binary_data_size": len(bytes_elements(texts))}
    else:
        tensor["data"] = texts
    return tensor


def infer(server: RunningServer, body: dict[str, Any] | tuple[bytes, dict[str, Any]]) -> httpx.Response:
    url = f"{server.url}/v2/models/tiny-bert/infer"
    if isinstance(body, dict):
        return httpx.post(url, json=body, timeout=30)
    content, headers = body
    return httpx.post(url, content=content, headers=headers, timeout=30)


def output_rows(answer: httpx.Response) -> tuple[dict[str, Any], np.ndarray]:
    """(the answer's output tensor as its JSON says, its rows), from JSON data or binary data."""
    assert answer.status_code == 200, answer.text
    if HEADER not in answer.headers:
        assert answer.headers["content-type"] == "application/json"
        (output,) = answer.json()["outputs"]
        return output, np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    assert answer.headers["content-type"] == "application/octet-stream"
    length = int(answer.headers[HEADER])
    header = json.loads(answer.content[:length])
    (output,) = header["outputs"]
    assert "data" not in output and output["datatype"] == "FP32"
    size = output["parameters"]["binary_data_size"]
    assert size == len(answer.content) - length == 4 * int(np.prod(output["shape"]))
    return output, np.frombuffer(answer.content[length:], dtype="<f4").reshape(output["shape"])


# --- answers --------------------------------------------------------------------------------------


def test_server_metadata_advertises_the_extension(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/v2").json()["extensions"] == ["binary_tensor_data"]


def test_binary_output_equals_the_json_output(server: RunningServer) -> None:
    plain = {"id": "r1", "inputs": [text_input(TEXTS)]}
    as_json = infer(server, plain)
    as_binary = infer(server, {**plain, "parameters": {"binary_data_output": True}})
    json_output, json_rows = output_rows(as_json)
    binary_output, binary_rows = output_rows(as_binary)
    assert HEADER in as_binary.headers and HEADER not in as_json.headers
    assert binary_output["shape"] == json_output["shape"] == [3, 64]
    assert binary_output["parameters"] == {"binary_data_size": 3 * 64 * 4}
    np.testing.assert_array_equal(binary_rows, json_rows)
    length = int(as_binary.headers[HEADER])
    header = json.loads(as_binary.content[:length])
    assert header["id"] == "r1" and header["model_name"] == "tiny-bert" and header["model_version"] == "1"
    assert as_binary.headers["x-embedding-space"] == as_json.headers["x-embedding-space"]


@pytest.mark.parametrize(
    ("request_flag", "output_flag", "binary"),
    [
        (None, True, True),  # the output asks
        (True, None, True),  # the request asks for every output
        (True, False, False),  # the output's own flag wins over the request's
        (False, True, True),
        (None, False, False),
        (None, None, False),
    ],
)
def test_which_flag_decides(
    server: RunningServer, request_flag: bool | None, output_flag: bool | None, binary: bool
) -> None:
    body: dict[str, Any] = {"inputs": [text_input(TEXTS[:1])]}
    if request_flag is not None:
        body["parameters"] = {"binary_data_output": request_flag}
    output: dict[str, Any] = {"name": "sentence_embedding"}
    if output_flag is not None:
        output["parameters"] = {"binary_data": output_flag}
    body["outputs"] = [output]
    answer = infer(server, body)
    assert (HEADER in answer.headers) == binary
    _, rows = output_rows(answer)
    _, expected = output_rows(infer(server, {"inputs": [text_input(TEXTS[:1])]}))
    np.testing.assert_array_equal(rows, expected)


def test_binary_bytes_input_equals_the_json_input(server: RunningServer) -> None:
    _, expected = output_rows(infer(server, {"inputs": [text_input(TEXTS)]}))
    data = bytes_elements(TEXTS)
    # binary in, JSON out; binary in and out; the [n, 1] shape; a client that sends no
    # Content-Type, or urllib's default form type: the header says the body is binary
    cases: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"inputs": [text_input(TEXTS, binary=True)]}, {}),
        ({"inputs": [text_input(TEXTS, binary=True)], "parameters": {"binary_data_output": True}}, {}),
        ({"inputs": [text_input(TEXTS, binary=True, shape=[3, 1])]}, {}),
        ({"inputs": [text_input(TEXTS, binary=True)]}, {"Content-Type": ""}),
        ({"inputs": [text_input(TEXTS, binary=True)]}, {"Content-Type": "application/x-www-form-urlencoded"}),
    ]
    for header, extra in cases:
        content, headers = binary_body(header, data)
        headers = {k: v for k, v in (headers | extra).items() if v}
        _, rows = output_rows(infer(server, (content, headers)))
        np.testing.assert_array_equal(rows, expected)
    # the header alone (no binary input) with the JSON length: an ordinary request
    content, headers = binary_body({"inputs": [text_input(TEXTS)]})
    _, rows = output_rows(infer(server, (content, headers)))
    np.testing.assert_array_equal(rows, expected)


# --- bad binary input: 4xx in one shape -------------------------------------------------------------


def _with(tensor: dict[str, Any], **parameters: Any) -> dict[str, Any]:
    return {"inputs": [tensor | {"parameters": parameters}]}


_ONE = bytes_elements(["hello"])
_BINARY_ONE = {"inputs": [text_input(["hello"], binary=True)]}
_JSON_ONE = {"inputs": [text_input(["hello"])]}
_BARE = {"name": "text", "datatype": "BYTES", "shape": [1]}

BAD: list[tuple[str, dict[str, Any] | bytes, bytes, str | bytes | None, int, str]] = [
    # (case, JSON header, bytes after it, Inference-Header-Content-Length override, status, message)
    ("length past the body", _BINARY_ONE, _ONE, "100000", 400, "exceeds the"),
    ("length not an integer", _BINARY_ONE, _ONE, "12.5", 400, "must be a non-negative integer"),
    ("length negative", _BINARY_ONE, _ONE, "-1", 400, "must be a non-negative integer"),
    ("length a superscript digit", _BINARY_ONE, _ONE, b"\xb2", 400, "must be a non-negative integer"),
    ("length zero", _BINARY_ONE, _ONE, "0", 400, "empty request body"),
    ("header not JSON", b"{not json", b"", None, 400, "malformed JSON"),
    ("size past the data", _with(_BARE, binary_data_size=len(_ONE) + 1), _ONE, None, 400, "runs past"),
    ("bytes left over", _BINARY_ONE, _ONE + b"\0\0\0\0", None, 400, "add up to 9 bytes, but 13 follow"),
    ("bytes with no binary input", _JSON_ONE, _ONE, None, 400, "add up to 0 bytes, but 9 follow"),
    ("size negative", _with(_BARE, binary_data_size=-1), b"", None, 400, "non-negative integer"),
    ("size a float", _with(_BARE, binary_data_size=9.0), _ONE, None, 400, "non-negative integer"),
    ("size a bool", _with(_BARE, binary_data_size=True), _ONE, None, 400, "non-negative integer"),
    ("size a string", _with(_BARE, binary_data_size="9"), _ONE, None, 400, "non-negative integer"),
    ("parameters not an object", {"inputs": [_BARE | {"parameters": [9]}]}, _ONE, None, 400, "must be an object"),
    ("data and size", _with(_BARE | {"data": ["x"]}, binary_data_size=9), _ONE, None, 400, "both data and"),
    ("element past its data", _with(_BARE, binary_data_size=6), _ONE[:6], None, 400, "element 0 of 5 bytes"),
    ("cut length prefix", _with(_BARE, binary_data_size=3), b"\5\0\0", None, 400, "inside an element's length"),
    ("not UTF-8", _with(_BARE, binary_data_size=6), b"\2\0\0\0\xff\xfe", None, 400, "is not UTF-8"),
    ("fewer elements", _with(_BARE | {"shape": [2]}, binary_data_size=9), _ONE, None, 400, "but 1 binary BYTES"),
    ("a huge shape", _with(_BARE | {"shape": [10**15]}, binary_data_size=9), _ONE, None, 400, "but 1 binary BYTES"),
    ("a bad shape", _with(_BARE | {"shape": [-1]}, binary_data_size=9), _ONE, None, 400, "non-negative integers"),
    ("an empty text", _with(_BARE, binary_data_size=4), b"\0\0\0\0", None, 400, "data[0] is empty"),
    ("wrong datatype", _with(_BARE | {"datatype": "FP32"}, binary_data_size=4), b"\0" * 4, None, 400, "BYTES"),
    ("size without the header", _BINARY_ONE, b"", NO_HEADER, 400, "has no Inference-Header-Content-Length header"),
    (
        "request flag not a bool",
        _JSON_ONE | {"parameters": {"binary_data_output": "yes"}},
        b"",
        None,
        400,
        "binary_data_output must be true or",
    ),
    ("request parameters a list", _JSON_ONE | {"parameters": []}, b"", None, 400, "parameters must be an object"),
    (
        "output flag not a bool",
        _JSON_ONE | {"outputs": [{"name": "sentence_embedding", "parameters": {"binary_data": 1}}]},
        b"",
        None,
        400,
        "outputs[0].parameters.binary_data must be true or false",
    ),
    (
        "output parameters not an object",
        _JSON_ONE | {"outputs": [{"name": "sentence_embedding", "parameters": 5}]},
        b"",
        None,
        400,
        "outputs[0].parameters must be an object",
    ),
    ("over the body limit", _with(_BARE, binary_data_size=MAX_BODY), b"\0" * MAX_BODY, None, 413, "byte limit"),
]


@pytest.mark.parametrize(("case", "header", "tail", "length", "status", "fragment"), BAD, ids=[b[0] for b in BAD])
def test_bad_binary_input_is_4xx_in_one_shape(
    server: RunningServer,
    case: str,
    header: dict[str, Any] | bytes,
    tail: bytes,
    length: str | bytes | None,
    status: int,
    fragment: str,
) -> None:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER: length or str(len(head))}
    if length == NO_HEADER:
        headers = {"Content-Type": "application/json"}
    answer = infer(server, (head + tail, headers))
    assert answer.status_code == status, (case, answer.text)
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == status, case
    assert fragment in error["message"], (case, error)


# --- the other datatypes (no text model takes them: the decoder on its own) ------------------------


def test_fixed_size_datatypes_decode_little_endian() -> None:
    ids = np.array([[101, 2023, 102], [101, 7592, 102]], dtype="<i8")
    tensor: dict[str, Any] = {"name": "ids", "datatype": "INT64", "shape": [2, 3]}
    tensor["parameters"] = {"binary_data_size": ids.nbytes}
    half = {"name": "x", "datatype": "FP16", "shape": [2], "parameters": {"binary_data_size": 4}}
    attach_binary_inputs([tensor, half], memoryview(ids.tobytes() + np.array([1.5, -2], dtype="<f2").tobytes()))
    np.testing.assert_array_equal(tensor["data"], ids.reshape(-1))
    np.testing.assert_array_equal(half["data"], [1.5, -2.0])


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "fragment"),
    [
        ("INT64", [2], 12, "is not shape [2] x 8 bytes (INT64)"),  # not a whole number of elements
        ("INT64", [2], 8, "is not shape [2] x 8 bytes"),
        ("INT32", [10**15], 8, "is not shape"),  # the shape never allocates
        ("BF16", [2], 4, "cannot be sent as binary data"),
        ("STRING", [1], 4, "cannot be sent as binary data"),
    ],
)
def test_fixed_size_datatypes_check_the_size(datatype: str, shape: list[int], size: int, fragment: str) -> None:
    tensor = {"name": "x", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}
    with pytest.raises(InvalidRequestError) as raised:
        attach_binary_inputs([tensor], memoryview(b"\0" * size))
    assert fragment in raised.value.message
