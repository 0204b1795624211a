"""What the batcher (serving/batcher.py) keeps in line and hands to its workers: a client request
whose rows fill in as batches finish, its items waiting in one bucket, a cut batch on its way to a
worker, and what one model call did (for metrics)."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ortpack.serving.context import RequestContext


@dataclass(slots=True, eq=False)
class Request:
    """One client request: its rows fill in as batches finish; the future resolves when all did."""

    future: asyncio.Future[list[Any]]
    rows: list[Any]
    remaining: int  # rows not yet computed
    queued: int  # items still waiting in the queue
    enqueued: float
    turn: float  # when it last started waiting for a batch: arrival, then each batch's end
    slices: dict[Hashable, Slice] = field(default_factory=dict)  # its queued items, by bucket
    running: int = 0  # its batches on the workers now
    context: RequestContext | None = None
    deadline: float = math.inf  # on the batcher's clock
    fast: bool = False  # the fast lane: its work is predicted to take at most `fast_s`
    cost_left: float = 0.0  # the cost of its items not yet cut into a batch (admission's units)
    shape: Callable[[Any], Any] | None = None  # each row -> what the request answers, on the worker thread
    # Wall-clock timings (time.perf_counter, whatever the batcher's scheduling clock): queued, the
    # start of its first model call, the end of its last one, model seconds summed over its batches.
    queued_at: float = 0.0
    first_start: float = 0.0
    last_end: float = 0.0
    model_s: float = 0.0

    def key(self) -> tuple[bool, float, float]:
        """Scheduling order: the fast lane first, then the earliest deadline, then arrival."""
        return (not self.fast, self.deadline, self.enqueued)


@dataclass(slots=True, eq=False)
class Slice:
    """One request's items waiting in one bucket: (index in the request, payload, cost)."""

    request: Request
    items: deque[tuple[int, Any, float]]


# One item of a cut batch: its request, its index there, its payload.
Entry = tuple[Request, int, Any]


@dataclass(slots=True, eq=False)
class Job:
    """One cut batch on its way to a worker thread."""

    bucket: Hashable
    batch: list[Entry]
    dispatched: float  # on the batcher's clock
    lone: bool  # run on the lone backend (every core), not a one-thread worker session
    cost: float = 0.0  # the batch's cost (padded: the longest item x the items)
    began: float = 0.0  # when a worker started it (time.perf_counter; set on the worker thread)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one model call did, for metrics: bucket, size, seconds, padded and real tokens (0 for
    payloads that are not token ids, such as images)."""

    bucket: Hashable
    size: int
    seconds: float  # the model call alone, timed on the worker thread
    queue_wait: float
    real_tokens: int
    padded_tokens: int
    threads: int = 1  # intra-op threads of the session that ran it (more for a lone batch)
