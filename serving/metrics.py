"""Prometheus metrics of the server, in their own registry (one per app). No `_created` series:
they double the exposition and no dashboard reads them."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ortpack.kernel.probe import ProbeResult
from ortpack.serving.batcher import BatchStats
from ortpack.serving.stages import STAGES

_LATENCY = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5, 10)
# Stages of a request run from tens of microseconds (tokenizing a sentence) to seconds.
_STAGE = (
    0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10,
)  # fmt: skip
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_RATIO = (1.0, 1.05, 1.1, 1.25, 1.5, 2, 3, 4, 8)


class LoopHistogram:
    """A labelled histogram observed on the event loop alone: plain counts found by bisection, no
    lock. prometheus_client's Histogram takes two locks and scans its buckets on every
    observation; the stage histogram has eight per answered request (1.37 against 0.22 µs each, by
    a microbenchmark). Exposed as prometheus_client exposes its own: cumulative `_bucket` series
    with `le`, `_count`, `_sum`."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float], registry: Any
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # the buckets' `le`, as exposed
        self._series: dict[tuple[str, ...], LoopSeries] = {}
        if not self.labelnames:  # shown from the start, at zero, as prometheus_client shows one
            self.observe = self.labels().observe
        registry.register(self)

    def labels(self, **labels: str) -> LoopSeries:
        key = tuple(labels[name] for name in self.labelnames)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = LoopSeries(self.bounds)
        return series

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, series in list(self._series.items()):
            cumulative = list(itertools.accumulate(list(series.counts)))
            family.add_metric(list(key), list(zip(self._les, cumulative, strict=True)), series.sum)
        yield family


class LoopSeries:
    """One label set of a `LoopHistogram`: its count per bucket (the last: above every bound)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # `le`: a value on a bound counts in it
        self.sum += value


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # process-wide in prometheus_client; this process serves one model
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ortpack_requests_total", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        # the histograms are observed on the event loop (serving/http.py's `endpoint`; the batcher's
        # `on_batch`, `observe_batch` below): LoopHistogram, no lock
        self.latency = LoopHistogram(
            "ortpack_request_duration_seconds", "HTTP request latency by route", ["route"], _LATENCY, r
        )
        self.queue_depth = Gauge("ortpack_queue_depth", "items waiting for the model", registry=r)
        self.batch_size = LoopHistogram("ortpack_batch_size", "items per model call", [], _BATCH, r)
        self.padding_ratio = LoopHistogram(
            "ortpack_padding_ratio", "padded tokens / real tokens per model call (texts)", [], _RATIO, r
        )
        self.inference = LoopHistogram(
            "ortpack_inference_duration_seconds", "model call time by bucket", ["bucket"], _LATENCY, r
        )
        self.queue_wait = LoopHistogram(
            "ortpack_queue_wait_seconds", "time the oldest item of a batch waited", [], _LATENCY, r
        )
        self.items = Counter("ortpack_items_total", "items (texts, images) answered", registry=r)
        self.model_calls = Counter(
            "ortpack_model_calls_total",
            "model calls by intra-op threads: 1 on the per-core workers, more for a batch that ran alone",
            ["threads"],
            registry=r,
        )
        self.stages = LoopHistogram(  # observed by serving/http.py's `endpoint`, on the event loop
            "ortpack_request_stage_seconds",
            "where an answered inference request's time went, by route and stage: "
            + ", ".join(STAGES)
            + " (serving/stages.py; the stages add up to total)",
            ["route", "stage"],
            _STAGE,
            r,
        )
        self.rejections = Counter(
            "ortpack_rejections_total",
            "requests refused or abandoned, by reason: queue_full, too_large, deadline, not_ready, unauthorized, "
            "slow_client, client_gone, headers_too_large, bad_request, too_many_connections",
            ["reason"],
            registry=r,
        )
        self.model_errors = Counter(
            "ortpack_model_errors_total",
            "model calls that raised, by scope: batch (a batch of several requests, run again one request at a "
            "time so that only the failing ones are answered 500), request (one request's own call: answered 500)",
            ["scope"],
            registry=r,
        )
        self.tokens = Counter("ortpack_tokens_total", "real tokens of the texts run by the model", registry=r)
        self.ready = Gauge("ortpack_ready", "1 once warm-up finished and until shutdown starts", registry=r)
        self.in_flight = Gauge("ortpack_requests_in_flight", "requests accepted and not yet answered", registry=r)
        # The memory budget (serving/memory.py), read when scraped
        self.memory_held = Gauge(
            "ortpack_memory_held_bytes", "memory the requests in progress and the model's growth hold", registry=r
        )
        self.memory_budget = Gauge(
            "ortpack_memory_budget_bytes", "what they may hold (-1: unbounded); set once warm", registry=r
        )
        # The node check: each gated number of the probe set, per variant tried on this node (the
        # task's gates: `gated_metrics`)
        self.parity: dict[str, Gauge] = {}
        self.probe_passed = Gauge(
            "ortpack_parity_passed",
            "1 when the variant passed its gate on this node's probe check",
            ["variant"],
            registry=r,
        )

    def gated_metrics(self, metrics: Iterable[str]) -> None:
        """One gauge per number the served task's probe check can gate (its contract's table; the
        preprocessing pixel check needs the build's graphs and is not repeated on the node)."""
        for metric in metrics:
            if metric not in self.parity and metric != "max_pixel_diff":
                self.parity[metric] = Gauge(
                    f"ortpack_parity_{metric}",
                    f"probe check on this node: {metric} against PyTorch",
                    ["variant"],
                    registry=self.registry,
                )

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.size)
        if stats.real_tokens:  # text batches only: an image has no tokens
            self.padding_ratio.observe(stats.padded_tokens / stats.real_tokens)
            self.tokens.inc(stats.real_tokens)
        self.inference.labels(bucket=str(stats.bucket)).observe(stats.seconds)
        self.queue_wait.observe(stats.queue_wait)
        self.items.inc(stats.size)
        self.model_calls.labels(threads=str(stats.threads)).inc()

    def stage_observers(self, route: str) -> dict[str, Any]:
        """The stage histogram's series for one route, by stage (made once per route: a route
        without model calls never shows in the exposition)."""
        return {stage: self.stages.labels(route=route, stage=stage) for stage in STAGES}

    def observe_probe(self, result: ProbeResult) -> None:
        for metric, gauge in self.parity.items():
            if metric in result.values:
                gauge.labels(variant=result.variant_id).set(result.values[metric])
        self.probe_passed.labels(variant=result.variant_id).set(1 if result.passed else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
