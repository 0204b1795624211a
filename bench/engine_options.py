"""The engine on this CPU: ONNX Runtime session options for a bundle's variant, at batch 1 and
batched, as a fraction of the machine's int8 peak.

    python bench/engine_options.py [--bundle dist/all-MiniLM-L6-v2] [--variant cpu-int8]

Each option set is one session of the same verified model bytes. Per set: the p50 latency of one
sentence (batch 1; all sets timed in alternate calls, so load that comes and goes hits them
alike) and the throughput in sentences/s of batch 1 and batch 8 (two callers x one thread for the
one-thread sets, as the server's workers run; one caller for the multi-thread sets, as its lone
session runs). Sentences are the shipped queries (components/core/data/retrieval_queries.jsonl).

The int8 peak is measured, not looked up: ONNX Runtime's own u8 x s8 GEMM (`MatMulInteger`,
1024 x 1024 x 1024; the kernels the quantized model's matrix products use) on every core, best
of several calls, in multiply-accumulates per second. A set's fraction of it is its int8
multiply-accumulates per second: sentences/s x real tokens x the int8 weights' K x N summed over
the model's quantized matrix products (QAttention, DynamicQuantizeMatMul, MatMulIntegerToFloat);
attention scores, layer norms and the rest are float work not counted. Prints a table, writes
`--out` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_offline import per_second  # noqa: E402
from ortpack.components.core.timing import LoadWatch  # noqa: E402

QUERIES = ROOT / "components" / "core" / "data" / "retrieval_queries.jsonl"
INT8_PRODUCTS = {"QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger"}

# name -> (intra-op threads, session config entries, graph optimization at load, memory arena)
OPTION_SETS: dict[str, tuple[int, dict[str, str], str, bool]] = {
    "worker (as served: 1 thread, no spinning)": (1, {"session.intra_op.allow_spinning": "0"}, "plan", True),
    "worker, arena off": (1, {"session.intra_op.allow_spinning": "0"}, "plan", False),
    "worker, optimize all at load": (1, {"session.intra_op.allow_spinning": "0"}, "all", True),
    "lone (as served: 2 threads, spinning)": (2, {}, "plan", True),
    "lone, no spinning": (2, {"session.intra_op.allow_spinning": "0"}, "plan", True),
    "lone, spinning stops after each run": (2, {"session.force_spinning_stop": "1"}, "plan", True),
    "lone, dynamic block base 4": (2, {"session.dynamic_block_base": "4"}, "plan", True),
}


def int8_macs_per_token(model: bytes) -> int:
    """K x N of every int8 weight matrix of the model's quantized matrix products, summed."""
    import onnx

    graph = onnx.load_from_string(model).graph
    weights = {init.name: list(init.dims) for init in graph.initializer}
    total = 0
    for node in graph.node:
        if node.op_type in INT8_PRODUCTS and len(node.input) > 1:
            shape = weights.get(node.input[1])
            if shape is not None and len(shape) == 2:
                total += shape[0] * shape[1]
    return total


def session(
    model: bytes,
    plan: Any,
    threads: int,
    entries: dict[str, str],
    level: str,
    arena: bool,
    fixed: dict[str, int] | None = None,
) -> Any:
    """One session of `model` with these options; `fixed` pins named dynamic dimensions (ONNX
    Runtime's free-dimension overrides)."""
    import onnxruntime as ort

    from ortpack.kernel.runtime import DISABLED_OPTIMIZERS

    options = ort.SessionOptions()
    options.log_severity_level = 3
    online = plan.online_optimization if level == "plan" else True
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if online else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = arena
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    for dim, size in (fixed or {}).items():
        options.add_free_dimension_override_by_name(dim, size)
    return ort.InferenceSession(model, options, providers=plan.providers, disabled_optimizers=DISABLED_OPTIMIZERS)


# (batch, tokens) shapes the batcher forms from short queries: one at a time, and eight at once
FIXED_SHAPES = ((1, 16), (1, 32), (8, 32))


def fixed_shapes(model: bytes, plan: Any, calls: int) -> list[dict[str, Any]]:
    """Per shape: a worker session (one thread, as served) with the batch and sequence dimensions
    left dynamic, against one with both pinned to the shape (ONNX Runtime's free-dimension
    overrides: what a per-bucket session with fixed shapes would run); p50 ms of the same inputs
    in alternate calls."""
    worker = {"session.intra_op.allow_spinning": "0"}  # as served: one thread, no spinning
    dynamic = session(model, plan, 1, worker, "plan", True)
    inputs = dynamic.get_inputs()
    dims = {d for i in inputs for d in i.shape if isinstance(d, str)}
    batch_dim, seq_dim = inputs[0].shape[0], inputs[0].shape[1]
    rows = []
    rng = np.random.default_rng(0)
    for batch, tokens in FIXED_SHAPES:
        fixed = session(model, plan, 1, worker, "plan", True, fixed={batch_dim: batch, seq_dim: tokens})
        feed = {
            i.name: (
                rng.integers(1000, 2000, (batch, tokens)) if "input_ids" in i.name else np.ones((batch, tokens))
            ).astype(np.int64)
            for i in inputs
        }
        times: dict[str, list[float]] = {"dynamic": [], "fixed": []}
        for i in range(calls + 10):
            for name, run in (
                (("dynamic", dynamic), ("fixed", fixed)) if i % 2 else (("fixed", fixed), ("dynamic", dynamic))
            ):
                elapsed = _timed(lambda run=run, feed=feed: run.run(None, feed))
                if i >= 10:
                    times[name].append(elapsed)
        p50 = {name: sorted(t)[len(t) // 2] * 1000 for name, t in times.items()}
        rows.append(
            {
                "batch": batch,
                "tokens": tokens,
                "dims": sorted(dims),
                "dynamic_p50_ms": p50["dynamic"],
                "fixed_p50_ms": p50["fixed"],
                "fixed_speedup": p50["dynamic"] / p50["fixed"],
            }
        )
    return rows


def int8_peak(threads: int, size: int = 1024, calls: int = 20) -> float:
    """Multiply-accumulates per second of ORT's MatMulInteger (u8 x s8 -> s32), size^3, best call."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.integers(-64, 64, (size, size), dtype=np.int8), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])],
        "int8_peak",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [size, size])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [size, size])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    run = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = rng.integers(0, 255, (size, size), dtype=np.uint8)
    run.run(None, {"A": a})
    best = min(_timed(lambda: run.run(None, {"A": a})) for _ in range(calls))
    return size**3 / best


def _timed(call: Any) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def throughput(backend: Any, payloads: list[Any], batch: int, callers: int, seconds: float) -> float:
    """Sentences per second: `callers` threads each running batches of `batch` in turn."""
    groups = [payloads[i : i + batch] for i in range(0, len(payloads) - batch + 1, batch)]

    def step(caller: int, i: int) -> int:
        backend.run(groups[(caller + i * callers) % len(groups)])
        return batch

    return per_second(step, seconds, callers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"))
    parser.add_argument("--variant", default="cpu-int8")
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput measurement")
    parser.add_argument("--calls", type=int, default=400, help="batch-1 calls per set for the latency")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_options.json"))
    args = parser.parse_args()

    from ortpack.kernel.bundle import read_manifest, read_verified
    from ortpack.kernel.contracts import TextSettings
    from ortpack.kernel.engines import open_engine
    from ortpack.kernel.hardware import this_machine
    from ortpack.kernel.runtime import plan_for
    from ortpack.kernel.tokenizer import TextEncoder

    bundle = Path(args.bundle)
    manifest = read_manifest(bundle)
    variant = manifest.variant(args.variant)
    settings = manifest.task_settings
    if not isinstance(settings, TextSettings):
        raise SystemExit(f"{bundle}: engine_options measures text bundles (no tokenizer here)")
    model = read_verified(bundle, manifest, variant.file)
    tokenizer = read_verified(bundle, manifest, settings.tokenizer.file).decode()
    encoder = TextEncoder(tokenizer, max_tokens=settings.tokenizer.max_length, truncate=True, buckets=(8,))
    queries = [json.loads(line) for line in QUERIES.read_text().splitlines() if line.strip()]
    payloads = list(encoder.encode(queries).payloads)
    tokens = float(np.mean([len(p) for p in payloads]))
    macs = int8_macs_per_token(model)
    plan = plan_for(variant)
    files = {settings.tokenizer.file: tokenizer.encode()}
    backends = {
        name: open_engine(manifest, session(model, plan, threads, entries, level, arena), files)
        for name, (threads, entries, level, arena) in OPTION_SETS.items()
    }
    cores = len(os.sched_getaffinity(0))
    with LoadWatch() as load:
        peak = {"1 thread": int8_peak(1), f"{cores} threads": int8_peak(cores)}
        for backend in backends.values():
            for p in payloads[:30]:
                backend.run([p])
        latencies: dict[str, list[float]] = {name: [] for name in backends}
        for i in range(args.calls):
            one = [payloads[i % len(payloads)]]
            for name, backend in backends.items():
                latencies[name].append(_timed(lambda b=backend, one=one: b.run(one)))
                time.sleep(0.002)  # spinning threads of the last set settle
        sets = {}
        for name, backend in backends.items():
            threads = OPTION_SETS[name][0]
            callers = 1 if threads > 1 else cores
            sets[name] = {
                "intra_op_threads": threads,
                "callers": callers,
                "b1_p50_ms": sorted(latencies[name])[len(latencies[name]) // 2] * 1000,
                "b1_sentences_per_s": throughput(backend, payloads, 1, callers, args.seconds),
                "b8_sentences_per_s": throughput(backend, payloads, 8, callers, args.seconds),
            }
        shapes = fixed_shapes(model, plan, max(args.calls // 4, 50))
    best_peak = max(peak.values())
    for record in sets.values():
        for key in ("b1", "b8"):
            record[f"{key}_int8_peak_fraction"] = record[f"{key}_sentences_per_s"] * tokens * macs / best_peak
    results = {
        "bundle": manifest.name,
        "variant": args.variant,
        "cpu": this_machine().summary(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mean_tokens_per_sentence": tokens,
        "int8_macs_per_token": macs,
        "int8_peak_macs_per_s": peak,
        "load": load.record.as_stats(),
        "sets": sets,
        "fixed_shapes": shapes,
    }
    rows = [["option set", "threads x callers", "b1 p50 ms", "b1 sent./s", "b8 sent./s", "b1 % peak", "b8 % peak"]]
    for name, r in sets.items():
        rows.append(
            [
                name,
                f"{r['intra_op_threads']} x {r['callers']}",
                f"{r['b1_p50_ms']:.2f}",
                f"{r['b1_sentences_per_s']:.0f}",
                f"{r['b8_sentences_per_s']:.0f}",
                f"{r['b1_int8_peak_fraction']:.1%}",
                f"{r['b8_int8_peak_fraction']:.1%}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print(f"{manifest.name} {args.variant} on {results['cpu']}; {tokens:.1f} tokens per sentence")
    print(
        "int8 peak (ORT MatMulInteger 1024^3): "
        + ", ".join(f"{k} {v / 1e9:.0f} GMAC/s" for k, v in peak.items())
        + f"; the model: {macs / 1e6:.2f} M int8 MACs per token; {load.record.describe()}"
    )
    print("\n".join(lines))
    print("\nfixed shapes (a worker session with batch and sequence pinned) vs dynamic, p50 ms:")
    for r in shapes:
        print(
            f"  b{r['batch']} x {r['tokens']}: dynamic {r['dynamic_p50_ms']:.2f}, fixed {r['fixed_p50_ms']:.2f} "
            f"({r['fixed_speedup']:.2f}x)"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
