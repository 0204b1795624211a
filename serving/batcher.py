"""The dynamic batcher: a bounded queue of requests, fair between them, and worker threads
running the backend.

- Items (one text, one image) wait by bucket (a text's padded-length ceiling), so a batch holds
  only items of one bucket and is padded no further than that bucket's ceiling.
- Order between requests: small requests first (a request that runs as one batch predicted to take
  at most `fast_s`, such as one sentence or one image: the fast lane), then by deadline, then by
  arrival.
  When a worker is free, the next batch is the first request's bucket, filled with that
  request's items first and then those of the next requests in order, up to `max_batch_size`
  items, `max_batch_cost` (padded tokens, pixels) and a predicted `batch_s` seconds. So a request
  admitted ahead finishes before the ones behind it start (round-robin sharing made every request
  of an overload late at once), and a single sentence sent during a 1,000-text request waits for
  one short batch (or two: below), not for the 1,000 texts. A batch also takes at
  most its worker's share of what is queued (the queued items over the workers), so the other
  workers find work too.
- One fast-lane batch is cut ahead for each worker (`ahead`): a worker that finishes a batch takes
  the next at once, without waiting for the event loop to hear of it. Only the fast lane's: a
  long batch cut ahead made a sentence arriving during a batch load wait for two long batches
  (interactive p99 128 instead of 75 ms). A batch cut ahead whose requests have all gone (their
  deadline passed, their clients left) is not run.
- Admission by predicted completion (ortpack.serving.admission): once the batch times are known
  (the warm-up measures them), a request is admitted only when, in that order, it and every
  request behind it finish before their deadlines; otherwise it is refused at once (429) with a
  `Retry-After` of the predicted time until it would fit. The check runs before the body is read
  (`precheck`, the work estimated from the body's size), so a refusal costs no reading or
  tokenizing, and again once the inputs are prepared if they are much more work than estimated.
- Scheduling is synchronous, on the event loop, at the two moments it can change anything: when
  a request is queued and when a batch finishes. A request that finds a worker idle is cut into
  a batch and handed to that worker inside `submit`, before the event loop runs anything else:
  no scheduler task to wake, no extra loop iteration: when there is nothing to be fair about,
  the fair scheduler's work is one pass over one queued request. It never waits when a worker
  is idle and work is queued, unless `max_batch_delay_ms` asks it to let a small batch fill (a
  timer re-runs it); on CPU, measured, waiting only adds latency (docs/serving.md).
- Adaptive parallelism: with a `lone_backend` (the same model in a session with more intra-op
  threads), a batch that would run alone (no other batch running, nothing left queued, no other
  request on its way in: its body being read, decoded or tokenized) runs on it
  and uses every core; under load the workers run one-thread calls side by side. Switching is a
  per-batch choice at dispatch: no request waits for it, and a request arriving while a lone
  batch runs goes to the next idle worker at once (the cores are briefly shared).
- The queue is also bounded in items: a request that would overflow it now is refused whole (429
  with Retry-After); one that could never fit (more items than the queue holds) gets 413.
- Each request has a deadline (from the request context when there is one: counted from the
  request's arrival, shortened by the client's own); its items still queued then are dropped and
  it is answered 504: the backstop when a prediction was wrong. A request
  whose caller went away (its task cancelled: the client disconnected) is dropped the same way.
- The backend runs on `workers` threads of its own, off the event loop; results come back with
  `call_soon_threadsafe`. Every request gets exactly one result or one exception, including when
  the backend raises or the batcher stops.
- A request may give a `shape` for its rows (a classifier's top k of 1,000 probabilities): the
  worker applies it after the model call, before the row goes back to the event loop. Numpy
  releases the GIL in any call over ~500 elements; on the event loop each release costs a wait
  behind the decode and model threads to take it back (an `argpartition` of 1,000 floats: 10 us
  alone, 0.1 ms of CPU and ~9 ms of waiting beside two busy threads), on a worker it costs nothing
  the loop waits for. A `shape` that raises fails its own request only.
- A model call that raises fails only the requests it has to (Triton's isolation): a batch that
  holds items of several requests is run again one request at a time on the same worker, so one
  request's bad input (or a fault that does not repeat) does not fail the others; a request whose
  own call raises is answered 500 with the error. The worker carries on with its next batch and
  `on_model_error` counts each fault ("batch": a shared batch raised and was split; "request": a
  request's own call raised).

Per request there is one future and one timer, whatever its number of items. The round trip
through this layer with a model that returns at once costs 0.12-0.16 ms of CPU per request on a
2-core AMD EPYC, mostly the two thread hand-offs (to a worker, back to the event loop), not the
scheduling (bench/serve_load.py measures it). Model calls are timed on
the worker thread; a request's queue wait, model time and hand-off reach its request context.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from ortpack.serving import context
from ortpack.serving.admission import SAFETY, BatchTimes, Planned, Verdict, admit
from ortpack.serving.errors import (
    DeadlineExceededError,
    InferenceError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    ServeError,
)
from ortpack.serving.queued import BatchStats, Entry, Job, Request, Slice

log = logging.getLogger("ortpack.serve")
# A request let in before its body was read (its work estimated from its size) is checked again
# once its inputs are prepared only when its work is more than this times the estimate
ESTIMATE_SLACK = 1.25
FAST_WINDOW_S = 5.0  # how far back the fast lane's share of the workers is measured
# Batches cut ahead per worker (the default of Batcher's `ahead`): a worker that finishes a batch
# takes the next from its queue at once instead of idling until the event loop has run `_finish`
# and cut one (behind 530 KB image bodies the loop is busy for milliseconds: 6-8 % of the CPU
# idled at c=50, 11-14 % for one-sentence requests at c=32; 5-6 % with one fast-lane batch ahead,
# bench/serve_ab.py). The price: a fast request arriving under load may wait for a short batch
# more (only the fast lane's batches are cut ahead).
AHEAD = 1


class Backend(Protocol):
    """What the batcher runs (a task's engine, ortpack.kernel.engine.Engine): one batch of payloads
    -> one result per payload, in order."""

    def run(self, payloads: Sequence[Any]) -> Sequence[Any]: ...


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
        on_model_error: Callable[[str], None] | None = None,
        cost: Callable[[Any], float] | None = None,
        padded: bool = False,
        max_batch_cost: float = math.inf,
        units: str = "",
        clock: Callable[[], float] = time.perf_counter,
        lone_backend: Backend | None = None,
        lone_threads: int = 1,
        batch_s: float = 0.05,
        fast_s: float = 0.05,
        admission: bool = True,
        ahead: int = AHEAD,
    ) -> None:
        self.backend = backend
        self.ahead = ahead
        # The same model with more intra-op threads, for a batch that runs alone (module docstring).
        self.lone_backend = lone_backend
        self.lone_threads = lone_threads
        self.max_batch_size = max_batch_size
        # What a payload costs the model (the engine's `cost`, in `units`: tokens, pixels), and what
        # a batch may cost: its longest item times its size when the engine pads a batch (text:
        # a batch of 32 texts of 256 tokens takes over a second on one core, and every request
        # waiting for a worker waits for it), else the sum (images: without it, 32 full-HD images
        # would be one float batch of GBs). A batch always holds at least one item.
        self.cost = cost
        self.padded = padded
        self.max_batch_cost = max_batch_cost
        self.units = units
        # Batch times on one worker, learnt from the warm-up and every batch (ortpack.serving.admission):
        # a batch stops at `batch_s` predicted seconds (how long the fast lane may wait for a
        # worker), a request predicted to take at most `fast_s` goes in the fast lane, and with
        # `admission` a request that cannot finish in time is refused at once.
        self.times = BatchTimes()
        self.batch_s = batch_s
        self.fast_s = fast_s
        self.admission = admission
        self.refused = 0  # requests refused by admission
        self.expected: dict[Hashable, Planned] = {}  # prechecked requests not yet submitted
        self._fast_work: deque[tuple[float, float]] = deque()  # (end, worker-seconds) of fast-lane batches
        self._running: dict[int, Job] = {}  # id(job) -> the job, from its cut to its end
        self.max_queue_size = max_queue_size
        self.workers = workers
        self.max_batch_delay = max_batch_delay_ms / 1000.0
        self.on_batch = on_batch  # callable(BatchStats), called on the event loop
        self.on_model_error = on_model_error  # callable("batch" | "request"), on the event loop
        self.clock = clock
        self.lines: dict[Hashable, dict[Request, Slice]] = {}  # per bucket, the requests queued there
        self.counts: dict[Hashable, int] = {}  # items queued per bucket
        self.active: dict[Request, None] = {}  # requests with queued items, in arrival order
        self.depth = 0  # items queued, not yet cut into a batch
        self.running = 0  # batches cut and not finished: on the worker threads or queued for one
        self.lone_batches = 0  # batches run on the lone backend
        self.items_per_second = 0.0  # smoothed throughput, for Retry-After
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None
        self._fill_timer: asyncio.TimerHandle | None = None  # max_batch_delay: when to look again
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        self._threads = [
            threading.Thread(target=self._work, name=f"ortpack-model-{i}", daemon=True) for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    async def stop(self, drain: bool = True) -> None:
        """Stop taking requests; with `drain`, finish what is queued and running first."""
        self._closed = True
        if drain:
            while self.depth or self.running:
                assert self._idle is not None
                self._idle.clear()
                await self._idle.wait()
        if self._fill_timer is not None:
            self._fill_timer.cancel()
        for request in list(self.active):
            self._fail(request, NotReadyError("the server is shutting down"))
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 10)

    # ---------------------------------------------------------------- intake

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the time to work through the queue, at least 1. Safe
        on a decode thread (a refusal of decoded pixels): it reads copies of the loop's collections."""
        if self.times.ready:
            active, expected = list(self.active), list(self.expected.values())  # each copied under the GIL
            seconds = self._estimator()
            queued = sum(seconds(r.cost_left, r.queued) for r in active) + self._running_seconds()
            queued += sum(p.seconds for p in expected)
            return max(1, math.ceil(queued / self.workers))
        if self.items_per_second <= 0:
            return 1
        return max(1, math.ceil(self.depth / self.items_per_second))

    def item_cost(self, payload: Any, bucket: Hashable) -> float:
        """What an item costs the model: its bucket's ceiling when batches are padded to it (a
        text's padded tokens), else the engine's cost of it (an image's pixels); 1 without a cost."""
        if self.cost is None:
            return 1.0
        if self.padded and isinstance(bucket, int | float):
            return float(bucket)
        return float(self.cost(payload))

    def _seconds(self, cost: float, items: float = math.inf) -> float:
        """Predicted worker-seconds for `cost` units of `items` items (when known), in batches of
        at most `batch_s` and `max_batch_cost` (but never more batches than items: a batch always
        holds one)."""
        return self._estimator()(cost, items)

    def _estimator(self) -> Callable[[float, float], float]:
        """`_seconds`, with the batch times' model read once: admission estimates every queued
        request at each arrival (48 at c=50: computed one by one, a tenth of the event loop's time)."""
        times = self.times
        a, b = times.coefficients()
        margin = times.margin()
        per_batch = min(times.cost_within(self.batch_s), self.max_batch_cost)
        split = math.isfinite(per_batch) and per_batch > 0

        def seconds(cost: float, items: float = math.inf) -> float:
            if cost <= 0:
                return 0.0
            batches = max(1, int(min(math.ceil(cost / per_batch) if split else 1, items)))
            return (a * batches + b * cost) * margin

        return seconds

    def _capacity(self, fast: bool) -> float:
        """Workers the new request's work is spread over: all of them for the fast lane; for the
        others, less what the fast lane took over the last `FAST_WINDOW_S` (it goes first)."""
        if fast:
            return float(self.workers)
        now = self.clock()
        while self._fast_work and self._fast_work[0][0] < now - FAST_WINDOW_S:
            self._fast_work.popleft()
        taken = sum(seconds for _, seconds in self._fast_work) / FAST_WINDOW_S
        return max(self.workers * 0.25, self.workers - taken)

    def _running_seconds(self) -> float:
        """Worker-seconds left of the batches cut: half of each running (on average), all of each
        cut ahead, waiting for a worker."""
        jobs = list(self._running.values())  # copied under the GIL: safe on a decode thread
        return sum(self.times.seconds(job.cost) / (2 if job.began else 1) for job in jobs)

    def precheck(self, budget_s: float, cost: float = 0.0, key: Hashable = None) -> None:
        """Refuse at once (429) a request of about `cost` (an estimate from its body's size) with
        `budget_s` left that could not finish: called before its body is read, so a flood is
        answered without reading it. An admitted one is `expected` under `key` until it is
        submitted (its body read and tokenized meanwhile) or `forget`: requests arriving together
        count each other's work, and a batch is not run alone (on every core) while others are on
        their way in (with admission off too: their work is then counted as 0 s)."""
        now = self.clock()
        judged = self.admission and self.times.ready
        seconds = self._seconds(cost) if judged else 0.0
        new = Planned(fast=seconds <= self.fast_s, deadline=now + budget_s, arrival=now, seconds=seconds, cost=cost)
        if judged:
            verdict = self._admit(new, now)
            if not verdict.admitted:
                self._refuse(verdict, budget_s, "before its body was read")
        if key is not None:
            self.expected[key] = new

    def forget(self, key: Hashable) -> None:
        """The request `key` was prechecked and will not be submitted (refused, failed, answered)."""
        self.expected.pop(key, None)

    def _admit(self, new: Planned, now: float) -> Verdict:
        """`admit` (ortpack.serving.admission) of `new` against the requests queued, cut ahead,
        running and on their way in. First a shortcut, without estimating and ordering each queued
        request (that takes 56 µs of the event loop with 48 queued, 517 µs with 498; the shortcut
        19 and 89 µs): all that work counted at its most (every queued item a batch of its own) and
        `new`'s, finished within `SAFETY` of the earliest deadline among them, means every request
        finishes in time whatever the order, so `admit` would let it in."""
        capacity = self._capacity(new.fast)
        running_s = self._running_seconds()
        active, expected = self.active, self.expected.values()
        a, b = self.times.coefficients()
        items, cost = sum(max(r.queued, 1) for r in active), sum(r.cost_left for r in active)
        queued_s = (a * items + b * cost) * self.times.margin()
        most = running_s + queued_s + sum(p.seconds for p in expected) + new.seconds
        earliest = min(new.deadline, min((r.deadline for r in active), default=math.inf))
        if most / capacity <= SAFETY * (earliest - now):
            return Verdict(True, now + most / capacity)
        return admit(new, self._planned(), now, capacity, running_s, expected)

    def _planned(self) -> list[Planned]:
        seconds = self._estimator()
        return [
            Planned(fast=r.fast, deadline=r.deadline, arrival=r.enqueued, seconds=seconds(r.cost_left, r.queued))
            for r in self.active
        ]

    def _refuse(self, verdict: Verdict, budget_s: float, where: str) -> None:
        self.refused += 1
        if log.isEnabledFor(logging.DEBUG):
            a, b = self.times.coefficients()
            log.debug(
                "refused %s: predicted finish %.2f s (%s); batch time %.4f + %.3g x cost s; %d queued, %d expected, "
                "%.2f s running",
                where,
                verdict.finish - self.clock(),
                verdict.reason,
                a,
                b,
                len(self.active),
                len(self.expected),
                self._running_seconds(),
            )
        raise OverloadedError(
            f"overloaded: this request would finish in {verdict.finish - self.clock():.1f} s, past its "
            f"{budget_s:.1f} s deadline ({verdict.reason}); retry later",
            headers={"Retry-After": str(verdict.retry_after)},
        )

    async def submit(
        self,
        payloads: Sequence[Any],
        buckets: Sequence[Hashable],
        timeout_s: float,
        shape: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """Queue one request's items and wait for all of them; results come back in order, each
        through `shape` (on the worker thread) when it is given. The deadline is `timeout_s` from
        now, or the request context's when it is sooner. Refused at once (429) when it cannot
        finish before it, or when the queue of items is full."""
        if self._closed or self._loop is None:
            raise NotReadyError("the server is shutting down")
        n = len(payloads)
        if n > self.max_queue_size:
            raise PayloadTooLargeError(
                f"a request of {n} items can never fit the queue of {self.max_queue_size} items; send fewer items"
            )
        if self.depth + n > self.max_queue_size:
            raise OverloadedError(
                f"the queue is full ({self.depth} items waiting, limit {self.max_queue_size}); retry later",
                headers={"Retry-After": str(self.retry_after())},
            )
        ctx = context.current()
        estimate = self.expected.pop(id(ctx), None) if ctx is not None else None  # from its precheck
        if ctx is not None:
            ctx.check_deadline("before queueing")
            timeout_s = min(timeout_s, ctx.remaining())
        now = self.clock()
        costs = [self.item_cost(p, b) for p, b in zip(payloads, buckets, strict=True)]
        cost = sum(costs)
        seconds = self._seconds(cost, n) if self.times.ready else 0.0
        # the fast lane: a request that runs as one short batch (before any batch was timed: one batch)
        one_batch = n <= self.max_batch_size and cost <= self.max_batch_cost
        fast = one_batch and (seconds <= self.fast_s or not self.times.ready)
        # let in before its body was read, with room held for about this much work: admitted, unless
        # it turned out much larger (its texts longer than its body's size said)
        let_in = estimate is not None and cost <= ESTIMATE_SLACK * estimate.cost
        if self.admission and self.times.ready and not let_in:
            new = Planned(fast=fast, deadline=now + timeout_s, arrival=now, seconds=seconds)
            verdict = self._admit(new, now)
            if not verdict.admitted:
                self._refuse(verdict, timeout_s, "once its inputs were prepared")
        if ctx is not None:
            ctx.items += n
        request = Request(
            future=self._loop.create_future(),
            rows=[None] * n,
            remaining=n,
            queued=n,
            enqueued=now,
            turn=now,
            context=ctx,
            queued_at=time.perf_counter(),
            deadline=now + timeout_s,
            fast=fast,
            cost_left=cost,
            shape=shape,
        )
        self._enqueue(request, payloads, buckets, costs)
        self._dispatch()  # a worker is idle: this request's first batch is on it before we await
        timer = self._loop.call_later(
            timeout_s,
            self._fail,
            request,
            DeadlineExceededError(f"no answer within the {timeout_s * 1000:.0f} ms deadline"),
        )
        try:
            rows = await request.future
            if ctx is not None:
                ctx.model_end = request.last_end
            return rows
        finally:
            timer.cancel()
            if not request.future.done():
                request.future.cancel()
            if request.queued:  # the caller went away (cancelled): its queued items are dropped
                self._release(request)

    def _enqueue(
        self, request: Request, payloads: Sequence[Any], buckets: Sequence[Hashable], costs: Sequence[float]
    ) -> None:
        """Put a request's items in line: each in its bucket's slice of the request."""
        slices = request.slices
        for index, (payload, bucket, item) in enumerate(zip(payloads, buckets, costs, strict=True)):
            piece = slices.get(bucket)
            if piece is None:
                piece = slices[bucket] = Slice(request, deque())
                self.lines.setdefault(bucket, {})[request] = piece
            piece.items.append((index, payload, item))
            self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.active[request] = None
        self.depth += len(payloads)

    def _release(self, request: Request) -> None:
        """Take a finished, failed or abandoned request's queued items out of the queue."""
        if request.queued:
            for bucket, piece in request.slices.items():
                self.lines[bucket].pop(request, None)
                self.counts[bucket] -= len(piece.items)
            self.depth -= request.queued
            request.queued = 0
        request.slices.clear()
        self.active.pop(request, None)
        if not self.depth and not self.running:
            self._signal_idle()

    # ---------------------------------------------------------------- scheduling (event loop)

    def _leader(self) -> Request | None:
        """The request the next batch is for: the first in order (`Request.key`)."""
        return min(self.active, key=Request.key, default=None)

    def _cut(self, bucket: Hashable) -> tuple[list[Entry], float]:
        """Items of `bucket`, the first request's first, then the next requests' in order, up to
        `max_batch_size` items, `max_batch_cost`, `batch_s` predicted seconds and a worker's share
        of what is queued (a batch always holds one item); and the batch's cost. The share: a
        worker that took the whole queue left the next one to finish idle until new requests
        came (one-sentence requests at c=32 left 12 % of the CPU idle; batches of one cost no
        more per item than larger ones on the CPU, docs/serving.md)."""
        line = self.lines[bucket]
        order = sorted(line.values(), key=lambda piece: piece.request.key()) if len(line) > 1 else list(line.values())
        timed = self.times.ready
        size = min(self.max_batch_size, -(-self.depth // self.workers))
        batch: list[Entry] = []
        total = widest = 0.0
        for piece in order:
            while piece.items and len(batch) < size:
                index, payload, item = piece.items[0]
                runs = float(self.cost(payload)) if self.cost is not None else 1.0  # what it costs in a batch
                cost = max(widest, runs) * (len(batch) + 1) if self.padded else total + runs
                if batch and (cost > self.max_batch_cost or (timed and self.times.seconds(cost) > self.batch_s)):
                    break
                piece.items.popleft()
                batch.append((piece.request, index, payload))
                piece.request.cost_left -= item
                widest, total = max(widest, runs), total + runs
            if not piece.items:
                del line[piece.request]
                del piece.request.slices[bucket]
            if len(batch) >= size or piece.items:
                break
        self.counts[bucket] -= len(batch)
        self.depth -= len(batch)
        taken: dict[Request, int] = {}
        for entry in batch:
            taken[entry[0]] = taken.get(entry[0], 0) + 1
        for request, count in taken.items():
            request.queued -= count
            request.running += 1
            if not request.queued:
                self.active.pop(request, None)
        return batch, (widest * len(batch) if self.padded else total)

    def _dispatch(self, delay_over: bool = False) -> None:
        """Hand batches to idle workers while work is queued: the leader's bucket each time (see
        `_leader`). Runs on the event loop when a request is queued and when a batch finishes,
        so a lone request goes to a worker inside `submit`, with no scheduler task to wake.
        `delay_over`: the fill timer fired, so batches go out as they are."""
        while self.running < self.workers * (1 + self.ahead) and self.depth:
            leader = self._leader()
            if leader is None or (self.running >= self.workers and not leader.fast):
                return  # only the fast lane's short batches are cut ahead: one arriving waits behind no long one
            bucket = next(iter(leader.slices))
            if self.max_batch_delay > 0 and not delay_over and not self._filled(bucket):
                return  # a timer looks again when the oldest item's delay is over
            alone = self.running == 0
            batch, cost = self._cut(bucket)
            # alone: nothing else running, queued or on its way in (a request whose body is being
            # read or decoded: under load at c=50, 8 % of image batches ran "alone" on both cores
            # beside the decode threads, a spinning intra-op thread taking a third of a core)
            lone = self.lone_backend is not None and alone and not self.depth and not self.expected
            self.lone_batches += lone
            self.running += 1
            job = Job(bucket, batch, self.clock(), lone, cost)
            self._running[id(job)] = job
            self._jobs.put(job)

    def _filled(self, bucket: Hashable) -> bool:
        """With max_batch_delay: is `bucket`'s batch full, or has its oldest item waited long
        enough? If not, arm a timer for when it will have."""
        if self.counts.get(bucket, 0) >= self.max_batch_size:
            return True
        oldest = min(request.enqueued for request in self.lines[bucket])
        remaining = oldest + self.max_batch_delay - self.clock()
        if remaining <= 0:
            return True
        if self._fill_timer is None and self._loop is not None:
            self._fill_timer = self._loop.call_later(remaining, self._fill_timer_due)
        return False

    def _fill_timer_due(self) -> None:
        self._fill_timer = None
        self._dispatch(delay_over=True)

    def _finish(
        self, job: Job, began: float, ended: float, rows: Any, errors: dict[Request, BaseException], fault: str
    ) -> None:
        """Back on the event loop: hand each row to its request (or its error: `errors` and
        `fault` come from `_run`), give the worker its next batch. `began` and `ended` bound the
        model call (time.perf_counter, on the worker thread)."""
        batch = job.batch
        self.running -= 1
        self._running.pop(id(job), None)
        now = self.clock()
        if batch and batch[0][0].fast:  # worker-seconds the fast lane took: not the larger requests'
            self._fast_work.append((now, (ended - began) * (self.lone_threads if job.lone else 1)))
        for request in {entry[0]: None for entry in batch}:
            request.running -= 1
            request.turn = now
            if not request.first_start or began < request.first_start:
                request.first_start = began
            request.last_end = max(request.last_end, ended)
            request.model_s += ended - began
        for request, error in errors.items():
            if not isinstance(error, ServeError):
                log.error("model call failed for a request of %d items: %r", len(request.rows), error)
                error = InferenceError(f"the model failed on this request: {type(error).__name__}: {error}")
            self._fail(request, error)
        for (request, index, _), row in zip(batch, rows, strict=True):
            if request.future.done():
                continue
            request.rows[index] = row
            request.remaining -= 1
            if request.remaining == 0:
                ctx = request.context
                if ctx is not None:
                    ctx.queue_s = request.first_start - request.queued_at
                    ctx.inference_s = request.last_end - request.first_start
                    ctx.model_s = request.model_s
                request.future.set_result(request.rows)
        if fault:  # not a batch time to learn from
            if self.on_model_error is not None and fault != GONE:
                self.on_model_error(fault)
        else:
            self._record(job, ended - began)
        self._dispatch()
        if not self.depth and not self.running:
            self._signal_idle()

    def _record(self, job: Job, seconds: float) -> None:
        batch = job.batch
        if not job.lone:  # the batch times are one worker's (a lone batch runs on every core)
            self.times.observe(job.cost, seconds)
        rate = len(batch) / max(seconds, 1e-6) * self.workers
        self.items_per_second = rate if self.items_per_second == 0 else 0.9 * self.items_per_second + 0.1 * rate
        if self.on_batch is not None:
            tokens = self.cost is not None and self.units == "tokens"
            lengths = [int(self.cost(payload)) for _, _, payload in batch] if tokens and self.cost else [0]
            real, padded = sum(lengths), max(lengths) * len(batch)  # 0 for payloads without tokens
            self.on_batch(
                BatchStats(
                    bucket=job.bucket,
                    size=len(batch),
                    seconds=seconds,
                    queue_wait=job.dispatched - min(request.enqueued for request, _, _ in batch),
                    real_tokens=real,
                    padded_tokens=padded,
                    threads=self.lone_threads if job.lone else 1,
                )
            )

    def _signal_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()

    def _fail(self, request: Request, error: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(error)
        self._release(request)

    # ---------------------------------------------------------------- workers (threads)

    def _work(self) -> None:
        assert self._loop is not None
        while (job := self._jobs.get()) is not None:
            backend = self.lone_backend if job.lone and self.lone_backend is not None else self.backend
            began = job.began = time.perf_counter()
            rows, errors, fault = _run(backend, job.batch)
            ended = time.perf_counter()
            if fault != GONE:
                _shape(job.batch, rows, errors)
            try:
                self._loop.call_soon_threadsafe(self._finish, job, began, ended, rows, errors, fault)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return


_FAILED = object()  # the row of an item whose request's model call raised (or that was not run)
GONE = "gone"  # the fault of a batch not run: every request of it was answered (a deadline) or went away


def _shape(batch: list[Entry], rows: list[Any], errors: dict[Request, BaseException]) -> None:
    """On a worker thread, after the model call: each row of a request that gave a `shape`, shaped
    in place (not those of a request already answered or failed). A shape that raises fails its
    own request (`errors`)."""
    for position, (request, _, _) in enumerate(batch):
        shape = request.shape
        if shape is None or request in errors or request.future.done() or rows[position] is _FAILED:
            continue
        try:
            rows[position] = shape(rows[position])
        except Exception as exc:  # noqa: BLE001 - handed to the loop: the request gets its answer
            errors[request] = exc


def _run(backend: Backend, batch: list[Entry]) -> tuple[list[Any], dict[Request, BaseException], str]:
    """On a worker thread: the batch's rows, one per entry, the requests whose model call raised
    (their rows are `_FAILED`) and the fault: "" (none), "request" (a batch of one request
    raised), "batch" (a batch of several raised and was run again one request at a time, so only
    the requests that fail alone are failed), or GONE: not run, every request of it was answered
    (its deadline passed) or went away while it waited, cut ahead of the worker."""
    if all(request.future.done() for request, _, _ in batch):  # read off the loop: at worst it runs
        return [_FAILED] * len(batch), {}, GONE
    try:
        return list(backend.run([payload for _, _, payload in batch])), {}, ""
    except BaseException as exc:  # noqa: BLE001 - handed to the loop: every item gets an answer
        shared = exc
    owners: dict[Request, list[int]] = {}
    for position, (request, _, _) in enumerate(batch):
        owners.setdefault(request, []).append(position)
    if len(owners) == 1:
        return [_FAILED] * len(batch), {batch[0][0]: shared}, "request"
    log.warning("a batch of %d requests raised (%r): running them one at a time", len(owners), shared)
    rows: list[Any] = [_FAILED] * len(batch)
    errors: dict[Request, BaseException] = {}
    for request, positions in owners.items():
        try:
            for position, row in zip(positions, backend.run([batch[i][2] for i in positions]), strict=True):
                rows[position] = row
        except BaseException as exc:  # noqa: BLE001
            errors[request] = exc
    return rows, errors, "batch"
