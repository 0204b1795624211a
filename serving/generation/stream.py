"""From the generation loop's thread to a request's coroutine, and out as server-sent events.

The loop calls a request's sink on its own thread with each `Event`; `EventQueue` hands it to the
request's asyncio queue (`call_soon_threadsafe`), so the loop never waits for a slow client: a
client that reads slowly holds its events in its queue, at most its max_tokens of them. `events`
yields them until the last (the one with a finish reason), and cancels the request when the
consumer stops early: a client that disconnects mid-stream frees its place at the loop's next
step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from ortpack.kernel.generation.engine import Event, Handle

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


class EventQueue:
    """One request's events, put by the loop's thread and taken on the event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        """The sink: called on the generation loop's thread."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    async def events(self, handle: Handle) -> AsyncIterator[Event]:
        """Every event up to and including the last; the request is cancelled if the consumer
        leaves before it (its client went away, the task was cancelled)."""
        finished = False
        try:
            while not finished:
                event = await self.queue.get()
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                handle.cancel()


async def collect(streams: list[tuple[EventQueue, Handle]]) -> list[list[Event]]:
    """Every event of several requests (the choices of one answer), each to its end."""

    async def one(queue: EventQueue, handle: Handle) -> list[Event]:
        return [event async for event in queue.events(handle)]

    try:
        return list(await asyncio.gather(*(one(q, h) for q, h in streams)))
    finally:
        for _, handle in streams:
            handle.cancel()  # a no-op for the finished ones; the rest end at the next step


def sse(payload: Any) -> bytes:
    """One server-sent event holding `payload` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def merged(
    streams: list[tuple[EventQueue, Handle]], chunk: Callable[[int, Event], list[Any]]
) -> AsyncIterator[bytes]:
    """The events of several requests as server-sent events in the order they arrive (`chunk`
    turns choice i's event into the payloads to send), each request cancelled if the stream is
    left early."""
    queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    async def pump(index: int, source: EventQueue, handle: Handle) -> None:
        async for event in source.events(handle):
            await queue.put((index, event))

    tasks = [asyncio.create_task(pump(i, q, h)) for i, (q, h) in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, event = await queue.get()
            left -= event.finish_reason is not None
            for payload in chunk(index, event):
                yield sse(payload)
    finally:
        for task in tasks:
            task.cancel()
        for _, handle in streams:
            handle.cancel()
