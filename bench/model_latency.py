"""PyTorch eager vs every variant of a text bundle: latency and peak memory, each in its own process,
timed in alternate rounds.

    python bench/model_latency.py [--bundle dist/all-MiniLM-L6-v2] [--model all-MiniLM-L6-v2]

Shapes (`SHAPES`): batch 1 x 16 and 1 x 128 tokens, 8 x 32 and 16 x 128 (random token ids, full
attention mask). The run ends with the shapes where a variant is slower than PyTorch, if any.
PyTorch runs the Hugging Face model with its default attention implementation plus the same
pooling module the export uses, under `torch.inference_mode()`; each variant runs in ONNX Runtime
the way the server loads it. Every engine lives in its own worker process (its peak RSS is its
own); the parent asks them for one timed call each in turn, round after round
(components/core/timing.py `measure_interleaved`), so load that comes and goes hits all engines
alike, and records the load before and after each shape. Prints a table and writes
bench/results/model_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# batch x tokens: a short query alone, a long text alone, the batcher's batch of short queries,
# and a full batch of long texts
# The pause before each call: each engine is its own process, and one whose threads still spin
# (ORT's pool, PyTorch's OpenMP) takes a core from the next engine's call. With 2 ms, PyTorch's
# b1 x 16 measured 49.6 ms p50 interleaved against 9.6 ms alone (2-core AMD EPYC).
SETTLE_S = 0.05
SHAPES = {"b1_s16": (1, 16), "b1_s128": (1, 128), "b8_s32": (8, 32), "b16_s128": (16, 128)}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def torch_engine(model: str, input_names: list[str], vocab_size: int) -> tuple[dict[str, Callable[[], object]], dict]:
    """Per shape, one PyTorch call, and what to report about the engine."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModel

    from ortpack.components.core.exporters.text_embedding import Pooling, SentenceEmbedding, read_pooling_config
    from ortpack.components.core.tasks import resolve_model_source
    from ortpack.components.core.timing import synthetic_text_batch

    source, _ = resolve_model_source(model, "text-embedding")
    pooling = read_pooling_config(Path(source))
    encoder = AutoModel.from_pretrained(source, local_files_only=True).eval()
    module = SentenceEmbedding(encoder, Pooling(pooling["mode"], pooling["normalize"]), tuple(input_names)).eval()
    calls = {}
    for key, (b, s) in SHAPES.items():
        feeds = synthetic_text_batch(b, s, input_names, vocab_size=vocab_size)
        calls[key] = torch.inference_mode()(partial(module, *[torch.from_numpy(feeds[n]) for n in input_names]))
    return calls, {"threads": torch.get_num_threads()}


def variant_engine(
    bundle: str, variant_id: str, input_names: list[str], vocab_size: int
) -> tuple[dict[str, Callable[[], object]], dict]:
    """Per shape, one call of the variant's ORT session (loaded as the server loads it)."""
    from ortpack.components.core.timing import synthetic_text_batch
    from ortpack.kernel.bundle import read_manifest
    from ortpack.kernel.runtime import create_session, plan_for

    manifest = read_manifest(Path(bundle))
    variant = manifest.variant(variant_id)
    session = create_session(Path(bundle) / variant.file, plan_for(variant))
    calls = {}
    for key, (b, s) in SHAPES.items():
        feeds = synthetic_text_batch(b, s, input_names, vocab_size=vocab_size)
        calls[key] = partial(session.run, None, feeds)
    return calls, {"providers": session.get_providers()}


def serve_worker(calls: dict[str, Callable[[], object]], about: dict, requests: IO[str], replies: IO[str]) -> None:
    """Answer `call <shape>` with that call's milliseconds, and `done` with the engine's facts."""
    from ortpack.components.core.timing import timed

    timers = {key: timed(call) for key, call in calls.items()}
    print("ready", file=replies, flush=True)
    for line in requests:
        command, _, shape = line.strip().partition(" ")
        if command == "call":
            print(timers[shape](), file=replies, flush=True)
        elif command == "done":
            print(json.dumps({**about, "peak_rss_mb": _peak_rss_mb()}), file=replies, flush=True)
            return


class Worker:
    """One engine in its own process, timed a call at a time."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._ask(None, expect="ready")

    def _ask(self, command: str | None, expect: str | None = None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer or (expect is not None and answer != expect):
            raise SystemExit(f"benchmark worker {self.args[:2]} failed (exit {self.proc.wait()}); see its stderr above")
        return answer

    def timer(self, shape: str) -> Callable[[], float]:
        return lambda: float(self._ask(f"call {shape}"))

    def finish(self) -> dict[str, Any]:
        about = json.loads(self._ask("done"))
        self.proc.wait()
        return about


def measure(workers: dict[str, Worker], budget: float) -> dict[str, dict[str, Any]]:
    """Per engine, per shape: its latency stats and the load of that shape's rounds; then its facts."""
    from ortpack.components.core.timing import measure_interleaved

    engines: dict[str, dict[str, Any]] = {name: {"shapes": {}} for name in workers}
    for key in SHAPES:
        stats = measure_interleaved(
            {name: w.timer(key) for name, w in workers.items()}, budget_s=budget, settle_s=SETTLE_S
        )
        for name in workers:
            engines[name]["shapes"][key] = stats[name]
    for name, worker in workers.items():
        engines[name].update(worker.finish())
    return engines


def print_table(name: str, engines: dict[str, dict[str, Any]]) -> None:
    from ortpack.components.core.timing import load_of

    base = engines["pytorch"]["shapes"]
    rows = [("engine", *(f"{k} p50 / p95 ms" for k in SHAPES), *(f"{k} vs torch" for k in SHAPES), "peak RSS MB")]
    for engine, result in engines.items():
        s = result["shapes"]
        rows.append(
            (
                engine,
                *(f"{s[k]['p50_ms']:.2f} / {s[k]['p95_ms']:.2f}" for k in SHAPES),
                *(f"{base[k]['p50_ms'] / s[k]['p50_ms']:.1f}x" for k in SHAPES),
                f"{result['peak_rss_mb']:.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"model latency: {name}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    print("| " + " | ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows[1:]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    worst = load_of(base.values())
    if worst is not None:
        print(f"engines timed in alternate rounds; {worst.describe()}")
    slower = [
        f"{engine} at {k} ({result['shapes'][k]['p50_ms']:.2f} vs {base[k]['p50_ms']:.2f} ms)"
        for engine, result in engines.items()
        if engine != "pytorch"
        for k in SHAPES
        if result["shapes"][k]["p50_ms"] > base[k]["p50_ms"]
    ]
    print("slower than PyTorch: " + ("; ".join(slower) if slower else "none"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"), help="bundle to measure")
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="the PyTorch model the bundle came from")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timed calls per shape and engine")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "model_latency.json"), help="JSON output")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        # the protocol keeps stdout to itself: anything else printed there (a library's notice) goes to stderr
        replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        kind, target, names, vocab = args.worker
        input_names = names.split(",")
        if kind == "torch":
            calls, about = torch_engine(target, input_names, int(vocab))
        else:
            calls, about = variant_engine(args.bundle, target, input_names, int(vocab))
        serve_worker(calls, about, sys.stdin, replies)
        return 0

    from ortpack.kernel.bundle import verify_bundle

    manifest = verify_bundle(Path(args.bundle))
    assert manifest.task_settings.tokenizer is not None, "bench/model_latency.py measures text bundles"
    names = ",".join(manifest.task_settings.tokenizer.model_input_names)
    vocab = "30000"  # random ids in [1000, 30000) exist in every BERT-family vocabulary we ship
    workers = {"pytorch": Worker(["torch", args.model, names, vocab, "--bundle", args.bundle])}
    for variant in manifest.variants:
        workers[variant.id] = Worker(["variant", variant.id, names, vocab, "--bundle", args.bundle])
    engines = measure(workers, args.budget)
    print_table(manifest.name, engines)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bundle": manifest.name,
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "cpu_count": os.cpu_count(),
                "interleaved": True,  # per shape, engines timed in alternate rounds; load_* per shape
                "versions": manifest.versions,
                "engines": engines,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
