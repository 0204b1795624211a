"""The dynamic batcher with a fake backend: one answer per item, order, buckets, limits, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from serving.batcher import Batcher, BatchStats
from serving.errors import DeadlineExceededError, InferenceError, NotReadyError, OverloadedError


class RecordingBackend:
    """Returns [payload, len(batch)] rows; records each batch; can be slowed or made to fail."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()

    def run(self, payloads: Sequence[Any]) -> np.ndarray:
        self.gate.wait(5)
        with self.lock:
            self.batches.append(list(payloads))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_on is not None and self.fail_on in payloads:
            raise RuntimeError("boom")
        return np.array([[p, len(payloads)] for p in payloads], dtype=np.float64)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with(batcher: Batcher, body: Any) -> Any:
    batcher.start()
    try:
        return await body
    finally:
        await batcher.stop()


def test_results_come_back_in_order_and_batches_respect_buckets_and_size() -> None:
    backend = RecordingBackend(delay_s=0.002)
    batcher = Batcher(backend, max_batch_size=4, max_queue_size=1000, workers=2)

    async def body() -> list[list[np.ndarray]]:
        requests = [
            batcher.submit(list(range(r * 10, r * 10 + 7)), [p % 3 for p in range(r * 10, r * 10 + 7)], 5.0)
            for r in range(20)
        ]
        return await asyncio.gather(*requests)

    answers = run(_with(batcher, body()))
    for r, rows in enumerate(answers):
        assert [int(row[0]) for row in rows] == list(range(r * 10, r * 10 + 7))
    assert sum(len(b) for b in backend.batches) == 140  # each item ran exactly once
    for batch in backend.batches:
        assert len(batch) <= 4
        assert len({p % 3 for p in batch}) == 1  # one bucket per batch
    assert max(len(b) for b in backend.batches) == 4  # under load, batches fill


def test_a_lone_request_is_dispatched_at_once() -> None:
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=32, max_queue_size=100, workers=1)
    rows = run(_with(batcher, batcher.submit([7], [0], 5.0)))
    assert backend.batches == [[7]] and int(rows[0][1]) == 1


def test_batch_delay_lets_a_batch_fill() -> None:
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=8, max_queue_size=100, workers=1, max_batch_delay_ms=50)

    async def body() -> None:
        first = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await asyncio.sleep(0.005)
        await asyncio.gather(first, batcher.submit([2, 3], [0, 0], 5.0))

    run(_with(batcher, body()))
    assert backend.batches == [[1, 2, 3]]


def test_full_queue_refuses_whole_requests_with_retry_after() -> None:
    backend = RecordingBackend()
    backend.gate.clear()  # the model is stuck: the queue fills
    batcher = Batcher(backend, max_batch_size=1, max_queue_size=3, workers=1)

    async def body() -> tuple[Any, Any]:
        held = asyncio.ensure_future(batcher.submit([1, 2, 3], [0, 0, 0], 5.0))
        await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError) as refused:
            await batcher.submit([4, 5, 6], [0, 0, 0], 5.0)
        backend.gate.set()
        return await held, refused.value

    rows, error = run(_with(batcher, body()))
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    assert int(error.headers["Retry-After"]) >= 1
    assert all(4 not in b for b in backend.batches)  # nothing of the refused request ran


def test_backend_failure_answers_every_item_of_the_batch() -> None:
    backend = RecordingBackend(fail_on=13)
    batcher = Batcher(backend, max_batch_size=64, max_queue_size=100, workers=1)

    async def body() -> list[Any]:
        return await asyncio.gather(
            batcher.submit([11, 12, 13], [0, 0, 0], 5.0), batcher.submit([21], [1], 5.0), return_exceptions=True
        )

    failed, ok = run(_with(batcher, body()))
    assert isinstance(failed, InferenceError) and "RuntimeError: boom" in failed.message
    assert int(ok[0][0]) == 21  # another bucket's batch is unaffected


def test_items_past_their_deadline_are_not_run() -> None:
    backend = RecordingBackend(delay_s=0.2)
    batcher = Batcher(backend, max_batch_size=1, max_queue_size=100, workers=1)

    async def body() -> list[Any]:
        first = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await asyncio.sleep(0.01)
        late = batcher.submit([2], [0], 0.05)
        return await asyncio.gather(first, late, return_exceptions=True)

    done, late = run(_with(batcher, body()))
    assert int(done[0][0]) == 1
    assert isinstance(late, DeadlineExceededError)
    assert [2] not in backend.batches


def test_stop_drains_what_was_accepted_then_refuses() -> None:
    backend = RecordingBackend(delay_s=0.01)
    batcher = Batcher(backend, max_batch_size=2, max_queue_size=100, workers=1)
    stats: list[BatchStats] = []
    batcher.on_batch = stats.append

    async def body() -> tuple[list[Any], Any]:
        batcher.start()
        accepted = [asyncio.ensure_future(batcher.submit([i], [0], 5.0)) for i in range(10)]
        await asyncio.sleep(0)
        await batcher.stop(drain=True)
        with pytest.raises(NotReadyError):
            await batcher.submit([99], [0], 5.0)
        return await asyncio.gather(*accepted), None

    answers, _ = run(body())
    assert sorted(int(a[0][0]) for a in answers) == list(range(10))
    assert sum(s.size for s in stats) == 10


def test_batches_stop_at_their_cost_budget() -> None:
    """Images: a batch is capped by pixels as well as by items, and always holds at least one."""
    backend = RecordingBackend()
    backend.gate.clear()
    batcher = Batcher(
        backend, max_batch_size=32, max_queue_size=100, workers=1, item_cost=lambda p: p, max_batch_cost=10
    )

    async def body() -> None:
        held = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await asyncio.sleep(0.01)
        rest = asyncio.ensure_future(batcher.submit([4, 4, 4, 12, 3], [0] * 5, 5.0))
        await asyncio.sleep(0.01)
        backend.gate.set()
        await asyncio.gather(held, rest)

    run(_with(batcher, body()))
    assert backend.batches == [[1], [4, 4], [4], [12], [3]]
