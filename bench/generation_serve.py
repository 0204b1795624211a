"""Generation served: streams of tokens over HTTP from ortpack's server, at 1, 8, 16 and 32 concurrent
streams; a 2,000-token prompt arriving while others stream (chunked prefill); and 200 long
requests at once against a memory limit.

    python bench/generation_serve.py [--bundle DIR] [--variant cpu-int4] [--seconds 20] \
        [--parts streams,prefill,memory] [--out bench/results/generation_serve.json]

The bundle (default: built once under build/bench-generation/ from bench/generation.py's export of
the Qwen2-0.5B-shaped random checkpoint, with ortpack's optimize, validate, benchmark and package
steps; random weights cannot pass the int4 gate, so its thresholds are lifted and the bundle says
so in its parity record) is served by `ortpack-serve` as shipped. Clients are asyncio + httpx
reading server-sent events in one process on the same 2 cores (its CPU is counted in the report).

- streams: each of C clients sends completion requests back to back (a 100-token prompt, 64 new
  tokens, end-of-sequence ignored, greedy) for `--seconds`: aggregate generated tokens/s, time to
  first token and inter-token latency (the gaps between a stream's events) at p50 and p99.
- prefill: 8 streams of 256 tokens run; after 4 s one request with a 2,000-token prompt arrives.
  The 8 streams' p99 inter-token latency while it is prefilled, against the 4 s before it.
- memory: `--max-memory 3G`; 200 requests of 1,000-token prompts and max_tokens 128 at once: how
  many were served, refused (429) or failed (5xx), and the server's peak resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_load import free_port, measured_on, rss_mb, tree, wait_ready, write_results  # noqa: E402

WORK = ROOT / "build" / "bench-generation"
LIFTED = {"int4.min_top1_agreement": 0.0, "int4.mean_kl": 1000.0, "int4.perplexity_ratio": 1000.0}


def bench_bundle(precision: str) -> Path:
    """ortpack's steps on bench/generation.py's export: one variant, validated with the gate lifted
    (random weights), benchmarked and packaged (built once)."""
    from ortpack.components.core.artifacts import VariantRecord
    from ortpack.components.core.benchmark import benchmark_variant
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.package import package_bundle
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    out = WORK / f"bundle-{precision}"
    if (out / "manifest.json").is_file():
        return out
    export_dir = WORK / "export"
    if not (export_dir / "export.json").is_file():
        raise SystemExit("no export: run bench/generation.py first (it builds build/bench-generation/export)")
    variant = VariantSpec(target="cpu", precision=precision)
    vdir = WORK / "serve-variants" / variant.id
    overrides = {k.split(".", 1)[1]: v for k, v in LIFTED.items() if k.startswith(precision + ".")}
    gate = thresholds_for("text-generation", precision, {precision: overrides})
    built = optimize_model(export_dir, variant, vdir, thresholds=gate)
    parity = validate_variant(vdir, export_dir, gate)
    bench = benchmark_variant(vdir, export_dir)
    package_bundle(export_dir, [VariantRecord(model_dir=vdir, built=built, parity=parity, benchmark=bench)], out)
    return out


@contextlib.contextmanager
def serving(bundle: Path, *options: str) -> Iterator[tuple[str, psutil.Process]]:
    port = free_port()
    command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port), *options]
    log = open(WORK / f"server-{port}.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout=600)
        yield url, psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def prompt_text(tokens: int, seed: int) -> list[int]:
    """A prompt of exactly `tokens` random token ids (OpenAI completions take ids)."""
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(100, 150000, tokens)]


async def stream(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed completion: its status, the arrival time of each event with text (one token
    each with the bench tokenizer), and the tokens its usage counts."""
    sent = time.perf_counter()
    stamps: list[float] = []
    tokens = prompt = 0
    request = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=request) as response:
        if response.status_code != 200:
            await response.aread()
            return {"status": response.status_code, "sent": sent, "stamps": [], "tokens": 0}
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens, prompt = event["usage"]["completion_tokens"], event["usage"]["prompt_tokens"]
            elif event["choices"] and event["choices"][0]["text"]:
                stamps.append(time.perf_counter())
    return {"status": 200, "sent": sent, "stamps": stamps, "tokens": tokens, "prompt": prompt}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def streams_at(url: str, concurrency: int, seconds: float, model: str) -> dict[str, Any]:
    """C clients, each sending the next request when its last ended, for `seconds`."""
    results: list[dict[str, Any]] = []
    stop = time.perf_counter() + seconds

    async def client_loop(index: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            n = 0
            while time.perf_counter() < stop:
                body = {"model": model, "prompt": prompt_text(100, 1000 * index + n), "max_tokens": 64}
                results.append(await stream(client, {**body, "temperature": 0, "ignore_eos": True}))
                n += 1

    started = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
    wall = time.perf_counter() - started
    ok = [r for r in results if r["status"] == 200 and r["stamps"]]
    gaps = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    ttft = [r["stamps"][0] - r["sent"] for r in ok]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "tokens_per_s": tokens / wall,
        "prompt_tokens": float(np.mean([r["prompt"] for r in ok])) if ok else float("nan"),
        "ttft_p50_ms": _pct(ttft, 50) * 1000,
        "ttft_p99_ms": _pct(ttft, 99) * 1000,
        "itl_p50_ms": _pct(gaps, 50) * 1000,
        "itl_p99_ms": _pct(gaps, 99) * 1000,
    }


async def long_prompt_arrives(url: str, model: str) -> dict[str, Any]:
    """8 streams of 256 tokens; after 4 s a 2,000-token prompt (its prefill chunked between their
    decode steps). Their inter-token gaps before it, and while it is prefilled."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        runners = [
            asyncio.create_task(
                stream(
                    client,
                    {"model": model, "prompt": prompt_text(100, i), "max_tokens": 256, "ignore_eos": True},
                )
            )
            for i in range(8)
        ]
        await asyncio.sleep(4.0)
        long = await stream(client, {"model": model, "prompt": prompt_text(2000, 99), "max_tokens": 8})
        done = await asyncio.gather(*runners)
    arrival, first = long["sent"], long["stamps"][0] if long["stamps"] else float("nan")

    def gaps(lo: float, hi: float) -> list[float]:
        return [b - a for r in done for a, b in zip(r["stamps"], r["stamps"][1:], strict=False) if lo <= b <= hi]

    before, during = gaps(arrival - 3.0, arrival), gaps(arrival, first)
    return {
        "long_prompt_ttft_s": first - arrival,
        "itl_p50_before_ms": _pct(before, 50) * 1000,
        "itl_p50_during_ms": _pct(during, 50) * 1000,
        "itl_p99_before_ms": _pct(before, 99) * 1000,
        "itl_p99_during_ms": _pct(during, 99) * 1000,
        "ratio": _pct(during, 99) / _pct(before, 99),
        "ratio_p50": _pct(during, 50) / _pct(before, 50),
        "gaps_before": len(before),
        "gaps_during": len(during),
    }


async def flood(url: str, model: str, count: int, process: psutil.Process) -> dict[str, Any]:
    """`count` long requests at once; the server's peak resident memory, sampled every 50 ms."""
    peak, stop = 0.0, asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, sum(rss_mb(p) for p in tree(process)))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:

        async def one(i: int) -> int:
            body = {"model": model, "prompt": prompt_text(1000, 5000 + i), "max_tokens": 128, "ignore_eos": True}
            return (await client.post("/v1/completions", json=body)).status_code

        codes = await asyncio.gather(*(one(i) for i in range(count)))
    stop.set()
    await sampler
    return {
        "requests": count,
        "served": codes.count(200),
        "refused_429": codes.count(429),
        "server_errors": sum(1 for c in codes if c >= 500),
        "other": sorted({c for c in codes if c not in (200, 429) and c < 500}),
        "peak_rss_mb": peak,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--variant", default="cpu-int4")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", default="1,8,16,32")
    parser.add_argument("--parts", default="streams,prefill,memory")
    parser.add_argument("--max-memory", default="3G")
    parser.add_argument("--out", default="bench/results/generation_serve.json")
    parser.add_argument(
        "--server-option", action="append", default=[], help="passed to ortpack-serve, e.g. --prefill-share=0.5"
    )
    args = parser.parse_args()
    bundle = args.bundle or bench_bundle(args.variant.split("-", 1)[1])
    model = json.loads((bundle / "manifest.json").read_text())["name"]
    parts = set(args.parts.split(","))
    common = (
        "--variant",
        args.variant,
        "--request-timeout-ms",
        "1800000",
        "--max-waiting-sequences",
        "1024",
        *args.server_option,
    )
    results: dict[str, Any] = {
        **measured_on(),
        "bundle": str(bundle),
        "variant": args.variant,
        "server_options": common,
    }
    if "streams" in parts or "prefill" in parts:
        with serving(bundle, *common) as (url, _):
            if "streams" in parts:
                asyncio.run(streams_at(url, 1, 5.0, model))  # warm: discarded
                rows = [asyncio.run(streams_at(url, int(c), args.seconds, model)) for c in args.concurrency.split(",")]
                single = rows[0]["tokens_per_s"]
                for row in rows:
                    row["vs_one_stream"] = row["tokens_per_s"] / single
                    print(json.dumps(row), flush=True)
                results["streams"] = rows
            if "prefill" in parts:
                results["prefill"] = asyncio.run(long_prompt_arrives(url, model))
                print(json.dumps(results["prefill"]), flush=True)
    if "memory" in parts:
        with serving(bundle, *common, "--max-memory", args.max_memory) as (url, process):
            results["memory"] = {"max_memory": args.max_memory, **asyncio.run(flood(url, model, 200, process))}
            print(json.dumps(results["memory"]), flush=True)
    if "streams" in results:
        print("\nstreams  tokens/s  vs 1  TTFT p50 ms  ITL p50 ms  ITL p99 ms  errors")
        for row in results["streams"]:
            print(
                f"{row['concurrency']:>7}  {row['tokens_per_s']:>8.1f}  {row['vs_one_stream']:>4.1f}  "
                f"{row['ttft_p50_ms']:>11.0f}  {row['itl_p50_ms']:>10.1f}  {row['itl_p99_ms']:>10.1f}  "
                f"{row['errors']:>6}"
            )
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
