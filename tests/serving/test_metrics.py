"""The server's own histogram type against prometheus_client's: the same exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest

from ortpack.serving.metrics import LoopHistogram


def test_the_loop_histogram_is_exposed_as_prometheus_clients_own() -> None:
    """Values below, on and between the bounds, above all of them, in two label sets: the same
    text as prometheus_client's Histogram, line for line."""
    disable_created_metrics()
    buckets = (0.001, 0.01, 0.1, 1, 10)
    values = [0.0, 0.0005, 0.001, 0.002, 0.01, 0.05, 0.1, 1, 3, 10, 11, 1e9]
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("h_seconds", "doc", ["route", "stage"], buckets=buckets, registry=theirs)
    loop = LoopHistogram("h_seconds", "doc", ["route", "stage"], buckets, ours)
    for i, value in enumerate(values):
        labels = {"route": "/v1/x", "stage": "read" if i % 3 else "model"}
        reference.labels(**labels).observe(value)
        loop.labels(**labels).observe(value)
    assert generate_latest(ours).decode().splitlines() == generate_latest(theirs).decode().splitlines()
    assert 'h_seconds_bucket{le="+Inf",route="/v1/x",stage="read"} 8.0' in generate_latest(ours).decode()


def test_an_unlabelled_loop_histogram_is_shown_from_the_start() -> None:
    """Without labels, the series is exposed at zero before any observation, as prometheus_client
    exposes its own, and observed directly."""
    disable_created_metrics()
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("batch_size", "doc", buckets=(1, 2, 4), registry=theirs)
    loop = LoopHistogram("batch_size", "doc", [], (1, 2, 4), ours)
    assert generate_latest(ours) == generate_latest(theirs)
    for value in (1, 3, 8):
        reference.observe(value)
        loop.observe(value)
    assert generate_latest(ours) == generate_latest(theirs)
