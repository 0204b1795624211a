"""Admission by predicted completion: admit a request only if it can be answered before its
deadline, given the work admitted ahead of it.

Under overload a server that admits whatever fits its queue answers nobody: measured on the
MiniLM bundle (2-core AMD EPYC), 24 clients of 64 long texts each (1.3 times what fits in the 30 s
deadline) all progressed together and all timed out (24 x 504, 0 answers). So the batcher runs
admitted requests in a fixed order (small requests first, then by deadline: see
ortpack.serving.batcher) and admits a new one only when, in that order, it and every request
behind it still finish in time. What a request costs and how fast the engine goes are measured:

- `BatchTimes`: the seconds one batch takes on one worker, `a + b * cost` (cost in the engine's
  units: padded tokens, pixels), fitted by least squares to the batches run, recent ones weighted
  more (each observation decays the others by `DECAY`); seeded by the warm-up, which runs every
  shape before ready. `a` is the call's fixed cost, `b` the cost per unit.
- `admit`: the new request's predicted finish is now plus the work ahead of it plus its own,
  spread over the workers; admitted when that is within `SAFETY` of its remaining budget and every
  request behind it still is. A refusal says how long until enough has drained (`Retry-After`).

It is a prediction: a machine also busy with other work runs slower than measured, and the
per-request deadline (504) stays as the backstop. The numbers behind the defaults are in
docs/serving.md ("Overload").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter

DECAY = 0.99  # per observed batch: the fit follows the last ~100 batches (a burst's slowdown passes)
SAFETY = 0.8  # plan to finish within this share of a request's remaining budget
MIN_BATCHES = 3  # observations before predictions are trusted (the warm-up gives more)
# The warm-up times each shape once on an idle machine; served batches run beside tokenizing, HTTP
# and each other (MiniLM, 24 batch clients beside 8 interactive ones: 1.45x the warm-up's times).
# Until SERVED_BATCHES batches were served, predictions are scaled up by up to WARMUP_MARGIN.
WARMUP_MARGIN = 1.5
SERVED_BATCHES = 100


class BatchTimes:
    """Seconds a batch takes on one worker thread, as `a + b * cost`, fitted online."""

    def __init__(self) -> None:
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.count = 0
        self.served = 0  # observations of served batches (not the warm-up's)
        self._lock = threading.Lock()  # the warm-up observes from several threads
        # (count, (a, b)): the fit at `count` observations; admission asks once per queued request
        self._fit: tuple[int, tuple[float, float]] = (-1, (0.0, 0.0))

    def observe(self, cost: float, seconds: float, *, warm_up: bool = False) -> None:
        """One batch of `cost` units took `seconds` on one worker (`warm_up`: before ready)."""
        if cost <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        with self._lock:
            self.served += not warm_up
            self._n = self._n * DECAY + 1.0
            self._sx = self._sx * DECAY + cost
            self._sy = self._sy * DECAY + seconds
            self._sxx = self._sxx * DECAY + cost * cost
            self._sxy = self._sxy * DECAY + cost * seconds
            self.count += 1

    @property
    def ready(self) -> bool:
        return self.count >= MIN_BATCHES

    def coefficients(self) -> tuple[float, float]:
        """(a, b): seconds per call and per unit of cost, both >= 0."""
        count = self.count  # read first: an observation while fitting makes the next call fit again
        if self._fit[0] != count:
            self._fit = (count, self._coefficients())
        return self._fit[1]

    def _coefficients(self) -> tuple[float, float]:
        if self._n <= 0:
            return 0.0, 0.0
        mean_x, mean_y = self._sx / self._n, self._sy / self._n
        var = self._sxx / self._n - mean_x * mean_x
        if var <= 1e-9 * max(1.0, mean_x * mean_x):  # one cost seen: all of it per unit
            return 0.0, mean_y / max(mean_x, 1e-9)
        b = (self._sxy / self._n - mean_x * mean_y) / var
        a = mean_y - b * mean_x
        if b <= 0:  # noise: no evidence that cost matters; the mean per unit instead
            return 0.0, mean_y / max(mean_x, 1e-9)
        if a < 0:  # through the origin
            return 0.0, (self._sxy / self._n) / max(self._sxx / self._n, 1e-9)
        return a, b

    def seconds(self, cost: float, batches: int = 1) -> float:
        """Worker-seconds for `cost` units in `batches` calls (with the warm-up's margin while few
        served batches were seen)."""
        a, b = self.coefficients()
        return (a * batches + b * cost) * self.margin()

    def margin(self) -> float:
        """What predictions are multiplied by: `WARMUP_MARGIN` before any served batch, 1 after
        `SERVED_BATCHES` of them."""
        return 1 + (WARMUP_MARGIN - 1) * max(0.0, 1 - self.served / SERVED_BATCHES)

    def cost_within(self, seconds: float) -> float:
        """The most cost one call can take within `seconds` (inf before any observation)."""
        a, b = self.coefficients()
        return math.inf if b <= 0 else max(0.0, (seconds - a) / b)  # no margin: batches stay as large


@dataclass(slots=True)
class Planned:
    """A request as admission sees it: its order (fast lane first, then deadline, then arrival),
    its deadline and the worker-seconds of its work not yet done."""

    fast: bool
    deadline: float
    arrival: float
    seconds: float
    cost: float = 0.0  # the work in the engine's units (padded tokens, pixels)

    def order(self) -> tuple[bool, float, float]:
        return (not self.fast, self.deadline, self.arrival)


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    finish: float  # predicted, on the batcher's clock
    retry_after: int = 0  # seconds, for a refusal
    reason: str = ""


def admit(
    new: Planned,
    admitted: Iterable[Planned],
    now: float,
    workers: float,
    running_s: float = 0.0,
    expected: Iterable[Planned] = (),
) -> Verdict:
    """Whether `new` and every admitted request that would run after it finish within `SAFETY` of
    their remaining budgets, the work shared by `workers` (`running_s`: worker-seconds left of the
    batches running now). `expected`: requests let in whose work is still being prepared (their
    bodies read and tokenized), estimated: counted when they run ahead of `new`, not protected
    from it. Requests ahead of `new` are not delayed by it, so they are not checked."""
    mine = new.order()
    queued = sorted(((p.order(), p) for p in admitted), key=itemgetter(0))  # each order made once
    ahead = running_s + sum(p.seconds for order, p in queued if order < mine)
    ahead += sum(p.seconds for p in expected if p.order() < mine)
    finish = now + (ahead + new.seconds) / workers
    allowed = now + SAFETY * (new.deadline - now)
    if finish > allowed:
        late = finish - allowed
        return Verdict(False, finish, max(1, math.ceil(late)), "it cannot finish before its deadline")
    done = ahead + new.seconds
    for order, planned in queued:  # those behind `new`: each must still make it, if it would have without it
        if order < mine:
            continue
        done += planned.seconds
        limit = SAFETY * (planned.deadline - now)
        if done / workers > limit >= (done - new.seconds) / workers:
            return Verdict(False, finish, max(1, math.ceil(new.seconds / workers)), "admitted work would be late")
    return Verdict(True, finish)
