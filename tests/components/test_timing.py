"""Timings record the load they ran under, and engines compared with each other are timed in
alternate rounds (components/core/timing.py, benchmark.py, bench/model_latency.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ortpack.components.core.timing import (
    LOAD_PREFIX,
    LoadRecord,
    LoadSample,
    LoadWatch,
    Timer,
    load_of,
    measure_interleaved,
    measure_latency,
)


def _record(before: float, after: float, cpus: int = 2) -> LoadRecord:
    return LoadRecord(
        cpus=cpus,
        before=LoadSample(load_1min=before + 0.2, runnable=before),
        after=LoadSample(load_1min=after + 0.2, runnable=after),
    )


def test_above_one_runnable_task_per_core_a_timing_is_contaminated_and_says_so() -> None:
    loaded = _record(before=2.0, after=6.2)
    assert loaded.runnable_per_cpu == pytest.approx(3.1) and loaded.contaminated
    assert loaded.describe() == "measured under load: 3.1 runnable tasks per core; speed-ups are unreliable"
    assert loaded.short() == "3.1/core LOADED"
    at_the_line = _record(before=2.0, after=1.0)  # one other task per core: not above one
    assert not at_the_line.contaminated
    assert at_the_line.describe() == "measured with 1.0 other runnable tasks per core (flagged above 1)"


def test_a_load_record_travels_as_flat_floats_beside_the_latency() -> None:
    record = _record(before=1.0, after=3.0)
    stats = {"p50_ms": 2.0} | record.as_stats()
    assert all(isinstance(v, float) for v in stats.values())  # the manifest's shape stats are floats
    assert stats[LOAD_PREFIX + "contaminated"] == 1.0 and stats[LOAD_PREFIX + "cpus"] == 2.0
    assert LoadRecord.from_stats(stats) == record
    assert LoadRecord.from_stats({"p50_ms": 2.0}) is None  # measured before loads were recorded
    assert load_of([{"p50_ms": 1.0}, stats, _record(0.0, 0.0).as_stats()]) == record  # the worst


def test_an_unknown_runnable_count_is_never_called_contaminated() -> None:
    unknown = LoadRecord(
        cpus=2, before=LoadSample(load_1min=9.0, runnable=None), after=LoadSample(load_1min=9.0, runnable=None)
    )
    assert unknown.runnable_per_cpu is None and not unknown.contaminated
    assert "load_runnable_per_cpu" not in unknown.as_stats() and unknown.short() == "-"


def test_a_load_watch_records_this_machine_before_and_after() -> None:
    with LoadWatch() as watch:
        pass
    record = watch.record
    assert record.cpus >= 1
    if Path("/proc/loadavg").is_file():
        assert record.before.runnable is not None and record.before.runnable >= 0


def test_engines_are_timed_in_alternate_rounds_the_order_rotating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORTPACK_TIMING", raising=False)  # the full measurement, not the suite's quick one
    calls: list[str] = []

    def engine(name: str, ms: float) -> Timer:
        def call() -> float:
            calls.append(name)
            return ms

        return call

    out = measure_interleaved(
        {"pytorch": engine("pytorch", 20.0), "onnxruntime": engine("onnxruntime", 5.0)},
        warmup=1,
        min_iters=4,
        max_iters=4,
    )
    timed = calls[2:]  # after one warm-up call each
    rounds = [timed[i : i + 2] for i in range(0, len(timed), 2)]
    assert rounds == [["pytorch", "onnxruntime"], ["onnxruntime", "pytorch"]] * 2
    assert out["pytorch"]["p50_ms"] == 20.0 and out["onnxruntime"]["p50_ms"] == 5.0
    assert out["pytorch"]["iters"] == out["onnxruntime"]["iters"] == 4.0
    # one load record for the whole measurement, shared by both engines
    load = {k: v for k, v in out["pytorch"].items() if k.startswith(LOAD_PREFIX)}
    assert load and load == {k: v for k, v in out["onnxruntime"].items() if k.startswith(LOAD_PREFIX)}


def test_quick_timing_takes_one_warm_up_and_three_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORTPACK_TIMING=quick (the suite's setting): whatever the caller's budget asks for."""
    calls: list[str] = []
    monkeypatch.setenv("ORTPACK_TIMING", "quick")
    out = measure_interleaved({"a": lambda: calls.append("a") or 1.0}, warmup=3, min_iters=10, budget_s=60.0)
    assert len(calls) == 4 and out["a"]["iters"] == 3.0
    monkeypatch.setenv("ORTPACK_TIMING", "full")  # anything else: the caller's settings
    calls.clear()
    measure_interleaved({"a": lambda: calls.append("a") or 1.0}, warmup=2, min_iters=5, max_iters=5)
    assert len(calls) == 7


def test_measure_latency_keeps_its_keys_and_adds_the_load() -> None:
    stats = measure_latency(lambda: None, warmup=0, min_iters=3, max_iters=3)
    assert {"p50_ms", "p95_ms", "p99_ms", "mean_ms", "iters"} <= set(stats) and stats["iters"] == 3.0
    assert LoadRecord.from_stats(stats) is not None


def test_the_benchmark_times_pytorch_alongside_the_variant_when_given_its_call(
    tiny_export: Path, tiny_variants: dict[str, Path], tmp_path: Path
) -> None:
    from ortpack.components.core.artifacts import BenchmarkResult, ExportResult
    from ortpack.components.core.benchmark import benchmark_variant, torch_p50

    export = ExportResult.load(tiny_export)
    result = benchmark_variant(
        tiny_variants["cpu-fp32"],
        tiny_export,
        budget_s=0.05,
        out_dir=tmp_path,
        torch_calls={shape: (lambda: None) for shape in export.torch_latency},
    )
    for shape, stats in result.shapes.items():
        assert "torch_p50_ms" in stats and LoadRecord.from_stats(stats) is not None
        assert result.speedup_vs_torch[shape] == pytest.approx(stats["torch_p50_ms"] / stats["p50_ms"])
    assert BenchmarkResult.load(tmp_path) == result
    # without PyTorch's call, the speed-up is against the export's timing, as before
    plain = BenchmarkResult.load(tiny_variants["cpu-fp32"])
    shape = next(iter(plain.shapes))
    assert "torch_p50_ms" not in plain.shapes[shape]
    assert torch_p50(export, plain.shapes[shape], shape) == export.torch_latency[shape]["p50_ms"]


def test_an_old_benchmark_json_without_load_still_loads(tmp_path: Path) -> None:
    from ortpack.components.core.artifacts import BenchmarkResult

    old = {
        "variant_id": "cpu-fp32",
        "execution_providers": ["CPUExecutionProvider"],
        "shapes": {"b1_s16": {"p50_ms": 5.8, "p95_ms": 6.1, "p99_ms": 6.3, "mean_ms": 5.9, "iters": 10.0}},
        "speedup_vs_torch": {"b1_s16": 4.1},
        "load_average": 1.85,
    }
    (tmp_path / "benchmark.json").write_text(json.dumps(old))
    bench = BenchmarkResult.load(tmp_path)
    assert load_of(bench.shapes.values()) is None and bench.load_average == 1.85


def test_a_model_latency_worker_answers_one_timed_call_at_a_time() -> None:
    from bench.model_latency import serve_worker

    replies = io.StringIO()
    requests = io.StringIO("call b1_s16\ncall b16_s128\ndone\n")
    serve_worker({"b1_s16": lambda: None, "b16_s128": lambda: None}, {"threads": 2}, requests, replies)
    lines = replies.getvalue().splitlines()
    assert lines[0] == "ready" and len(lines) == 4
    assert float(lines[1]) >= 0 and float(lines[2]) >= 0
    assert json.loads(lines[3])["threads"] == 2 and json.loads(lines[3])["peak_rss_mb"] > 0


def test_model_latency_times_its_workers_in_alternate_rounds_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.model_latency import SHAPES, measure

    monkeypatch.delenv("ORTPACK_TIMING", raising=False)  # the benchmark's own warm-up and rounds

    asked: list[tuple[str, str]] = []

    class FakeWorker:
        def __init__(self, name: str) -> None:
            self.name = name

        def timer(self, shape: str) -> Timer:
            return lambda: asked.append((self.name, shape)) or 1.0

        def finish(self) -> dict[str, float]:
            return {"peak_rss_mb": 1.0}

    engines = measure({"pytorch": FakeWorker("pytorch"), "cpu-int8": FakeWorker("cpu-int8")}, budget=0.0)  # type: ignore[dict-item]
    first = [name for name, shape in asked if shape == next(iter(SHAPES))]
    assert first[6:10] == ["pytorch", "cpu-int8", "cpu-int8", "pytorch"]  # after 3 warm-up calls each
    for engine in engines.values():
        assert set(engine["shapes"]) == set(SHAPES) and engine["peak_rss_mb"] == 1.0
        assert all(LoadRecord.from_stats(stats) is not None for stats in engine["shapes"].values())
