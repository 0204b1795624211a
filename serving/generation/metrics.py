"""The generation loop's Prometheus metrics, in the server's registry: time to first token, the time
between tokens, tokens per second by phase, the running and waiting sequences and the key/value
cache in use. Observed on the loop's thread (prometheus_client's histograms take a lock; a few
hundred observations a second), the gauges read when scraped."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_TTFT = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60)
_ITL = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5)
_STEP = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


class GenerationMetrics:
    """The loop's Observer (ortpack.kernel.generation.engine) and its gauges."""

    def __init__(self, registry: Any, generator: Any) -> None:
        r = registry
        self.ttft = Histogram(
            "ortpack_time_to_first_token_seconds",
            "from a sequence's arrival to its first token",
            buckets=_TTFT,
            registry=r,
        )
        self.itl = Histogram(
            "ortpack_inter_token_latency_seconds", "between a sequence's consecutive tokens", buckets=_ITL, registry=r
        )
        self.steps = Histogram(
            "ortpack_generation_step_seconds", "one step of the loop, by phase", ["phase"], buckets=_STEP, registry=r
        )
        self.step_tokens = Counter(
            "ortpack_generation_tokens_total",
            "tokens run by the model, by phase: prefill (prompt tokens), decode (generated tokens)",
            ["phase"],
            registry=r,
        )
        self.sequences = Counter(
            "ortpack_sequences_total",
            "sequences ended, by finish reason: stop, length, cancelled, deadline, error",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("ortpack_prompt_tokens_total", "prompt tokens of ended sequences", registry=r)
        self.completion_tokens = Counter(
            "ortpack_completion_tokens_total", "tokens generated for ended sequences", registry=r
        )
        running = Gauge("ortpack_sequences_running", "sequences in the running batch", registry=r)
        running.set_function(lambda: generator.running)
        waiting = Gauge("ortpack_sequences_waiting", "sequences admitted and not yet decoding", registry=r)
        waiting.set_function(lambda: generator.waiting)
        used = Gauge(
            "ortpack_kv_cache_bytes", "key/value cache held by the running and prefilling sequences", registry=r
        )
        used.set_function(generator.cache_bytes)
        reserved = Gauge(
            "ortpack_kv_cache_reserved_tokens",
            "cache tokens held by admitted requests (prompt + max_tokens)",
            registry=r,
        )
        reserved.set_function(lambda: generator.scheduler.reserved)
        capacity = Gauge("ortpack_kv_cache_capacity_tokens", "cache tokens the server admits at most", registry=r)
        capacity.set_function(lambda: generator.limits.capacity)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def finished(self, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.sequences.labels(reason=reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)

    def step(self, kind: str, seconds: float, tokens: int) -> None:
        self.steps.labels(phase=kind).observe(seconds)
        self.step_tokens.labels(phase=kind).inc(tokens)
