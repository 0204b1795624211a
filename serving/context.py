"""What one request carries through the layers without being passed along: its id, its deadline
(counted from its arrival, so reading the body and tokenizing spend it too), and what the layers
below the route measured for the access log, the `x-queue-time` / `x-inference-time` headers and
the per-request stage breakdown (`ortpack_request_stage_seconds`).

The HTTP wrapper (serving/http.py) binds a `RequestContext` for each request; the tokenizer
(serving/text.py) and the batcher read and fill it. Outside a request (warm-up, the probe check,
tests of the batcher alone) there is none and nothing is recorded.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from dataclasses import dataclass

from ortpack.serving.errors import DeadlineExceededError


@dataclass(slots=True, eq=False)
class RequestContext:
    request_id: str
    arrival: float  # time.perf_counter() when the request's first byte was read
    deadline: float  # time.perf_counter() by which it must be answered
    items: int = 0  # texts or images queued for the model
    reserved: int = 0  # bytes of the server's memory budget it holds (ortpack.serving.memory)
    pixels_held: int = 0  # of which for its images' decoded pixels, held before they were decoded
    body_bytes: int = 0  # its body's size, once read
    tokens: int = 0  # real tokens of its texts
    queue_s: float | None = None  # queued until its first model call started
    inference_s: float | None = None  # its first model call's start to its last one's end
    # The rest of the stage breakdown (seconds; serving/stages.py names and exports them):
    read_s: float = 0.0  # reading and parsing the body
    tokenize_s: float = 0.0  # tokenizing its texts (on the loop or a thread)
    model_s: float = 0.0  # its model calls, summed (one call: the same as inference_s)
    model_end: float = 0.0  # time.perf_counter() when its last model call ended
    postprocess_s: float = 0.0  # the last model call's end to its rows in the handler (hand-off, stacking)
    serialize_s: float = 0.0  # encoding the answer (JSON, base64)

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def check_deadline(self, what: str) -> None:
        """504 now if the deadline passed (e.g. while the body was read or the texts tokenized)."""
        if time.perf_counter() >= self.deadline:
            budget = (self.deadline - self.arrival) * 1000
            raise DeadlineExceededError(f"no answer within the {budget:.0f} ms deadline ({what})")


_CURRENT: ContextVar[RequestContext | None] = ContextVar("ortpack_request", default=None)


def current() -> RequestContext | None:
    return _CURRENT.get()


def bind(context: RequestContext) -> Token[RequestContext | None]:
    """Make `context` the current request's (in this task and the threads it starts) until `unbind`."""
    return _CURRENT.set(context)


def unbind(token: Token[RequestContext | None]) -> None:
    _CURRENT.reset(token)
