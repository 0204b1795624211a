"""The Open Inference Protocol's binary tensor data extension (Triton's `binary_tensor_data`, as
tritonclient and KServe clients send it): tensor bytes after the JSON instead of JSON numbers.

A request (or answer) is its JSON header, `Inference-Header-Content-Length` bytes long, then the
tensors' raw bytes in the order of the tensors that declare `parameters.binary_data_size`:
little-endian numbers, row-major; a BYTES tensor is each element as a 4-byte little-endian length
and its bytes. Everything here checks sizes against the bytes it was given, never allocates from a
declared shape, and refuses what does not add up with `InvalidRequestError` (400)."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ortpack.serving.errors import InvalidRequestError

HEADER_LENGTH = "Inference-Header-Content-Length"
EXTENSION = "binary_tensor_data"
# The fixed-size datatypes and their little-endian numpy types (BF16 has none in numpy).
DTYPES = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_PREFIX = struct.Struct("<I")


def header_length(value: str, body_size: int) -> int:
    """The JSON header's length from `Inference-Header-Content-Length`, within the body."""
    digits = value.strip()
    if not (digits.isascii() and digits.isdigit()):  # "²" is a digit that int() refuses
        raise InvalidRequestError(f"{HEADER_LENGTH} must be a non-negative integer, got {value!r}")
    length = int(digits)
    if length > body_size:
        raise InvalidRequestError(f"{HEADER_LENGTH} {length} exceeds the {body_size}-byte body")
    return length


def binary_size(tensor: dict[str, Any]) -> int | None:
    """The tensor's `parameters.binary_data_size` (checked), or None when its data is JSON."""
    name = tensor.get("name")
    parameters = tensor.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"input '{name}' parameters must be an object, got {parameters!r}")
    size = parameters.get("binary_data_size")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidRequestError(f"input '{name}' binary_data_size must be a non-negative integer, got {size!r}")
    if "data" in tensor:
        raise InvalidRequestError(f"input '{name}' has both data and binary_data_size; send one")
    return size


def attach_binary_inputs(inputs: list[dict[str, Any]], binary: memoryview | None) -> None:
    """Set `data` on each input that declares `binary_data_size`, from consecutive pieces of
    `binary` (the body after the JSON header; None: the request has no such header), which the
    declared sizes must cover exactly."""
    offset = 0
    for tensor in inputs:
        size = binary_size(tensor)
        if size is None:
            continue
        if binary is None:
            raise InvalidRequestError(
                f"input '{tensor.get('name')}' has binary_data_size but the request has no {HEADER_LENGTH} header"
            )
        if offset + size > len(binary):
            raise InvalidRequestError(
                f"input '{tensor.get('name')}' binary_data_size {size} runs past the "
                f"{len(binary)} bytes after the JSON header"
            )
        tensor["data"] = decode(tensor, binary[offset : offset + size])
        offset += size
    if binary is not None and offset != len(binary):
        raise InvalidRequestError(
            f"the inputs' binary_data_size add up to {offset} bytes, but {len(binary)} follow the JSON header"
        )


def decode(tensor: dict[str, Any], raw: memoryview) -> Any:
    """One input's raw bytes as JSON data would give them: a list of strings for BYTES (UTF-8), a
    flat read-only numpy array otherwise; the element count must match the shape."""
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidRequestError(f"input '{name}' shape must be a list of non-negative integers, got {shape!r}")
    count = math.prod(shape)
    if datatype == "BYTES":
        texts = _bytes_elements(name, raw)
        if len(texts) != count:
            raise InvalidRequestError(f"input '{name}' has shape {shape} but {len(texts)} binary BYTES elements")
        return texts
    dtype = DTYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise InvalidRequestError(f"input '{name}' datatype {datatype!r} cannot be sent as binary data")
    if len(raw) != count * dtype.itemsize:
        raise InvalidRequestError(
            f"input '{name}' binary_data_size {len(raw)} is not shape {shape} x {dtype.itemsize} bytes ({datatype})"
        )
    return np.frombuffer(raw, dtype=dtype)


def _bytes_elements(name: Any, raw: memoryview) -> list[str]:
    """The elements of a binary BYTES tensor: each a 4-byte little-endian length, then that many
    bytes of UTF-8."""
    texts: list[str] = []
    offset, end = 0, len(raw)
    while offset < end:
        if offset + 4 > end:
            raise InvalidRequestError(f"input '{name}' binary BYTES data ends inside an element's length")
        (length,) = _PREFIX.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise InvalidRequestError(
                f"input '{name}' binary BYTES element {len(texts)} of {length} bytes runs past its data"
            )
        try:
            texts.append(str(raw[offset : offset + length], "utf-8"))
        except UnicodeDecodeError:
            raise InvalidRequestError(f"input '{name}' binary BYTES element {len(texts)} is not UTF-8") from None
        offset += length
    return texts


def wants_binary(body: dict[str, Any]) -> bool:
    """Whether the answer's output goes as binary data: an output's `parameters.binary_data`
    when the request names it with one, else the request's `parameters.binary_data_output`
    (default false). `outputs`, when given, is already checked to be a list of objects."""
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"parameters must be an object, got {parameters!r}")
    wanted = _flag(parameters, "binary_data_output", "parameters.binary_data_output")
    for i, output in enumerate(body.get("outputs") or []):
        output_parameters = output.get("parameters", {})
        if not isinstance(output_parameters, dict):
            raise InvalidRequestError(f"outputs[{i}].parameters must be an object, got {output_parameters!r}")
        flag = _flag(output_parameters, "binary_data", f"outputs[{i}].parameters.binary_data")
        if flag is not None:
            wanted = flag
    return bool(wanted)


def _flag(parameters: dict[str, Any], key: str, where: str) -> bool | None:
    value = parameters.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequestError(f"{where} must be true or false, got {value!r}")
    return value


def encode_array(array: np.ndarray, datatype: str) -> bytes:
    """An output as binary data: little-endian numbers, row-major, one copy at most."""
    return np.ascontiguousarray(array, dtype=DTYPES[datatype]).tobytes()
