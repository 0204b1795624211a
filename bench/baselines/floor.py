"""The floor of an HTTP server in Python: an ASGI app that reads a request's body, parses its JSON
(an image's base64 left in the body as ortpack's server leaves it: serving/http.py
`lifted_member`), decodes the base64 when the body holds an image, and answers a fixed small
JSON. No model, no queue, no metrics: what a Python server on uvicorn + httptools + uvloop and
orjson spends per request before it does anything of its own (bench/http_floor.py runs it).

    uvicorn bench.baselines.floor:app --http httptools --loop uvloop --port 8005
"""

from __future__ import annotations

from typing import Any

import orjson
import pybase64

from ortpack.serving.http import lifted_member

ANSWER = b'{"model":"floor","predictions":[{"label":"x","index":0,"probability":0.5}]}'
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())],
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":  # readiness (bench/serve_load.py `wait_ready`)
        await send(START)
        await send({"type": "http.response.body", "body": ANSWER})
        return
    body = bytearray()
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    lifted = lifted_member(body, "image")
    if lifted is not None:
        pybase64.b64decode(lifted[1], validate=True)
    else:
        parsed = orjson.loads(body)
        image = parsed.get("image") if isinstance(parsed, dict) else None
        if isinstance(image, str):
            pybase64.b64decode(image, validate=True)
    await send(START)
    await send({"type": "http.response.body", "body": ANSWER})
