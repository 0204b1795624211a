"""The HTTP/1.1 connection: uvicorn's httptools protocol with the limits it lacks.

uvicorn (0.54) bounds none of these for httptools: `h11_max_incomplete_event_size` applies to
h11 only, httptools accumulates a header of any size (64 MB was accepted) and any number of
headers (2,000 were), an idle connection that never sends a byte is never closed, a client that
trickles its headers or body keeps the connection forever, and `limit_concurrency` answers in
plain text. This subclass adds, per connection:

- `max_header_bytes`: the request line and headers are fed to the parser in pieces and counted;
  past the limit the answer is 431 and the connection closes (at most `max_header_bytes` + 1
  bytes of a head are ever buffered);
- `max_headers`: more header fields get 431;
- `max_connections`: a connection beyond it is answered 503 and closed at once (the client may
  see the reset instead if it was still sending);
- timeouts: a new connection must start a request within `timeout_keep_alive_s` (as an idle
  keep-alive one already must), a started head must be complete within `header_timeout_s`, and a
  body within `body_timeout_s` of its headers: else 408 (or a silent close when nothing of a
  request arrived) and the connection closes;
- protocol errors (a bad request line, conflicting Content-Length, a NUL in a header) answer 400
  in the server's one JSON error shape instead of uvicorn's plain text;
- a client that goes away after sending its request cancels the request's task, so the batcher
  drops its queued items (the route answers 499 to nobody, counted in metrics);
- each request's scope carries `ortpack.arrival` (when its first byte was read): the deadline
  counts from there;
- while the server drains (after SIGTERM), answers carry `Connection: close`, so clients move to
  other replicas;
- an answer sent before its request's body arrived (an early 429 or 413, decided before reading)
  reaches the client: the rest of the body is read and discarded, at most `max_discard_bytes`
  within `body_timeout_s` of the answer (uvicorn's keep-alive timer, which counts idle time
  between requests, no longer closes the connection in the middle of that body), then the
  connection serves its next request;
- "lingering close", as nginx and Apache do it: where the server closes a connection the client
  may still be writing to (a refusal that closes, the discard bounds exceeded, `Connection: close`
  on an early answer), it sends the answer and a FIN (`write_eof`), then reads and drops what
  still arrives until the client closes, `LINGER_IDLE_S` pass without a byte, `linger_s` pass in
  all or `max_discard_bytes` more arrive. Closing at once would make the kernel answer the client's
  next bytes with a reset, and a client still writing usually never reads the answer waiting in
  its buffer.

What stays outside the JSON shape: a connection refused by the kernel (backlog full), a reset
seen by a client that went on writing past the lingering bounds, and answers written before any
request was read (none: the 503 for too many connections is JSON).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from ortpack.serving.http import BODY_INTO

log = logging.getLogger("ortpack.serve")

# lingering close: the longest pause in what a client still sends before the connection closes
LINGER_IDLE_S = 2.0
_KINDS = {400: "invalid_request", 408: "request_timeout", 431: "headers_too_large", 503: "overloaded"}
_REASONS = {400: "bad_request", 408: "slow_client", 431: "headers_too_large", 503: "too_many_connections"}


@dataclass(kw_only=True)
class ConnectionLimits:
    """The limits every connection enforces, and the server state it reads (draining)."""

    max_connections: int
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_s: float
    max_discard_bytes: int = 4 << 20  # body bytes read and dropped after an early answer (the server's max body)
    linger_s: float = 10.0  # the longest a lingering close reads and drops what still arrives
    draining: bool = False
    on_reject: Any = None  # callable(reason: str), e.g. a metrics counter


def error_bytes(status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """A complete HTTP/1.1 answer in the server's JSON error shape, closing the connection."""
    body = orjson.dumps({"error": {"message": message, "type": _KINDS.get(status, "error"), "code": status}})
    head = [STATUS_LINE[status], b"content-type: application/json\r\n", b"connection: close\r\n"]
    head += [name + b": " + value + b"\r\n" for name, value in extra or []]
    head.append(b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return b"".join(head) + body


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to `limits`."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests or reading a request line and headers
        self._head_bytes = 0
        self._header_count = 0
        self._refusal: tuple[int, str] | None = None
        self._closed_by_us = False
        self._timer: asyncio.TimerHandle | None = None
        self._arrival = 0.0
        self._body_done = True  # the current request's body has all arrived (or there is no request)
        self._discarded = 0  # bytes dropped after an early answer or while lingering
        self._linger_until: float | None = None  # lingering close under way: when it ends at the latest

    # ---------------------------------------------------------------- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                f"too many connections (limit {self.limits.max_connections}); retry later",
                [(b"retry-after", b"1")],
            )
            return
        self._arm(self.limits.keep_alive_s, self._on_idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not cycle.more_body:
            # The whole request arrived and is being computed: nobody will read the answer.
            cycle.scope["ortpack.disconnected"] = True  # type: ignore[typeddict-unknown-key]
            task = getattr(cycle, "ortpack_task", None)
            if task is not None and not task.done():
                task.cancel()
        super().connection_lost(exc)

    def _unsupported_upgrade_warning(self) -> None:
        log.debug("ignoring an Upgrade request header (this server speaks HTTP/1.1 only)")

    # ---------------------------------------------------------------- reading

    def data_received(self, data: bytes) -> None:
        if self._linger_until is not None:
            self._drop_lingering(len(data))
            return
        if self._closed_by_us or self.parser is None:
            return
        self._unset_keepalive_if_required()
        limit = self.limits.max_header_bytes
        rest: bytes | memoryview = data
        while rest:
            if self._in_head:
                room = limit - self._head_bytes + 1  # one byte past the limit tells it was exceeded
                if len(rest) <= room:
                    piece, rest = rest, b""
                else:  # views: a read of a head and 256 KB of body is not copied to be split
                    view = memoryview(rest)
                    piece, rest = view[:room], view[room:]
                self._head_bytes += len(piece)
            else:
                piece, rest = rest, b""
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError as exc:
                if self._refusal is not None:
                    self._refuse(*self._refusal)
                else:
                    self._refuse(400, f"malformed HTTP request: {str(exc) or type(exc).__name__}")
                return
            if self._in_head and self._head_bytes > limit:
                self._refuse(431, f"request line and headers exceed the {limit}-byte limit")
                return

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arrival = time.perf_counter()
        self._header_count = 0
        self._arm(self.limits.header_timeout_s, self._on_head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._refusal = (431, f"more than {self.limits.max_headers} header fields")
            raise ValueError(self._refusal[1])  # stops the parser; data_received answers
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._body_done = False
        self._discarded = 0
        self._disarm()
        self.scope["ortpack.arrival"] = self._arrival  # type: ignore[typeddict-unknown-key]
        super().on_headers_complete()
        if self.cycle is not None:  # uvicorn closes after an answer with Connection: close: linger instead
            self.cycle.transport = _CloseAfterAnswer(self.transport, self, self.cycle)  # type: ignore[assignment]
            self.scope[BODY_INTO] = functools.partial(self.read_body_into, self.cycle)  # type: ignore[literal-required]
        if self.limits.draining and self.cycle is not None:
            self.cycle.keep_alive = False  # answer with Connection: close: clients move elsewhere
        self._arm(self.limits.body_timeout_s, self._on_body_timeout)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:  # answered early: the rest is dropped, within bounds
            self._discarded += len(body)
            if self._discarded > self.limits.max_discard_bytes:
                self._linger_close()
            return
        sink: _Sink | None = getattr(cycle, "ortpack_sink", None)
        if sink is not None:  # the route's buffer is waiting: straight in, no pause, no wake-up
            sink.write(body)
            return
        super().on_body(body)

    async def read_body_into(self, cycle: RequestResponseCycle, buffer: bytearray | Any) -> int:
        """`cycle`'s body written straight into `buffer` (sized to its Content-Length, which the
        parser holds the body to, and already admitted by the route): what arrived is copied in,
        then each piece as it arrives, without uvicorn's pause at 64 KB buffered and its copy per
        `receive()`; the route wakes once, when the body is complete. The bytes written; a client
        that goes (or times out) before the end raises ClientDisconnect."""
        if cycle.waiting_for_100_continue and not self.transport.is_closing():  # as uvicorn's receive() does
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        sink = _Sink(buffer)
        sink.write(cycle.body)
        cycle.body = bytearray()
        cycle.ortpack_sink = sink  # type: ignore[attr-defined]
        try:
            while cycle.more_body and not cycle.disconnected and not cycle.response_complete:
                self.flow.resume_reading()
                await cycle.message_event.wait()
                cycle.message_event.clear()
        finally:
            cycle.ortpack_sink = None  # type: ignore[attr-defined]
        if cycle.disconnected or cycle.response_complete:
            raise ClientDisconnect()
        if sink.overflow:
            raise ValueError("request body longer than its Content-Length")
        return sink.size

    def on_message_complete(self) -> None:
        answered = self.cycle is not None and self.cycle.response_complete
        super().on_message_complete()
        self._body_done = True
        self._disarm()
        self._in_head = True
        self._head_bytes = 0
        if answered and not self._closed_by_us:  # the dropped body ended: idle until the next request
            self._arm(self.limits.keep_alive_s, self._on_idle_timeout)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer, for idle time between requests
        if not self._body_done and not self.transport.is_closing():
            # answered before the body arrived: the rest is still coming, and the client is reading
            # nothing until it has written it. Not idle: the body timeout bounds it instead.
            self._unset_keepalive_if_required()
            self._arm(self.limits.body_timeout_s, self._on_discard_timeout)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        cycle.ortpack_task = task  # type: ignore[attr-defined]
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    # ---------------------------------------------------------------- timers

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_discard_timeout(self) -> None:
        self._timer = None
        self._linger_close()

    def _on_linger_idle(self) -> None:
        self._timer = None
        self._end_linger()

    def _on_idle_timeout(self) -> None:
        self._timer = None  # no request began since the connection opened: close it quietly
        if not self.transport.is_closing():
            self.transport.close()

    def _on_head_timeout(self) -> None:
        self._timer = None
        if self._in_head:
            self._refuse(408, f"request headers not received within {self.limits.header_timeout_s:g} s")

    def _on_body_timeout(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_started:
            return
        cycle.scope["ortpack.timed_out"] = True  # type: ignore[typeddict-unknown-key]
        self._refuse(408, f"request body not received within {self.limits.body_timeout_s:g} s")
        cycle.disconnected = True
        cycle.message_event.set()  # the route's body read sees the disconnect and stops

    # ---------------------------------------------------------------- answers

    def _refuse(self, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer `status` in the JSON error shape (unless an answer is under way) and close."""
        if self._closed_by_us:
            return
        self._closed_by_us = True
        self._disarm()
        if self.limits.on_reject is not None:
            self.limits.on_reject(_REASONS.get(status, "bad_request"))
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
                self.transport.write(error_bytes(status, message, extra))
            self._linger_close()

    # ---------------------------------------------------------------- lingering close

    def close_after_answer(self) -> None:
        """uvicorn closes the connection after an answer with `Connection: close`: at once when
        the request has all arrived, else after lingering (the client is still writing)."""
        if self._body_done:
            self.transport.close()
        else:
            self._linger_close()

    def _linger_close(self) -> None:
        """The answer is written: send a FIN and drop what still arrives, within bounds, then close."""
        self._closed_by_us = True
        self._unset_keepalive_if_required()
        self._disarm()
        if self._linger_until is not None or self.transport.is_closing():
            return
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # after what is buffered: the client reads the answer, then the end
        self._linger_until = self.loop.time() + self.limits.linger_s
        self._discarded = 0  # a body of up to twice the largest accepted one still gets its answer
        self.flow.resume_reading()
        self._arm(LINGER_IDLE_S, self._on_linger_idle)

    def _drop_lingering(self, size: int) -> None:
        self._discarded += size
        if self._discarded > self.limits.max_discard_bytes or self.loop.time() >= (self._linger_until or 0.0):
            self._end_linger()
        else:
            self._arm(LINGER_IDLE_S, self._on_linger_idle)

    def _end_linger(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


class _CloseAfterAnswer:
    """The transport uvicorn's request cycle writes to, except that its `close()` (after an answer
    with `Connection: close`) lingers while the request's body is still arriving, and that an
    answer's status line and headers go out with its body in one send: uvicorn writes them
    separately, two system calls and two wake-ups of the client per answer (a sixth of the event
    loop's time on one-sentence requests). The head is held until the body's first write, or the
    end of this turn of the event loop, whichever comes first (a HEAD answer, a streamed body)."""

    def __init__(
        self, transport: asyncio.Transport, protocol: BoundedHttpToolsProtocol, cycle: RequestResponseCycle
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._cycle = cycle
        self._head: bytes | None = None
        self._answering = False  # the head was written (or is held): what follows is the body

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))  # one send of both, no copy
        elif self._cycle.response_started and not self._answering:  # the head (a 100 Continue is not)
            self._answering = True
            self._head = data
            self._protocol.loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._protocol.close_after_answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Sink:
    """Where a request's body pieces go once its route reads it (`read_body_into`)."""

    def __init__(self, buffer: bytearray | Any) -> None:
        self.buffer = buffer
        self.size = 0
        self.overflow = False

    def write(self, piece: bytes | bytearray) -> None:
        end = self.size + len(piece)
        if end > len(self.buffer):  # the parser holds a body to its Content-Length: never expected
            self.overflow = True
            return
        self.buffer[self.size : end] = piece
        self.size = end
