"""Latency measurement shared by the torch baseline, the variant benchmark and `bench/`, and the
load each measurement ran under.

A shared machine drifts: another job's threads take cores from the one being timed. So every
measurement records the load before and after it (`LoadRecord`: the 1-minute load average, the
tasks runnable besides this process, the cores this process may use) in the same flat dict as its
latency (`load_*` keys, floats, so they travel wherever latency stats go: benchmark.json, the
manifest, KFP metrics), and is flagged `contaminated` above one other runnable task per core.
Two engines compared with each other are measured interleaved (`measure_interleaved`), so load
that comes and goes hits both alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from ortpack.kernel.hardware import this_machine

Timer = Callable[[], float]  # makes one timed call, returns its milliseconds

LOAD_PREFIX = "load_"
# Above this many runnable tasks per core besides the measuring process, a timing is contaminated:
# each of its threads shares a core with a stranger.
CONTAMINATED_ABOVE = 1.0
# /proc/loadavg's runnable count is one instant: read a few, spread over ~40 ms, keep the median.
_LOAD_READS, _LOAD_READ_GAP_S = 5, 0.01
# Between two engines' calls: an engine's thread pool spins for a while after a call (ORT's, OpenMP's)
# and would take cores from the other engine's next call; neither pays this in production.
SETTLE_S = 0.002
# ORTPACK_TIMING=quick: one warm-up call and three timed rounds per engine, no time budget. The test
# suite sets it (tests/conftest.py): it checks that every timing is taken, recorded and reported,
# never its value, and seconds of timed calls per shape per build were a third of its run time.
QUICK_TIMING_ENV, QUICK_WARMUP, QUICK_ITERS = "ORTPACK_TIMING", 1, 3


def quick_timing() -> bool:
    return os.environ.get(QUICK_TIMING_ENV, "") == "quick"


# ---------------------------------------------------------------------------- load


def _own_running_threads() -> int:
    """Threads of this process in state R (they are part of the measurement, not load)."""
    running = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended while we looked
        running += state == "R"
    return running


def _others_runnable() -> int | None:
    """Tasks runnable on this machine now, this process's own excluded (None: no /proc)."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0, running - _own_running_threads())


@dataclass(frozen=True, kw_only=True)
class LoadSample:
    """The load at one moment: 1-minute load average and runnable tasks besides this process."""

    load_1min: float | None
    runnable: float | None  # median of a few reads of /proc/loadavg, own threads excluded


def sample_load() -> LoadSample:
    reads = []
    for i in range(_LOAD_READS):
        if i:
            time.sleep(_LOAD_READ_GAP_S)
        count = _others_runnable()
        if count is None:
            break
        reads.append(count)
    load_1min = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return LoadSample(load_1min=load_1min, runnable=float(np.median(reads)) if reads else None)


@dataclass(frozen=True, kw_only=True)
class LoadRecord:
    """The load before and after one measurement, on `cpus` cores (this process's affinity)."""

    cpus: int
    before: LoadSample
    after: LoadSample

    @property
    def runnable_per_cpu(self) -> float | None:
        """Other runnable tasks per core, the worse of before and after (None: not known here)."""
        counts = [s.runnable for s in (self.before, self.after) if s.runnable is not None]
        return max(counts) / self.cpus if counts else None

    @property
    def contaminated(self) -> bool:
        per_cpu = self.runnable_per_cpu
        return per_cpu is not None and per_cpu > CONTAMINATED_ABOVE

    def describe(self) -> str:
        """`measured under load: 3.1 runnable tasks per core; speed-ups are unreliable`, or the quiet form."""
        per_cpu = self.runnable_per_cpu
        if per_cpu is None:
            return "load not known (no /proc/loadavg)"
        if self.contaminated:
            return f"measured under load: {per_cpu:.1f} runnable tasks per core; speed-ups are unreliable"
        return f"measured with {per_cpu:.1f} other runnable tasks per core (flagged above {CONTAMINATED_ABOVE:g})"

    def short(self) -> str:
        """`0.4/core`, `3.1/core LOADED`, `-` (not known): for a table cell."""
        per_cpu = self.runnable_per_cpu
        if per_cpu is None:
            return "-"
        return f"{per_cpu:.1f}/core" + (" LOADED" if self.contaminated else "")

    def as_stats(self) -> dict[str, float]:
        """Flat `load_*` floats (known values only), to merge into a latency stats dict."""
        values: dict[str, float | None] = {
            "cpus": float(self.cpus),
            "1min_before": self.before.load_1min,
            "1min_after": self.after.load_1min,
            "runnable_before": self.before.runnable,
            "runnable_after": self.after.runnable,
            "runnable_per_cpu": self.runnable_per_cpu,
            "contaminated": float(self.contaminated),
        }
        return {LOAD_PREFIX + k: float(v) for k, v in values.items() if v is not None}

    @classmethod
    def from_stats(cls, stats: Mapping[str, float]) -> LoadRecord | None:
        """The record `as_stats` wrote into `stats`; None for stats measured before loads were recorded."""
        if LOAD_PREFIX + "cpus" not in stats:
            return None

        def sample(when: str) -> LoadSample:
            return LoadSample(
                load_1min=stats.get(f"{LOAD_PREFIX}1min_{when}"), runnable=stats.get(f"{LOAD_PREFIX}runnable_{when}")
            )

        return cls(cpus=int(stats[LOAD_PREFIX + "cpus"]), before=sample("before"), after=sample("after"))


class LoadWatch:
    """`with LoadWatch() as watch: ...` then `watch.record`: the load before and after the block
    (for `bench/` scripts whose measurement is not a `measure_latency` call)."""

    def __enter__(self) -> LoadWatch:
        self._before = sample_load()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.record = LoadRecord(cpus=this_machine().cores, before=self._before, after=sample_load())


def worst_load(records: Iterable[LoadRecord | None]) -> LoadRecord | None:
    """The record with the most runnable tasks per core among those known."""
    known = [r for r in records if r is not None and r.runnable_per_cpu is not None]
    return max(known, key=lambda r: r.runnable_per_cpu or 0.0, default=None)


def load_of(measurements: Iterable[Mapping[str, float]]) -> LoadRecord | None:
    """The worst load recorded among these measurements' stats (None: none recorded one)."""
    return worst_load(LoadRecord.from_stats(stats) for stats in measurements)


# ---------------------------------------------------------------------------- latency


def timed(fn: Callable[[], object]) -> Timer:
    """A `Timer` that calls `fn` in this process."""

    def call() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000.0

    return call


def latency_stats(times_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean/min in milliseconds and the number of timed calls."""
    arr = np.asarray(times_ms, dtype=float)
    return {
        "min_ms": float(arr.min()),
        "p50_ms": float(np.percentile(arr, 50)),
        "p95_ms": float(np.percentile(arr, 95)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
        "iters": float(len(arr)),
    }


def measure_interleaved(
    timers: Mapping[str, Timer],
    *,
    warmup: int = 3,
    min_iters: int = 10,
    max_iters: int = 200,
    budget_s: float = 2.0,
    honour_quick: bool = True,
    settle_s: float = SETTLE_S,
) -> dict[str, dict[str, float]]:
    """Time several engines in alternate rounds (one call each per round, the order rotating, so
    none always follows another), and return per engine its latency stats (see `latency_stats`)
    and the `load_*` record of the whole measurement, shared by all.

    Runs at least `min_iters` rounds, then stops at `max_iters` or after `budget_s` per engine.
    `honour_quick=False` for a measurement whose result decides something (the int8 search):
    ORTPACK_TIMING=quick does not shorten it. `settle_s`: the pause before each call (engines in
    other processes whose thread pools spin or sleep need longer than SETTLE_S).
    """
    if quick_timing() and honour_quick:
        warmup, min_iters, budget_s = min(warmup, QUICK_WARMUP), min(min_iters, QUICK_ITERS), 0.0
    names = list(timers)
    settle = settle_s if len(names) > 1 else 0.0
    for name in names:
        for _ in range(warmup):
            timers[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    with LoadWatch() as watch:
        start, rounds = time.perf_counter(), 0
        while rounds < max_iters and (rounds < min_iters or time.perf_counter() - start < budget_s * len(names)):
            for name in names[rounds % len(names) :] + names[: rounds % len(names)]:
                if settle:
                    time.sleep(settle)
                times[name].append(timers[name]())
            rounds += 1
        time.sleep(settle)
    load = watch.record.as_stats()
    return {name: latency_stats(times[name]) | load for name in names}


def measure_latency(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    min_iters: int = 10,
    max_iters: int = 200,
    budget_s: float = 2.0,
) -> dict[str, float]:
    """Call `fn` repeatedly and return p50/p95/p99/mean latency in milliseconds, with the load it
    ran under (`load_*`, see `LoadRecord.as_stats`).

    Runs at least `min_iters` timed calls, then stops at `max_iters` or after `budget_s`.
    """
    return measure_interleaved(
        {"": timed(fn)}, warmup=warmup, min_iters=min_iters, max_iters=max_iters, budget_s=budget_s
    )[""]


def text_bench_shapes(max_length: int) -> dict[str, tuple[int, int]]:
    """The (batch, sequence) shapes every text variant is measured at, named `b1_s16` etc."""
    shapes = {}
    for batch, seq in ((1, 16), (16, 128)):
        seq = min(seq, max_length)
        shapes[f"b{batch}_s{seq}"] = (batch, seq)
    return shapes


def decoder_bench_shapes(context: int) -> dict[str, tuple[int, int, int]]:
    """shape key -> (batch, new tokens, past tokens): a 128-token prompt's prefill (time to first
    token) and a decode step after it at batch 1 and 8 (tokens per second), within the context."""
    prompt = min(128, context // 2)
    return {
        f"prefill_b1_s{prompt}": (1, prompt, 0),
        f"decode_b1_p{prompt}": (1, 1, prompt),
        f"decode_b8_p{prompt}": (8, 1, prompt),
    }


def synthetic_text_batch(
    batch: int,
    seq: int,
    input_names: list[str],
    *,
    vocab_size: int,
    seed: int = 0,
    low_id: int = 1000,
) -> dict[str, np.ndarray]:
    """A full (unpadded) batch of random token ids, the same for torch and ORT."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(min(low_id, vocab_size - 1), vocab_size, (batch, seq), dtype=np.int64)}
    feeds["attention_mask"] = np.ones((batch, seq), dtype=np.int64)
    if "token_type_ids" in input_names:
        feeds["token_type_ids"] = np.zeros((batch, seq), dtype=np.int64)
    return {name: feeds[name] for name in input_names}
