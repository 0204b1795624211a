"""Fairness benchmark: single-sentence probes while a 300 x 4 KB request runs.

    python bench/fairness.py [--bundle dist/all-MiniLM-L6-v2] [--rounds 3] [--label after]
                             [--server-root DIR]

One ortpack server on the bundle (int8, default options). Each round posts one request of 300
texts of 4 KB (truncated to the model's max length), and while it runs, a single sentence (16-32
tokens, from components/core/data/retrieval_queries.jsonl) every 50 ms, open loop (each probe leaves on time however
long the others wait, like independent users). Reported: the probes' p50/p99/max latency and
count, and the big request's latency. `--server-root` runs the server from another checkout (e.g. the code
before a change) with this script's load. Prints a table and merges the run into
bench/results/fairness.json under `--label`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_load import QUERIES, free_port, started_server  # noqa: E402
from ortpack.components.core.timing import LoadWatch  # noqa: E402

BIG_ITEMS = 300
TEXT_BYTES = 4096


def big_texts(queries: list[str]) -> list[str]:
    texts = []
    for i in range(BIG_ITEMS):
        text, k = "", i
        while len(text) < TEXT_BYTES:
            text += queries[k % len(queries)] + " "
            k += 7
        texts.append(text[:TEXT_BYTES])
    return texts


async def one_round(
    url: str, texts: list[str], queries: list[str], interval_s: float
) -> tuple[float, list[float], int]:
    """One big request, and a single-sentence probe every `interval_s` (open loop: each probe is
    sent on time whatever the others wait, as independent users would) until it is answered:
    (its seconds, the probes' seconds, errors)."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def timed(body: dict[str, Any]) -> tuple[float, int]:
            started = time.perf_counter()
            answer = await client.post("/v1/embeddings", json=body)
            return time.perf_counter() - started, answer.status_code

        big = asyncio.ensure_future(timed({"input": texts}))
        probes = []
        i = 0
        await asyncio.sleep(interval_s)
        while not big.done():
            probes.append(asyncio.ensure_future(timed({"input": queries[i % len(queries)]})))
            i += 1
            await asyncio.sleep(interval_s)
        big_seconds, big_status = await big
        answers = await asyncio.gather(*probes)
    errors = int(big_status != 200) + sum(status != 200 for _, status in answers)
    return big_seconds, [seconds for seconds, _ in answers], errors


def measure(url: str, queries: list[str], rounds: int, interval_s: float = 0.05) -> dict[str, Any]:
    texts = big_texts(queries)
    probes: list[float] = []
    bigs: list[float] = []
    errors = 0
    for _ in range(rounds):
        seconds, latencies, failed = asyncio.run(one_round(url, texts, queries, interval_s))
        bigs.append(seconds)
        probes += latencies
        errors += failed
    ms = np.array(probes) * 1000 if probes else np.array([np.nan])
    return {
        "probes": len(probes),
        "probe_p50_ms": float(np.percentile(ms, 50)),
        "probe_p99_ms": float(np.percentile(ms, 99)),
        "probe_max_ms": float(ms.max()),
        "big_request_s": float(np.mean(bigs)),
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"), help="bundle to serve")
    parser.add_argument("--rounds", type=int, default=3, help="big requests, one after another")
    parser.add_argument("--label", default="after", help="name of this run in the results file")
    parser.add_argument("--server-root", default=str(ROOT), help="checkout whose serving/ package runs the server")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fairness.json"), help="JSON output")
    args = parser.parse_args()
    queries = [json.loads(line) for line in QUERIES.read_text().splitlines() if line.strip()]
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "ortpack.serving",
        "--bundle",
        args.bundle,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with started_server("ortpack", command, {"PYTHONPATH": args.server_root}, port, cwd=Path(args.server_root)) as (
        url,
        _,
        _,
    ):
        for _ in range(3):  # warm the tokenizer and every shape this load touches
            httpx.post(f"{url}/v1/embeddings", json={"input": queries[:8]}, timeout=60)
        with LoadWatch() as load:
            result = measure(url, queries, args.rounds)
    print(f"| run | probes | probe p50 ms | probe p99 ms | probe max ms | {BIG_ITEMS} x 4 KB request s | errors |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.label} | {result['probes']} | {result['probe_p50_ms']:.1f} | {result['probe_p99_ms']:.1f} | "
        f"{result['probe_max_ms']:.1f} | {result['big_request_s']:.2f} | {result['errors']} |"
    )
    print(load.record.describe())
    out = Path(args.out)
    saved = json.loads(out.read_text()) if out.exists() else {}
    saved[args.label] = {
        **result,
        **load.record.as_stats(),  # load_*: the load before and after the rounds (timing.LoadRecord)
        "bundle": args.bundle,
        "rounds": args.rounds,
        "machine": platform.processor() or platform.machine(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
