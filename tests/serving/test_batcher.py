"""The dynamic batcher with a fake backend: one answer per item, order, buckets, limits, failures,
fairness between requests, deadlines and callers that go away. Tests of the order in which queued
work is cut hold the worker with `ahead=0` (no batch cut ahead of a worker), so what they submit
stays queued."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from ortpack.kernel.tokenizer import TokenPair, payload_tokens
from ortpack.serving.batcher import Batcher, BatchStats
from ortpack.serving.context import RequestContext, bind, unbind
from ortpack.serving.errors import (
    DeadlineExceededError,
    InferenceError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
)


class RecordingBackend:
    """Returns [payload, len(batch)] rows; records each batch; can be slowed or made to fail."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.stuck = False

    def run(self, payloads: Sequence[Any]) -> np.ndarray:
        if not self.gate.wait(5):  # the test forgot to open the gate: fail it, do not carry on
            self.stuck = True
            raise RuntimeError("the test's gate stayed closed for 5 s")
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
        assert not getattr(batcher.backend, "stuck", False), "a gated backend call timed out"


async def _until(condition: Any) -> None:
    """Let the event loop run until `condition()` holds (bounded: at most 5 s)."""
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached in 5 s")


async def _hold_worker(batcher: Batcher, backend: RecordingBackend, item: int = 1) -> asyncio.Future[Any]:
    """Close the backend's gate and submit one `item`: the worker holds it, running, until the gate
    opens. Returns the item's request."""
    backend.gate.clear()
    first = asyncio.ensure_future(batcher.submit([item], [0], 5.0))
    await _until(lambda: batcher.running == 1)
    return first


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


def test_a_batch_is_cut_ahead_so_a_worker_never_waits_for_the_event_loop() -> None:
    """With one batch cut ahead per worker (the default), a worker that finishes a batch runs the
    next one while the event loop is busy elsewhere (blocked here); what is submitted after that
    stays queued, in order, for the loop to cut."""
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=1, max_queue_size=100, workers=1)

    async def body() -> list[Any]:
        first = await _hold_worker(batcher, backend)
        second = asyncio.ensure_future(batcher.submit([2], [0], 5.0))
        await _until(lambda: batcher.running == 2)  # cut ahead: on its way to the worker
        third = asyncio.ensure_future(batcher.submit([3], [0], 5.0))
        await _until(lambda: batcher.depth == 1)  # the worker's one batch ahead is taken: queued
        backend.gate.set()
        for _ in range(500):  # the event loop is blocked: only the worker can make progress
            if len(backend.batches) == 2:
                break
            time.sleep(0.01)
        assert backend.batches == [[1], [2]]
        return await asyncio.gather(first, second, third)

    answers = run(_with(batcher, body()))
    assert [int(rows[0][0]) for rows in answers] == [1, 2, 3] and backend.batches == [[1], [2], [3]]


def test_only_the_fast_lanes_batches_are_cut_ahead() -> None:
    """A request of several batches (outside the fast lane) stays queued while the worker is busy:
    a sentence arriving after it must not wait behind two long batches."""
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=2, max_queue_size=100, workers=1)

    async def body() -> list[Any]:
        first = await _hold_worker(batcher, backend)
        large = asyncio.ensure_future(batcher.submit([2, 3, 4, 5], [0] * 4, 5.0))
        await _until(lambda: batcher.depth == 4)
        for _ in range(20):
            await asyncio.sleep(0)
        assert batcher.running == 1 and batcher.depth == 4  # nothing cut ahead
        sentence = asyncio.ensure_future(batcher.submit([6], [0], 5.0))
        await _until(lambda: batcher.running == 2)  # the fast one is
        backend.gate.set()
        return await asyncio.gather(first, large, sentence)

    run(_with(batcher, body()))
    assert backend.batches[0] == [1] and backend.batches[1][0] == 6  # the sentence first (then a filler)


def test_a_worker_takes_its_share_of_the_queue_not_all_of_it() -> None:
    """A batch takes at most the queued items divided among the workers: one worker taking the
    whole queue left the others idle until new requests came."""
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=64, max_queue_size=100, workers=2, ahead=0)

    async def body() -> None:
        first = await _hold_worker(batcher, backend, 0)
        many = asyncio.ensure_future(batcher.submit(list(range(1, 21)), [0] * 20, 5.0))
        await _until(lambda: batcher.running == 2)
        assert batcher.depth == 10  # the idle worker took half of the 20, not all of them
        backend.gate.set()
        await asyncio.gather(first, many)

    run(_with(batcher, body()))
    assert max(len(b) for b in backend.batches) == 10 and sum(len(b) for b in backend.batches) == 21


def test_batch_delay_lets_a_batch_fill() -> None:
    """With a delay, the scheduler holds a lone item until the batch is full (no clock involved:
    the delay is far longer than the test, and the batch is cut when the third item arrives)."""
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=3, max_queue_size=100, workers=1, max_batch_delay_ms=60_000)

    async def body() -> None:
        first = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        for _ in range(20):
            await asyncio.sleep(0)
        assert backend.batches == [] and not first.done()  # held, waiting for a fuller batch
        await asyncio.gather(first, batcher.submit([2, 3], [0, 0], 5.0))

    run(_with(batcher, body()))
    assert backend.batches == [[1, 2, 3]]


def test_batch_delay_expires_on_the_batchers_clock() -> None:
    """A lone item goes out once max_batch_delay has passed on the batcher's clock (driven here)."""
    now = [0.0]
    backend = RecordingBackend()
    batcher = Batcher(
        backend, max_batch_size=8, max_queue_size=100, workers=1, max_batch_delay_ms=50, clock=lambda: now[0]
    )

    async def body() -> None:
        first = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        for _ in range(20):
            await asyncio.sleep(0)
        assert backend.batches == []
        now[0] = 0.051  # the delay is over: the next wake-up sends the batch as it is
        await batcher.submit([2], [1], 5.0)
        await first

    run(_with(batcher, body()))
    assert [1] in backend.batches


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
    faults: list[str] = []
    batcher = Batcher(backend, max_batch_size=64, max_queue_size=100, workers=1, on_model_error=faults.append)

    async def body() -> list[Any]:
        return await asyncio.gather(
            batcher.submit([11, 12, 13], [0, 0, 0], 5.0), batcher.submit([21], [1], 5.0), return_exceptions=True
        )

    failed, ok = run(_with(batcher, body()))
    assert isinstance(failed, InferenceError) and "RuntimeError: boom" in failed.message
    assert int(ok[0][0]) == 21  # another bucket's batch is unaffected
    assert faults == ["request"]


def test_a_failing_request_does_not_fail_the_others_in_its_batch() -> None:
    """Three requests share one batch; one of them holds the input the model raises on. The
    batch is run again one request at a time: the two others get their rows, the third its 500,
    the fault is counted once, and the worker goes on to the next batch."""
    backend = RecordingBackend(fail_on=13)
    faults: list[str] = []
    batcher = Batcher(backend, max_batch_size=64, max_queue_size=100, workers=1, ahead=0, on_model_error=faults.append)

    async def body() -> list[Any]:
        first = await _hold_worker(batcher, backend)  # so the three requests queue up and share a batch
        shared = [
            asyncio.ensure_future(batcher.submit(items, [0] * len(items), 5.0)) for items in ([11, 12], [13], [14])
        ]
        await _until(lambda: batcher.depth == 4)
        backend.gate.set()
        answers = await asyncio.gather(first, *shared, return_exceptions=True)
        answers.append(await batcher.submit([15], [0], 5.0))  # the worker still serves
        return answers

    first, ok, failed, other, later = run(_with(batcher, body()))
    assert [int(r[0]) for r in ok] == [11, 12] and int(other[0][0]) == 14 and int(later[0][0]) == 15
    assert isinstance(failed, InferenceError) and "RuntimeError: boom" in failed.message
    assert backend.batches[1] == [11, 12, 13, 14]  # they did share a batch, then ran one request at a time
    assert backend.batches[2:5] == [[11, 12], [13], [14]]
    assert faults == ["batch"] and int(first[0][0]) == 1


def test_rows_are_shaped_on_the_worker_and_a_shape_that_raises_fails_only_its_request() -> None:
    """Three requests share one batch, two with a `shape`: their rows come back shaped, shaped on
    the model thread (not the event loop), the third's as the model gave them. A shape that
    raises answers its own request with the error; the others in the batch are answered."""
    backend = RecordingBackend()
    faults: list[str] = []
    batcher = Batcher(backend, max_batch_size=64, max_queue_size=100, workers=1, ahead=0, on_model_error=faults.append)
    threads: list[str] = []

    def doubled(row: np.ndarray) -> int:
        threads.append(threading.current_thread().name)
        return int(row[0]) * 2

    def broken(row: np.ndarray) -> int:
        raise ValueError(f"cannot shape {int(row[0])}")

    async def body() -> list[Any]:
        first = await _hold_worker(batcher, backend)
        shared = [
            asyncio.ensure_future(batcher.submit([21, 22], [0, 0], 5.0, shape=doubled)),
            asyncio.ensure_future(batcher.submit([23], [0], 5.0, shape=broken)),
            asyncio.ensure_future(batcher.submit([24], [0], 5.0)),
        ]
        await _until(lambda: batcher.depth == 4)
        backend.gate.set()
        return await asyncio.gather(first, *shared, return_exceptions=True)

    _, shaped, failed, plain = run(_with(batcher, body()))
    assert shaped == [42, 44]
    assert threads and all(name.startswith("ortpack-model") for name in threads)
    assert isinstance(failed, InferenceError) and "ValueError: cannot shape 23" in failed.message
    assert int(plain[0][0]) == 24 and int(plain[0][1]) == 4  # the row as the model gave it, batch of 4
    assert backend.batches[1] == [21, 22, 23, 24] and faults == []  # one batch, run once: no model fault


def test_a_fault_that_does_not_repeat_fails_nobody() -> None:
    """A model call that raises once (a transient fault): every request of the batch is answered
    from the one-request-at-a-time runs, and the fault is still counted."""

    class FlakyBackend(RecordingBackend):
        def run(self, payloads: Sequence[Any]) -> np.ndarray:
            rows = super().run(payloads)
            if len(self.batches) == 2:  # the shared batch
                raise MemoryError("transient")
            return rows

    backend = FlakyBackend()
    faults: list[str] = []
    batcher = Batcher(backend, max_batch_size=64, max_queue_size=100, workers=1, ahead=0, on_model_error=faults.append)

    async def body() -> list[Any]:
        first = await _hold_worker(batcher, backend)
        shared = [asyncio.ensure_future(batcher.submit([n], [0], 5.0)) for n in (2, 3)]
        await _until(lambda: batcher.depth == 2)
        backend.gate.set()
        return await asyncio.gather(first, *shared)

    answers = run(_with(batcher, body()))
    assert [int(rows[0][0]) for rows in answers] == [1, 2, 3] and faults == ["batch"]


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
    batcher = Batcher(backend, max_batch_size=32, max_queue_size=100, workers=1, cost=lambda p: p, max_batch_cost=10)

    async def body() -> None:
        held = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await asyncio.sleep(0.01)
        rest = asyncio.ensure_future(batcher.submit([4, 4, 4, 12, 3], [0] * 5, 5.0))
        await asyncio.sleep(0.01)
        backend.gate.set()
        await asyncio.gather(held, rest)

    run(_with(batcher, body()))
    assert backend.batches == [[1], [4, 4], [4], [12], [3]]


def test_a_request_that_can_never_fit_is_413_not_429() -> None:
    batcher = Batcher(RecordingBackend(), max_batch_size=8, max_queue_size=4, workers=1)

    async def body() -> None:
        with pytest.raises(PayloadTooLargeError, match="can never fit the queue of 4 items"):
            await batcher.submit([1] * 5, [0] * 5, 5.0)

    run(_with(batcher, body()))


def test_small_requests_go_ahead_of_a_big_one_queued_before_them() -> None:
    """The fast lane: a 300-item request runs one batch at a time, and a one-item request sent
    while it runs is in the next batch, in another bucket as in the same one (where the big
    request's items fill the rest of the batch)."""
    backend = RecordingBackend()
    backend.gate.clear()
    batcher = Batcher(backend, max_batch_size=32, max_queue_size=1000, workers=1, ahead=0)

    async def body() -> None:
        big = asyncio.ensure_future(batcher.submit(list(range(1000, 1300)), [256] * 300, 5.0))
        await _until(lambda: batcher.running == 1)  # its first batch is on the worker
        other_bucket = asyncio.ensure_future(batcher.submit([1], [16], 5.0))
        same_bucket = asyncio.ensure_future(batcher.submit([2], [256], 5.0))
        await asyncio.sleep(0.01)
        backend.gate.set()
        await asyncio.gather(big, other_bucket, same_bucket)

    run(_with(batcher, body()))
    first, second, third = backend.batches[:3]
    assert first == list(range(1000, 1032))
    assert second == [1] and third[0] == 2 and len(third) == 32  # the probes go first; then the big one again
    assert sum(len(b) for b in backend.batches) == 302


def test_a_batch_takes_the_first_requests_items_first() -> None:
    """Within a bucket, a batch takes the first request's items (the fast lane's: it fits one
    batch), then the next request's: the first finishes, nobody is shared into lateness."""
    backend = RecordingBackend()
    backend.gate.clear()
    batcher = Batcher(backend, max_batch_size=4, max_queue_size=100, workers=1, ahead=0)

    async def body() -> None:
        held = asyncio.ensure_future(batcher.submit([0], [0], 5.0))
        await _until(lambda: batcher.running == 1)
        a = asyncio.ensure_future(batcher.submit([10, 11, 12, 13, 14], [0] * 5, 5.0))
        b = asyncio.ensure_future(batcher.submit([20, 21], [0] * 2, 5.0))
        await asyncio.sleep(0.01)
        backend.gate.set()
        await asyncio.gather(held, a, b)

    run(_with(batcher, body()))
    assert backend.batches[1] == [20, 21, 10, 11] and backend.batches[2] == [12, 13, 14]


def test_a_caller_that_goes_away_frees_its_queued_items() -> None:
    backend = RecordingBackend()
    backend.gate.clear()
    batcher = Batcher(backend, max_batch_size=1, max_queue_size=10, workers=1, ahead=0)

    async def body() -> None:
        held = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await _until(lambda: batcher.running == 1)
        gone = asyncio.ensure_future(batcher.submit([2, 3, 4, 5], [0] * 4, 5.0))
        await _until(lambda: batcher.depth == 4)
        gone.cancel()  # what the connection layer does when the client disconnects
        await asyncio.sleep(0)
        assert batcher.depth == 0  # the queue has room again at once
        backend.gate.set()
        await held

    run(_with(batcher, body()))
    assert all(p not in (2, 3, 4, 5) for b in backend.batches for p in b)


def test_an_expired_request_frees_its_place_in_the_queue() -> None:
    backend = RecordingBackend()
    backend.gate.clear()
    batcher = Batcher(backend, max_batch_size=1, max_queue_size=3, workers=1)

    async def body() -> Any:
        held = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await _until(lambda: batcher.running == 1)
        with pytest.raises(DeadlineExceededError):
            await batcher.submit([2, 3, 4], [0] * 3, 0.01)
        assert batcher.depth == 0
        later = asyncio.ensure_future(batcher.submit([5, 6, 7], [0] * 3, 5.0))  # fits: not a 429
        await asyncio.sleep(0)
        backend.gate.set()
        return await asyncio.gather(held, later)

    _, later = run(_with(batcher, body()))
    assert [int(r[0]) for r in later] == [5, 6, 7]


def test_the_deadline_counts_from_the_requests_arrival() -> None:
    """A request context whose deadline already passed (its body and tokenizing took the time) is
    refused before queueing; one with time left is given only that time."""
    backend = RecordingBackend(delay_s=0.2)
    batcher = Batcher(backend, max_batch_size=1, max_queue_size=10, workers=1)

    async def body() -> None:
        now = time.perf_counter()
        token = bind(RequestContext(request_id="a", arrival=now - 1.0, deadline=now - 0.5))
        try:
            with pytest.raises(DeadlineExceededError, match="before queueing"):
                await batcher.submit([1], [0], 30.0)
        finally:
            unbind(token)
        first = asyncio.ensure_future(batcher.submit([2], [0], 30.0))
        await asyncio.sleep(0.01)
        token = bind(RequestContext(request_id="b", arrival=now, deadline=time.perf_counter() + 0.05))
        try:
            with pytest.raises(DeadlineExceededError):
                await batcher.submit([3], [0], 30.0)  # 30 s asked, 50 ms left of its own deadline
        finally:
            unbind(token)
        await first

    run(_with(batcher, body()))
    assert [1] not in backend.batches and [3] not in backend.batches


def test_timings_reach_the_request_context() -> None:
    backend = RecordingBackend(delay_s=0.01)
    batcher = Batcher(backend, max_batch_size=2, max_queue_size=10, workers=1)
    ctx = RequestContext(request_id="t", arrival=time.perf_counter(), deadline=time.perf_counter() + 5)

    async def body() -> None:
        token = bind(ctx)
        try:
            await batcher.submit([1, 2, 3], [0, 0, 0], 5.0)
        finally:
            unbind(token)

    run(_with(batcher, body()))
    assert ctx.items == 3 and ctx.queue_s is not None and ctx.inference_s is not None
    assert ctx.inference_s >= 0.02  # two model calls of at least 10 ms


def test_only_text_batches_count_tokens() -> None:
    """The engine says what a payload costs and in which units: an image's pixels must not feed the
    token and padding metrics (nor its len(), which is its height)."""
    assert payload_tokens(np.arange(7, dtype=np.int64)) == 7
    assert payload_tokens(TokenPair(np.arange(4), np.zeros(4, dtype=np.int64))) == 4
    stats: list[BatchStats] = []
    backend = RecordingBackend()
    images = [np.zeros((48, 64, 3), dtype=np.uint8), np.zeros((48, 64, 3), dtype=np.uint8)]

    class ImageBackend:
        def run(self, payloads: Sequence[Any]) -> np.ndarray:
            backend.batches.append([p.shape for p in payloads])
            return np.zeros((len(payloads), 2))

    batcher = Batcher(
        ImageBackend(),
        max_batch_size=4,
        max_queue_size=10,
        workers=1,
        on_batch=stats.append,
        cost=lambda p: p.shape[0] * p.shape[1],
        units="pixels",
    )
    run(_with(batcher, batcher.submit(images, [(48, 64)] * 2, 5.0)))
    assert stats and all(s.real_tokens == 0 and s.padded_tokens == 0 for s in stats)
    texts = Batcher(
        RecordingBackend(),
        max_batch_size=4,
        max_queue_size=10,
        workers=1,
        on_batch=stats.append,
        cost=payload_tokens,
        padded=True,
        units="tokens",
    )
    ids = [np.arange(3, dtype=np.int64), np.arange(5, dtype=np.int64)]

    class TextBackend:
        def run(self, payloads: Sequence[Any]) -> np.ndarray:
            return np.zeros((len(payloads), 2))

    texts.backend = TextBackend()
    stats.clear()
    run(_with(texts, texts.submit(ids, [8, 8], 5.0)))
    assert sum(s.real_tokens for s in stats) == 8 and max(s.padded_tokens for s in stats) >= 8

    from ortpack.serving.metrics import Metrics

    metrics = Metrics()
    metrics.observe_batch(
        BatchStats(bucket=(48, 64), size=2, seconds=0.01, queue_wait=0, real_tokens=0, padded_tokens=0)
    )
    assert "ortpack_padding_ratio_count 0.0" in metrics.render().decode()


def test_text_batches_stop_at_their_token_budget() -> None:
    """Padded tokens (texts x the longest) per model call are capped; a batch always holds one text."""
    seen: list[list[int]] = []

    class Lengths:
        def run(self, payloads: Sequence[Any]) -> np.ndarray:
            seen.append([len(p) for p in payloads])
            return np.zeros((len(payloads), 2))

    gate = threading.Event()

    class Gated(Lengths):
        def run(self, payloads: Sequence[Any]) -> np.ndarray:
            assert gate.wait(5)
            return super().run(payloads)

    batcher = Batcher(
        Gated(), max_batch_size=32, max_queue_size=100, workers=1, cost=payload_tokens, padded=True, max_batch_cost=25
    )
    ids = [np.arange(n, dtype=np.int64) for n in (10, 10, 10, 12, 30, 5)]

    async def body() -> None:
        held = asyncio.ensure_future(batcher.submit([np.arange(3, dtype=np.int64)], [8], 5.0))
        await _until(lambda: batcher.running == 1)
        rest = asyncio.ensure_future(batcher.submit(ids, [32] * 6, 5.0))
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(held, rest)

    run(_with(batcher, body()))
    assert seen == [[3], [10, 10], [10, 12], [30], [5]]


def test_a_lone_request_reaches_a_worker_inside_submit() -> None:
    """No scheduler task to wake: a request that finds a worker idle is cut and handed to it
    before the event loop runs anything else (the low-load path costs no extra loop turn)."""
    backend = RecordingBackend()
    backend.gate.clear()
    batcher = Batcher(backend, max_batch_size=32, max_queue_size=100, workers=2)

    async def body() -> None:
        lone = asyncio.ensure_future(batcher.submit([7], [0], 5.0))
        await asyncio.sleep(0)  # one turn of the loop: the submit ran up to its await
        assert batcher.running == 1 and batcher.depth == 0
        backend.gate.set()
        await lone

    run(_with(batcher, body()))
    assert backend.batches == [[7]]


def test_a_batch_that_runs_alone_uses_the_lone_backend_and_load_uses_the_workers() -> None:
    """Adaptive parallelism: with nothing else running or queued a batch goes to the lone
    backend (every core); a request arriving meanwhile goes to the idle worker at once, on the
    one-thread backend; every request gets its rows."""
    workers, lone = RecordingBackend(), RecordingBackend()
    lone.gate.clear()
    stats: list[BatchStats] = []
    batcher = Batcher(
        workers,
        max_batch_size=32,
        max_queue_size=100,
        workers=2,
        lone_backend=lone,
        lone_threads=2,
        on_batch=stats.append,
    )

    async def body() -> list[Any]:
        first = asyncio.ensure_future(batcher.submit([1], [0], 5.0))
        await asyncio.sleep(0)
        assert batcher.running == 1 and batcher.lone_batches == 1  # on the lone backend, held at its gate
        answer = await batcher.submit([2], [0], 5.0)  # answered while the lone batch is still held
        assert not first.done()
        lone.gate.set()
        return [await first, answer]

    first, second = run(_with(batcher, body()))
    assert int(first[0][0]) == 1 and int(second[0][0]) == 2
    assert lone.batches == [[1]] and workers.batches == [[2]]
    assert sorted(s.threads for s in stats) == [1, 2] and batcher.lone_batches == 1


def test_a_request_that_leaves_work_queued_does_not_run_alone() -> None:
    """A batch is lone only when nothing is left queued: a request of two buckets runs both
    batches side by side on the one-thread workers."""
    workers, lone = RecordingBackend(), RecordingBackend()
    batcher = Batcher(workers, max_batch_size=32, max_queue_size=100, workers=2, lone_backend=lone)
    rows = run(_with(batcher, batcher.submit([1, 2], [0, 1], 5.0)))
    assert [int(r[0]) for r in rows] == [1, 2]
    assert lone.batches == [] and sorted(workers.batches) == [[1], [2]]


def test_a_batch_does_not_run_alone_while_another_request_is_on_its_way_in() -> None:
    """A request whose body is still being read or decoded (prechecked, not yet submitted) will
    want a worker: the batch running meanwhile stays on the one-thread workers instead of taking
    every core. Once that request is forgotten (answered elsewhere, refused), batches run alone
    again. Admission is off here (no batch timed yet): the arrival is still counted."""
    workers, lone = RecordingBackend(), RecordingBackend()
    batcher = Batcher(workers, max_batch_size=32, max_queue_size=100, workers=2, lone_backend=lone)

    async def body() -> None:
        batcher.precheck(5.0, cost=1.0, key="reading")
        await batcher.submit([1], [0], 5.0)
        batcher.forget("reading")
        await batcher.submit([2], [0], 5.0)

    run(_with(batcher, body()))
    assert workers.batches == [[1]] and lone.batches == [[2]]
    assert batcher.lone_batches == 1


def test_admissions_shortcut_never_admits_what_the_full_check_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission first tries a shortcut (all queued work at its most, against the earliest
    deadline) before estimating and ordering each queued request. Over queues of mixed sizes and
    deadlines, and new requests from tiny to too large, it decides exactly as the full check, and
    the shortcut is what decides the easy cases."""
    import random

    import ortpack.serving.batcher as batcher_module
    from ortpack.serving.admission import Planned, admit

    full_checks = 0

    def counted(*args: Any) -> Any:
        nonlocal full_checks
        full_checks += 1
        return admit(*args)

    monkeypatch.setattr(batcher_module, "admit", counted)
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch_size=4, max_queue_size=10_000, workers=2, cost=float, ahead=0)
    for cost in (1.0, 2.0, 4.0, 8.0, 3.0, 5.0):
        batcher.times.observe(cost, 0.002 + 0.001 * cost, warm_up=True)
    rng = random.Random(7)
    decided = shortcuts = 0

    async def body() -> None:
        nonlocal decided, shortcuts
        held = await _hold_worker(batcher, backend)
        held2 = asyncio.ensure_future(batcher.submit([1.0], [0], 5.0))
        waiting = []
        for _ in range(40):  # queued: 1-12 items of cost 1-8, deadlines 0.3-5 s
            n = rng.randint(1, 12)
            items = [float(rng.randint(1, 8)) for _ in range(n)]
            waiting.append(asyncio.ensure_future(batcher.submit(items, [0] * n, rng.uniform(0.3, 5.0))))
            await asyncio.sleep(0)
            for _ in range(25):
                fast = rng.random() < 0.3
                new = Planned(
                    fast=fast,
                    deadline=batcher.clock() + rng.uniform(0.05, 6.0),
                    arrival=batcher.clock(),
                    seconds=rng.choice((0.001, 0.01, 0.05, 0.2, 1.0)),
                )
                now = batcher.clock()
                full = admit(
                    new,
                    batcher._planned(),
                    now,
                    batcher._capacity(fast),
                    batcher._running_seconds(),
                    batcher.expected.values(),
                )
                checks = full_checks
                quick = batcher._admit(new, now)
                decided += 1
                shortcuts += full_checks == checks
                if full.admitted != quick.admitted:
                    raise AssertionError(f"{new}: full {full}, shortcut {quick}")
        backend.gate.set()
        await asyncio.gather(held, held2, *waiting, return_exceptions=True)

    run(_with(batcher, body()))
    assert decided == 1000 and 100 < shortcuts < 1000, shortcuts  # both paths were taken
