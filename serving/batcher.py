"""The dynamic batcher: a bounded queue per bucket, and worker threads running the backend.

- Items (one text, one image) are queued by bucket (a text's padded-length ceiling), so a batch
  holds only items of one bucket and is padded no further than that bucket's ceiling.
- A batch is cut when a worker is free: from the bucket whose oldest item has waited longest,
  up to `max_batch_size` items. The scheduler never waits when a worker is idle and work is
  queued, unless `max_batch_delay_ms` asks it to let a small batch fill; on CPU, measured, waiting
  only adds latency (see README).
- The queue is bounded in items: a request that would overflow it is refused whole (429).
- Each request has a deadline; its items still queued then are dropped and it is answered 504.
- The backend runs on `workers` threads of its own, off the event loop; results come back with
  `call_soon_threadsafe`. Every request gets exactly one result or one exception, including when
  the backend raises or the batcher stops.

Per request there is one future and one timer, whatever its number of items: this layer costs
well under 0.1 ms of CPU per request (bench/serve_load.py measures it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.backend import Backend
from serving.errors import DeadlineExceededError, InferenceError, NotReadyError, OverloadedError, ServeError

log = logging.getLogger("ortpack.serve")


@dataclass(slots=True, eq=False)
class Request:
    """One client request: its rows fill in as batches finish; the future resolves when all did."""

    future: asyncio.Future[list[np.ndarray]]
    rows: list[Any]
    remaining: int


@dataclass(slots=True, eq=False)
class Item:
    payload: Any
    bucket: Hashable
    request: Request
    index: int
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one model call did, for metrics: bucket, size, seconds, padded and real tokens."""

    bucket: Hashable
    size: int
    seconds: float
    queue_wait: float
    real_tokens: int
    padded_tokens: int


class Batcher:
    def __init__(
        self,
        backend: Backend,
        *,
        max_batch_size: int,
        max_queue_size: int,
        workers: int,
        max_batch_delay_ms: float = 0.0,
        on_batch: Any = None,
        item_cost: Any = None,
        max_batch_cost: float = math.inf,
    ) -> None:
        self.backend = backend
        # A batch also stops at `max_batch_cost` (images: pixels), whatever its size; it always
        # holds at least one item. Without it, 32 full-HD images would be one float batch of GBs.
        self.item_cost = item_cost
        self.max_batch_cost = max_batch_cost
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.workers = workers
        self.max_batch_delay = max_batch_delay_ms / 1000.0
        self.on_batch = on_batch  # callable(BatchStats), called on the event loop
        self.queues: dict[Hashable, deque[Item]] = {}
        self.depth = 0  # items queued, not yet cut into a batch
        self.running = 0  # batches on the worker threads
        self.items_per_second = 0.0  # smoothed throughput, for Retry-After
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._free: asyncio.Semaphore | None = None
        self._idle: asyncio.Event | None = None
        self._jobs: queue.SimpleQueue[tuple[Hashable, list[Item], float] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._scheduler: asyncio.Task[None] | None = None
        self._closed = False

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._free = asyncio.Semaphore(self.workers)
        self._idle = asyncio.Event()
        self._idle.set()
        self._threads = [
            threading.Thread(target=self._work, name=f"ortpack-model-{i}", daemon=True) for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()
        self._scheduler = self._loop.create_task(self._schedule(), name="ortpack-batcher")

    async def stop(self, drain: bool = True) -> None:
        """Stop taking requests; with `drain`, finish what is queued and running first."""
        self._closed = True
        if drain:
            while self.depth or self.running:
                assert self._idle is not None
                self._idle.clear()
                await self._idle.wait()
        if self._scheduler is not None:
            self._scheduler.cancel()
        for items in self.queues.values():
            for item in items:
                self._fail(item.request, NotReadyError("the server is shutting down"))
            items.clear()
        self.depth = 0
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 10)

    # ---------------------------------------------------------------- intake

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the time to work through the queue, at least 1."""
        if self.items_per_second <= 0:
            return 1
        return max(1, math.ceil(self.depth / self.items_per_second))

    async def submit(self, payloads: Sequence[Any], buckets: Sequence[Hashable], timeout_s: float) -> list[np.ndarray]:
        """Queue one request's items and wait for all of them; results come back in order."""
        if self._closed or self._loop is None or self._wakeup is None:
            raise NotReadyError("the server is shutting down")
        n = len(payloads)
        if self.depth + n > self.max_queue_size:
            raise OverloadedError(
                f"the queue is full ({self.depth} items waiting, limit {self.max_queue_size}); retry later",
                headers={"Retry-After": str(self.retry_after())},
            )
        request = Request(future=self._loop.create_future(), rows=[None] * n, remaining=n)
        now = time.perf_counter()
        for index, (payload, bucket) in enumerate(zip(payloads, buckets, strict=True)):
            items = self.queues.get(bucket)
            if items is None:
                items = self.queues[bucket] = deque()
            items.append(Item(payload, bucket, request, index, now))
        self.depth += n
        self._wakeup.set()
        timer = self._loop.call_later(
            timeout_s,
            self._fail,
            request,
            DeadlineExceededError(f"no answer within the {timeout_s * 1000:.0f} ms deadline"),
        )
        try:
            return await request.future
        finally:
            timer.cancel()
            if not request.future.done():  # the client went away: its queued items are skipped
                request.future.cancel()

    # ---------------------------------------------------------------- scheduling (event loop)

    def _oldest_bucket(self) -> Hashable | None:
        best, best_time = None, math.inf
        for bucket, items in self.queues.items():
            while items and items[0].request.future.done():  # answered already (failed, expired)
                items.popleft()
                self.depth -= 1
            if items and items[0].enqueued < best_time:
                best, best_time = bucket, items[0].enqueued
        return best

    def _cut(self, bucket: Hashable) -> list[Item]:
        items = self.queues[bucket]
        batch: list[Item] = []
        cost = 0.0
        while items and len(batch) < self.max_batch_size:
            if self.item_cost is not None and batch:
                cost_next = cost + self.item_cost(items[0].payload)
                if cost_next > self.max_batch_cost:
                    break
            item = items.popleft()
            self.depth -= 1
            if not item.request.future.done():
                batch.append(item)
                if self.item_cost is not None:
                    cost += self.item_cost(item.payload)
        return batch

    async def _schedule(self) -> None:
        assert self._wakeup is not None and self._free is not None
        while True:
            await self._free.acquire()
            bucket = self._oldest_bucket()
            while bucket is None:
                self._signal_idle()
                self._wakeup.clear()
                await self._wakeup.wait()
                bucket = self._oldest_bucket()
            if self.max_batch_delay > 0:
                await self._let_fill(bucket)
            batch = self._cut(bucket)
            if not batch:
                self._free.release()
                continue
            self.running += 1
            self._jobs.put((bucket, batch, time.perf_counter()))

    async def _let_fill(self, bucket: Hashable) -> None:
        """Wait (at most max_batch_delay after the oldest item arrived) for a fuller batch."""
        items = self.queues[bucket]
        while items and len(items) < self.max_batch_size:
            remaining = items[0].enqueued + self.max_batch_delay - time.perf_counter()
            if remaining <= 0:
                return
            await asyncio.sleep(min(remaining, 0.001))

    def _finish(
        self, bucket: Hashable, batch: list[Item], started: float, rows: Any, error: BaseException | None
    ) -> None:
        """Back on the event loop: hand each row to its request, free the worker."""
        assert self._free is not None
        self.running -= 1
        self._free.release()
        if error is not None:
            if not isinstance(error, ServeError):
                log.error("model call failed for a batch of %d: %r", len(batch), error)
                error = InferenceError(f"the model failed on this batch: {type(error).__name__}: {error}")
            for item in batch:
                self._fail(item.request, error)
        else:
            for item, row in zip(batch, rows, strict=True):
                request = item.request
                if request.future.done():
                    continue
                request.rows[item.index] = row
                request.remaining -= 1
                if request.remaining == 0:
                    request.future.set_result(request.rows)
            self._record(bucket, batch, started)
        if not self.depth and not self.running:
            self._signal_idle()

    def _record(self, bucket: Hashable, batch: list[Item], started: float) -> None:
        seconds = time.perf_counter() - started
        rate = len(batch) / max(seconds, 1e-6) * self.workers
        self.items_per_second = rate if self.items_per_second == 0 else 0.9 * self.items_per_second + 0.1 * rate
        if self.on_batch is not None:
            sized = hasattr(batch[0].payload, "__len__")
            real = sum(len(i.payload) for i in batch) if sized else len(batch)
            width = max(len(i.payload) for i in batch) if sized else 1
            self.on_batch(
                BatchStats(
                    bucket=bucket,
                    size=len(batch),
                    seconds=seconds,
                    queue_wait=started - min(i.enqueued for i in batch),
                    real_tokens=real,
                    padded_tokens=width * len(batch),
                )
            )

    def _signal_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()

    @staticmethod
    def _fail(request: Request, error: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(error)

    # ---------------------------------------------------------------- workers (threads)

    def _work(self) -> None:
        assert self._loop is not None
        while (job := self._jobs.get()) is not None:
            bucket, batch, started = job
            rows, error = None, None
            try:
                rows = self.backend.run([item.payload for item in batch])
            except BaseException as exc:  # noqa: BLE001 - handed to the loop: every item gets an answer
                error = exc
            try:
                self._loop.call_soon_threadsafe(self._finish, bucket, batch, started, rows, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return
