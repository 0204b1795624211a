"""Latency measurement shared by the torch baseline, the variant benchmark and `bench/`."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def measure_latency(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    min_iters: int = 10,
    max_iters: int = 200,
    budget_s: float = 2.0,
) -> dict[str, float]:
    """Call `fn` repeatedly and return p50/p95/p99/mean latency in milliseconds.

    Runs at least `min_iters` timed calls, then stops at `max_iters` or after `budget_s`.
    """
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    arr = np.asarray(times)
    return {
        "p50_ms": float(np.percentile(arr, 50)),
        "p95_ms": float(np.percentile(arr, 95)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
        "iters": float(len(arr)),
    }


def text_bench_shapes(max_length: int) -> dict[str, tuple[int, int]]:
    """The (batch, sequence) shapes every text variant is measured at, named `b1_s16` etc."""
    shapes = {}
    for batch, seq in ((1, 16), (16, 128)):
        seq = min(seq, max_length)
        shapes[f"b{batch}_s{seq}"] = (batch, seq)
    return shapes


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
