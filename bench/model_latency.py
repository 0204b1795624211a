"""PyTorch eager vs every variant of a text bundle: latency and peak memory, each in its own process.

    python bench/model_latency.py [--bundle dist/all-MiniLM-L6-v2] [--model all-MiniLM-L6-v2]

Shapes: batch 1 x 16 tokens and batch 16 x 128 tokens (random token ids, full attention mask).
PyTorch runs the Hugging Face model with its default attention implementation plus the same
pooling module the export uses, under `torch.inference_mode()`; each variant runs in ONNX Runtime
the way the server loads it. Prints a table and writes bench/results/model_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {"b1_s16": (1, 16), "b16_s128": (16, 128)}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker_torch(model: str, input_names: list[str], vocab_size: int, budget: float) -> dict:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModel

    from components.core.exporters.text_embedding import Pooling, SentenceEmbedding, read_pooling_config
    from components.core.sources import resolve_model_source
    from components.core.timing import measure_latency, synthetic_text_batch

    source, _ = resolve_model_source(model, "text-embedding")
    pooling = read_pooling_config(Path(source))
    encoder = AutoModel.from_pretrained(source, local_files_only=True).eval()
    module = SentenceEmbedding(encoder, Pooling(pooling["mode"], pooling["normalize"]), tuple(input_names)).eval()
    out = {}
    with torch.inference_mode():
        for key, (b, s) in SHAPES.items():
            feeds = synthetic_text_batch(b, s, input_names, vocab_size=vocab_size)
            out[key] = measure_latency(
                partial(module, *[torch.from_numpy(feeds[n]) for n in input_names]), budget_s=budget
            )
    return {"shapes": out, "peak_rss_mb": _peak_rss_mb(), "threads": torch.get_num_threads()}


def worker_variant(bundle: str, variant_id: str, input_names: list[str], vocab_size: int, budget: float) -> dict:
    from components.core.timing import measure_latency, synthetic_text_batch
    from serving.bundle import read_manifest
    from serving.runtime import create_session, plan_for

    manifest = read_manifest(Path(bundle))
    variant = manifest.variant(variant_id)
    plan = plan_for(variant)
    session = create_session(Path(bundle) / variant.file, plan)
    out = {}
    for key, (b, s) in SHAPES.items():
        feeds = synthetic_text_batch(b, s, input_names, vocab_size=vocab_size)
        out[key] = measure_latency(partial(session.run, None, feeds), budget_s=budget)
    return {"shapes": out, "peak_rss_mb": _peak_rss_mb(), "providers": session.get_providers()}


def _run_worker(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark worker {args[:2]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"), help="bundle to measure")
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="the PyTorch model the bundle came from")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timed calls per shape (min 10 calls)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "model_latency.json"), help="JSON output")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        kind, target, names, vocab = args.worker
        input_names = names.split(",")
        if kind == "torch":
            result = worker_torch(target, input_names, int(vocab), args.budget)
        else:
            result = worker_variant(args.bundle, target, input_names, int(vocab), args.budget)
        print(json.dumps(result))
        return 0

    from serving.bundle import verify_bundle

    manifest = verify_bundle(Path(args.bundle))
    assert manifest.tokenizer is not None, "bench/model_latency.py measures text bundles"
    names = ",".join(manifest.tokenizer.model_input_names)
    vocab = "30000"  # random ids in [1000, 30000) exist in every BERT-family vocabulary we ship
    engines = {"pytorch": _run_worker(["torch", args.model, names, vocab])}
    for variant in manifest.variants:
        engines[variant.id] = _run_worker(["variant", variant.id, names, vocab])

    base = engines["pytorch"]["shapes"]
    rows = [("engine", *(f"{k} p50 / p95 ms" for k in SHAPES), *(f"{k} vs torch" for k in SHAPES), "peak RSS MB")]
    for name, result in engines.items():
        s = result["shapes"]
        rows.append(
            (
                name,
                *(f"{s[k]['p50_ms']:.2f} / {s[k]['p95_ms']:.2f}" for k in SHAPES),
                *(f"{base[k]['p50_ms'] / s[k]['p50_ms']:.1f}x" for k in SHAPES),
                f"{result['peak_rss_mb']:.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"model latency: {manifest.name}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    print("| " + " | ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows[1:]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bundle": manifest.name,
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "cpu_count": os.cpu_count(),
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
