"""What runs at each step of the generation loop: who is admitted, who joins the running batch,
and how much of a waiting prompt is prefilled.

- **Admission by the key/value cache.** A request holds, from arrival until it ends, the cache it
  can grow to: its prompt plus its `max_tokens`, in tokens (TGI's rule). One that would take the
  total past `capacity` is refused at once (429 with Retry-After); one that alone needs more than
  the whole capacity, or more than the context, is refused as invalid. Capacity counts each token
  twice: during a step the past and the present cache (the past with the new token appended) are
  both alive. A queue past `max_waiting` refuses too.
- **Continuous batching.** Sequences join the running batch between steps, when their prefill
  ends, and leave it as they finish; the running batch is padded to its longest row, so a row
  joins only while `(rows + 1) x longest row's reach` stays within capacity (it otherwise waits,
  first come first served), and at most `max_running` run at once.
- **Chunked prefill.** One waiting prompt at a time is prefilled, a chunk per step, between the
  running batch's decode steps: the chunk is sized so that its predicted time (a fixed part and a
  part per token, fitted to the calls measured as the loop runs) stays within `prefill_share` of
  a decode step's (default 1.0: a long prompt at most doubles the others' time between tokens);
  with nothing decoding, a chunk is `max_chunk` tokens.

Pure bookkeeping (numbers in, decisions out): the loop (engine.py) holds the sequences and runs
the model, and tests drive this with made-up times.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ortpack.kernel.errors import InputError, InputTooLargeError


class CacheFullError(RuntimeError):
    """The cache this request needs is held by the requests in progress (a server answers 429)."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What the loop may hold and how it schedules: cache capacity in tokens (each counted with its
    past/present copy), the context a sequence may reach, the most running and waiting sequences,
    the prefill chunk's bounds and its share of a decode step's time."""

    capacity: int
    context: int
    max_running: int = 32
    max_waiting: int = 256
    max_chunk: int = 512
    min_chunk: int = 16
    prefill_share: float = 1.0

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.context < 2 or self.max_running < 1 or self.min_chunk < 1:
            raise ValueError(f"generation limits out of range: {self}")


class Ewma:
    """An exponentially weighted mean of a measured time (None until the first measurement)."""

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self.value: float | None = None

    def observe(self, value: float) -> None:
        self.value = value if self.value is None else (1 - self.weight) * self.value + self.weight * value


class PrefillCost:
    """A prefill call's time as `fixed + per_token x tokens + per_past x past tokens`, fitted by
    least squares over the last calls. A call pays a part that does not shrink with it (the head's
    logits for the last position, every layer's overheads), so a per-token average measured on
    small chunks overestimates large ones, and chunks sized by it shrank until they were all
    overhead (measured served: 6.5 calls for each 40-token prompt, prefill 46 % of the model's
    time); and a chunk of a long prompt attends over, and copies, the cache before it, so it costs
    more as the prompt goes on (a 2,000-token prompt's last chunks ran past their time)."""

    def __init__(self, window: int = 64) -> None:
        self.samples: deque[tuple[float, float, float]] = deque(maxlen=window)

    def observe(self, tokens: int, seconds: float, past: int = 0) -> None:
        self.samples.append((float(tokens), float(past), seconds))

    def fit(self) -> tuple[float, float, float] | None:
        """(fixed, per token, per past token) in seconds; None before any call."""
        if not self.samples:
            return None
        data = np.array(self.samples)
        n, past, t = data[:, 0], data[:, 1], data[:, 2]
        columns = [np.ones_like(n), n] + ([past] if np.ptp(past) > 0 else [])
        if np.ptp(n) == 0:  # one size seen: no fixed part to tell apart
            return 0.0, float((t / n).mean()), 0.0
        coef = np.linalg.lstsq(np.stack(columns, axis=1), t, rcond=None)[0]
        fixed, per_token = float(coef[0]), float(coef[1])
        per_past = float(coef[2]) if len(coef) > 2 else 0.0
        if per_token <= 0:
            return 0.0, float((t / n).mean()), 0.0
        return max(0.0, fixed), per_token, max(0.0, per_past)


class Scheduler:
    """The cache held by admitted requests, and the step's decisions."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.reserved = 0  # tokens held by admitted requests
        self.waiting = 0
        self.decode_s = Ewma()  # one decode step of the running batch
        self.prefill = PrefillCost()  # a prefill call, by its tokens and the cache before them

    def admit(self, need: int) -> None:
        """Hold `need` tokens (prompt + max_tokens) for a new request, or refuse it."""
        limits = self.limits
        if need > limits.context:
            raise InputTooLargeError(
                f"the prompt and max_tokens need {need} tokens; this model's context is {limits.context}"
            )
        if need > limits.capacity:
            raise InputError(
                f"the prompt and max_tokens need {need} tokens of cache; this server holds at most "
                f"{limits.capacity} (lower max_tokens, or give the server more memory)"
            )
        if self.waiting >= limits.max_waiting:
            raise CacheFullError(f"overloaded: {self.waiting} requests are waiting; retry later")
        if self.reserved + need > limits.capacity:
            raise CacheFullError(
                f"overloaded: the key/value cache is held by the requests in progress ({self.reserved} of "
                f"{limits.capacity} tokens; this one needs {need}); retry later"
            )
        self.reserved += need
        self.waiting += 1

    def started(self) -> None:
        """An admitted request left the queue for its prefill."""
        self.waiting -= 1

    def release(self, need: int, *, waiting: bool = False) -> None:
        """A request ended (`waiting`: before its prefill began)."""
        self.reserved -= need
        if waiting:
            self.waiting -= 1

    def can_join(self, rows: int, reach: int, joining_reach: int) -> bool:
        """Whether a row that may grow to `joining_reach` tokens joins a batch of `rows` rows whose
        longest may grow to `reach`, within capacity and `max_running`."""
        if rows + 1 > self.limits.max_running:
            return False
        return (rows + 1) * max(reach, joining_reach) <= self.limits.capacity or rows == 0

    def chunk(self, remaining: int, decoding: bool, past: int = 0) -> int:
        """How many of a prompt's `remaining` tokens to prefill this step after the `past` already
        prefilled: what fits in `prefill_share` of a decode step's time (the fitted cost), at
        least `min_chunk`; the whole rest when it is at most half a chunk more (a second call
        would pay the fixed part again for a few tokens)."""
        limits = self.limits
        size = limits.max_chunk
        cost, step = self.prefill.fit(), self.decode_s.value
        if decoding and cost is not None and step:
            fixed, per_token, per_past = cost
            size = int((limits.prefill_share * step - fixed - per_past * past) / per_token + 1e-6)
        size = max(limits.min_chunk, min(size, limits.max_chunk))
        return remaining if remaining <= size * 3 // 2 else size

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one step per waiting request, at least 1."""
        step = self.decode_s.value or 0.05
        return max(1, math.ceil(step * (self.waiting + 1)))
