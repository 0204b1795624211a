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
  running batch's decode steps: the chunk is sized so that its predicted time stays within
  `prefill_share` of a decode step's (default 1.0: a long prompt at most doubles the others'
  time between tokens), from times measured as the loop runs; with nothing decoding, a chunk is
  `max_chunk` tokens.

Pure bookkeeping (numbers in, decisions out): the loop (engine.py) holds the sequences and runs
the model, and tests drive this with made-up times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


class Scheduler:
    """The cache held by admitted requests, and the step's decisions."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.reserved = 0  # tokens held by admitted requests
        self.waiting = 0
        self.decode_s = Ewma()  # one decode step of the running batch
        self.prefill_token_s = Ewma()  # one prompt token in a prefill chunk

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

    def chunk(self, remaining: int, decoding: bool) -> int:
        """How many of a prompt's `remaining` tokens to prefill this step."""
        limits = self.limits
        size = limits.max_chunk
        per_token, step = self.prefill_token_s.value, self.decode_s.value
        if decoding and per_token and step:
            size = int(limits.prefill_share * step / per_token)
        return max(1, min(remaining, max(limits.min_chunk, min(size, limits.max_chunk))))

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one step per waiting request, at least 1."""
        step = self.decode_s.value or 0.05
        return max(1, math.ceil(step * (self.waiting + 1)))
