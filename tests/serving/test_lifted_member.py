"""`lifted_member` (serving/http.py): a body's first member, a long plain string, left in the body."""

from __future__ import annotations

import base64
import mmap

import orjson
import pytest

from ortpack.serving.http import LIFT_FROM_BYTES, LIFTED, lifted_member

BLOB = base64.b64encode(bytes(range(256)) * (LIFT_FROM_BYTES // 128)).decode()


@pytest.mark.parametrize(
    "body",
    [
        f'{{"image":"{BLOB}"}}',
        f'{{ "image" : "{BLOB}" , "top_k" : 3 , "x": {{"y": [1, "z"]}} }}',
        f'\n{{\t"image":\r"{BLOB}"}}'.lstrip(),
    ],
)
def test_the_first_members_string_is_left_in_the_body_and_the_rest_parsed(body: str) -> None:
    lifted = lifted_member(bytearray(body.encode()), "image")
    assert lifted is not None
    parsed, value = lifted
    whole = orjson.loads(body)
    assert bytes(value).decode() == whole["image"]
    assert parsed == {**whole, "image": LIFTED}


def test_a_view_of_a_mapping_is_searched_in_its_mapping() -> None:
    """read_body gives a large body as a view of an anonymous mapping, cut to the body's size."""
    body = f'{{"input": "{BLOB}", "model": "m"}}'.encode()
    mapping = mmap.mmap(-1, len(body) + 4096)
    mapping[: len(body)] = body
    lifted = lifted_member(memoryview(mapping)[: len(body)], "input")
    assert lifted is not None
    assert lifted[0] == {"input": LIFTED, "model": "m"} and bytes(lifted[1]) == BLOB.encode()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"image": "aGVsbG8="}', "small: parsed whole"),
        (f'{{"top_k": 3, "image": "{BLOB}"}}', "not the first member"),
        (f'{{"picture": "{BLOB}"}}', "another key"),
        (f'{{"image": "{BLOB[:100]}\\/{BLOB[100:]}"}}', "an escape: the string is not its bytes"),
        (f'{{"image": "{BLOB}", "image": "x"}}', "the key again: the last one counts"),
        (f'{{"image": "{BLOB}", "x": {{"image": 1}}}}', "the key's name again, even nested: parsed whole"),
        (f'{{"image": "{BLOB}", "im\\u0061ge": "x"}}', "the key again, escaped: the last one counts"),
        (f'{{"image": "{BLOB}", "note": "a \\"quote\\""}}', "an escape after the string: parsed whole"),
        (f'{{"image": "{BLOB}"}} trailing', "malformed after the string: the whole parse says where"),
        (f'{{"image": "{BLOB}"', "not closed"),
        (f'{{"image": "{BLOB}', "the string not closed"),
        (f'{{"image": {len(BLOB)}, "pad": "{BLOB}"}}', "not a string"),
    ],
)
def test_anything_else_is_left_to_the_whole_parse(body: str, why: str) -> None:
    assert lifted_member(bytearray(body.encode()), "image") is None, why
