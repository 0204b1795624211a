"""Overload: what the server answers when more is asked of it than it can do, in one run.

    python bench/overload.py [--bundle dist/all-MiniLM-L6-v2] [--image-bundle DIR [--images-only]] [--seconds 40]
        [--compare-with DIR] [--loads 'at once' --repeat 3] [--out bench/results/overload.json]

Batch clients of the kind a re-indexing job runs (each request 64 texts of ~2,000 characters, so
~256 tokens each after truncation), closed loop (each client sends its next request when the last
is answered; after a 429 it waits the Retry-After, at most 1 s), against `ortpack-serve` with its
defaults and `--max-memory 1Gi` (the deployment's limit, deploy/base/deployment.yaml):

- 8 clients (the knee: what the server does when it is just busy); 3x overload: three times the
  clients whose requests the 30 s deadline holds at the knee's throughput (knee req/s x 30 x 3);
  200 clients;
- a mixed load: 8 interactive clients sending one sentence each beside 24 batch clients;
- a flood: 300 clients sending one request each of 1,024 texts (2 MB bodies) at once, while a
  probe polls /v2/health/ready;
- with `--image-bundle`: 100 clients sending 4000x3000 JPEG photos at once.

Per run: goodput (answers 200 within the 30 s deadline, per second), 200s, 429s, 504s, resets (a
connection error where an answer was due: the client lost it) and other errors, the p99 of the
interactive clients, the slowest refusal (time to a 429), peak RSS of the
server process, and readiness failures during the run. `--compare-with DIR` runs the same loads
against `python -m ortpack.serving` (or `python -m serving`, for a tree from before the ortpack
package) from DIR first (e.g. `git worktree add DIR REV`), so before and after are measured in one
run. Load comes from this process (asyncio, raw HTTP/1.1, bodies encoded once), which shares the
machine's cores with the server: the numbers are the server's under that load. Prints tables,
writes `--out` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import platform
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_load import free_port, rss_mb, table, wait_ready, write_results  # noqa: E402

DEADLINE_S = 30.0
KNEE, OVERLOAD = "8 batch clients (the knee)", "3x overload"
WORDS = ("index", "vector", "search", "cluster", "document", "retrieval", "embedding", "query", "shard", "replica")


@dataclass
class Outcome:
    """What one run's clients saw."""

    name: str
    seconds: float = 0.0
    ok: int = 0
    ok_late: int = 0  # 200s that arrived after the deadline (clients would have given up)
    refused: int = 0  # 429
    timeouts: int = 0  # 504
    other: int = 0  # any other status
    resets: int = 0  # a connection error (reset, broken pipe, closed before an answer): the answer was lost
    interactive_ms: list[float] = field(default_factory=list)
    refusal_ms: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    ready_failures: int = 0
    ready_polls: int = 0

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("interactive_ms", "refusal_ms")}
        out["goodput_per_s"] = self.ok / self.seconds if self.seconds else 0.0
        batch = self.ok - len(self.interactive_ms)  # the batch clients' answers in time
        out["batch_goodput_per_s"] = batch / self.seconds if self.seconds else 0.0
        out["interactive_p99_ms"] = _pct(self.interactive_ms, 99)
        out["interactive_requests"] = len(self.interactive_ms)
        out["refusal_p50_ms"] = _pct(self.refusal_ms, 50)
        out["refusal_p99_ms"] = _pct(self.refusal_ms, 99)
        out["refusal_max_ms"] = max(self.refusal_ms, default=0.0)
        return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def long_text(rng: random.Random, chars: int = 2000) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS) + str(rng.randint(0, 999)))
    return " ".join(words)[:chars]


def request_bytes(path: str, body: bytes, content_type: str = "application/json") -> tuple[bytes, bytes]:
    """(the request's head, its body)."""
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode(), body


async def exchange(port: int, raw: tuple[bytes, bytes], timeout: float) -> tuple[int, dict[str, str], float]:
    """One request on a new connection: (status, headers, seconds from its head sent to its answer);
    status 0 on a connection error. The body is written while the answer is awaited, and no more of
    it once the answer came (a server may refuse before reading it)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError):
        return 0, {}, 0.0
    head, body = raw
    started = time.perf_counter()

    async def send() -> None:
        with contextlib.suppress(OSError):
            for offset in range(0, len(body), 1 << 16):
                writer.write(body[offset : offset + (1 << 16)])
                await writer.drain()

    async def answer() -> tuple[int, dict[str, str], float]:
        line_and_headers = await reader.readuntil(b"\r\n\r\n")
        seconds = time.perf_counter() - started
        lines = line_and_headers.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        await reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, seconds

    try:
        writer.write(head)
        sending = asyncio.ensure_future(send())
        result = await asyncio.wait_for(answer(), timeout)
        sending.cancel()
        return result
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
        return 0, {}, time.perf_counter() - started
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def record(outcome: Outcome, status: int, seconds: float, interactive: bool) -> None:
    if status == 200 and seconds <= DEADLINE_S:
        outcome.ok += 1
        if interactive:
            outcome.interactive_ms.append(seconds * 1000)
    elif status == 200:
        outcome.ok_late += 1
    elif status == 429:
        outcome.refused += 1
        outcome.refusal_ms.append(seconds * 1000)
    elif status == 504:
        outcome.timeouts += 1
    elif status == 0:
        outcome.resets += 1
    else:
        outcome.other += 1


async def closed_loop(
    port: int, raw: tuple[bytes, bytes], until: float, outcome: Outcome, interactive: bool = False
) -> None:
    while time.perf_counter() < until:
        status, headers, seconds = await exchange(port, raw, DEADLINE_S + 10)
        record(outcome, status, seconds, interactive)
        if status == 429:
            wait = min(1.0, float(headers.get("retry-after", "1") or 1))
            await asyncio.sleep(wait)
        elif status == 0:
            await asyncio.sleep(0.1)


async def once(port: int, raw: tuple[bytes, bytes], outcome: Outcome) -> None:
    status, _, seconds = await exchange(port, raw, DEADLINE_S * 6)
    record(outcome, status, seconds, False)


async def poll_ready(port: int, until: asyncio.Event, outcome: Outcome) -> None:
    raw = (b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", b"")
    while not until.is_set():
        status, _, _ = await exchange(port, raw, 5)
        outcome.ready_polls += 1
        outcome.ready_failures += status != 200
        await asyncio.sleep(0.1)


@contextlib.contextmanager
def watched(process: psutil.Process, outcome: Outcome) -> Iterator[None]:
    """Sample the server's RSS every 50 ms while the block runs."""
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                outcome.peak_rss_mb = max(outcome.peak_rss_mb, rss_mb(process))
            done.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def run_load(name: str, port: int, process: psutil.Process, plan: dict[str, Any]) -> Outcome:
    outcome = Outcome(name)

    async def main() -> None:
        stop = asyncio.Event()
        poller = asyncio.ensure_future(poll_ready(port, stop, outcome))
        started = time.perf_counter()
        until = started + plan.get("seconds", 0.0)
        tasks = [closed_loop(port, plan["bulk"], until, outcome) for _ in range(plan.get("bulk_clients", 0))]
        tasks += [closed_loop(port, plan["one"], until, outcome, True) for _ in range(plan.get("interactive", 0))]
        tasks += [once(port, plan["flood"], outcome) for _ in range(plan.get("flood_clients", 0))]
        await asyncio.gather(*tasks)
        outcome.seconds = time.perf_counter() - started
        stop.set()
        await poller

    with watched(process, outcome):
        asyncio.run(main())
    s = outcome.summary()
    print(
        f"  {name}: batch goodput {s['batch_goodput_per_s']:.2f}/s ({outcome.ok} x 200, {outcome.refused} x 429, "
        f"{outcome.timeouts} x 504, {outcome.resets} resets, {outcome.other} other) in {outcome.seconds:.0f} s, "
        f"peak RSS {outcome.peak_rss_mb:.0f} MB, interactive p99 {s['interactive_p99_ms']:.0f} ms, slowest 429 "
        f"{s['refusal_max_ms']:.0f} ms, readiness failures {outcome.ready_failures}/{outcome.ready_polls}",
        flush=True,
    )
    return outcome


@contextlib.contextmanager
def server(command: list[str], cwd: Path, env: dict[str, str]) -> Iterator[tuple[int, psutil.Process]]:
    port = free_port()
    proc = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        yield port, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def text_plans(model: str, seconds: float) -> dict[str, dict[str, Any]]:
    rng = random.Random(7)
    bulk = json.dumps({"input": [long_text(rng) for _ in range(64)], "model": model}).encode()
    one = json.dumps({"input": "Where is the index of my documents stored?", "model": model}).encode()
    flood = json.dumps({"input": [long_text(rng) for _ in range(1024)], "model": model}).encode()
    raw = {k: request_bytes("/v1/embeddings", v) for k, v in (("bulk", bulk), ("one", one), ("flood", flood))}
    return {
        KNEE: {**raw, "bulk_clients": 8, "seconds": seconds},
        OVERLOAD: {**raw, "bulk_clients": 0, "seconds": seconds},  # set from the knee's throughput
        "200 batch clients": {**raw, "bulk_clients": 200, "seconds": seconds},
        "8 interactive + 24 batch": {**raw, "bulk_clients": 24, "interactive": 8, "seconds": seconds},
        "300 x 2 MB at once": {**raw, "flood_clients": 300},
    }


def image_plans() -> dict[str, dict[str, Any]]:
    from PIL import Image

    from ortpack.components.core.validation_data import ImageSpec, render_image

    buffer = io.BytesIO()
    Image.fromarray(render_image(ImageSpec(3000, 4000, "photo", 3))).save(buffer, "JPEG", quality=90)
    photo = request_bytes("/v1/classify", buffer.getvalue(), "image/jpeg")
    return {"100 x 4000x3000 JPEG at once": {"flood": photo, "flood_clients": 100}}


def chosen(plans: dict[str, dict[str, Any]], contains: str, repeat: int) -> dict[str, dict[str, Any]]:
    """The loads whose names contain `contains` (all for ""), each `repeat` times (run 2, 3... named so)."""
    picked = {name: plan for name, plan in plans.items() if contains in name}
    if OVERLOAD in picked and KNEE not in picked:
        picked = {KNEE: plans[KNEE], **picked}  # the 3x load is sized from the knee's throughput
    return {
        (name if run == 1 else f"{name}, run {run}"): plan
        for name, plan in picked.items()
        for run in range(1, repeat + 1)
    }


def commands(tree: Path | None) -> list[str]:
    if tree is not None and not (tree / "ortpack").is_dir():
        return [sys.executable, "-m", "serving"]  # a tree from before the ortpack package
    return [sys.executable, "-m", "ortpack.serving"]


def measure(
    label: str, tree: Path | None, bundle: Path, plans: dict[str, dict[str, Any]], max_memory: str = "1G"
) -> list[dict[str, Any]]:
    cwd = tree or ROOT
    env = {"PYTHONPATH": str(tree)} if tree is not None else {}
    command = [*commands(tree), "--bundle", str(bundle.resolve())]
    if max_memory and (tree is None or (tree / "serving" / "memory.py").is_file()):  # the old server has none
        command += ["--max-memory", max_memory]
    results = []
    knee = 0.0
    for name, plan in plans.items():
        if name == OVERLOAD:  # three times the clients the deadline holds at the knee's rate
            plan = {**plan, "bulk_clients": max(24, math.ceil(3 * knee * DEADLINE_S))}
            name = f"{plan['bulk_clients']} batch clients (3x)"
        with server(command, cwd, env) as (port, process):  # a fresh server per load: no carry-over
            outcome = run_load(f"{label}: {name}", port, process, plan)
            results.append({"server": label, "load": name, **outcome.summary()})
        if name == KNEE:
            knee = outcome.ok / outcome.seconds
    return results


def results_table(rows: list[dict[str, Any]]) -> str:
    header = [
        "server",
        "load",
        "batch goodput/s",
        "200",
        "429",
        "504",
        "reset",
        "other",
        "interactive p99 ms",
        "429 in ms p50/p99/max",
    ]
    header += ["peak RSS MB", "not ready"]
    body = [
        [
            r["server"],
            r["load"],
            f"{r['batch_goodput_per_s']:.2f}",
            str(r["ok"]),
            str(r["refused"]),
            str(r["timeouts"]),
            str(r.get("resets", 0)),
            str(r["other"] + r["ok_late"]),
            f"{r['interactive_p99_ms']:.0f}" if r["interactive_requests"] else "-",
            f"{r['refusal_p50_ms']:.0f}/{r['refusal_p99_ms']:.0f}/{r['refusal_max_ms']:.0f}" if r["refused"] else "-",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['ready_failures']}/{r['ready_polls']}",
        ]
        for r in rows
    ]
    return table([header, *body])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"))
    parser.add_argument("--image-bundle", default="")
    parser.add_argument("--images-only", action="store_true", help="with --image-bundle: skip the text loads")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--compare-with", default="", help="another tree to run first (before a change)")
    parser.add_argument("--loads", default="", help="only the loads whose names contain this (e.g. 'at once')")
    parser.add_argument("--repeat", type=int, default=1, help="run each chosen load this many times")
    parser.add_argument("--max-memory", default="1G", help="the servers' --max-memory ('': the machine's memory)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "overload.json"))
    args = parser.parse_args()

    from ortpack.kernel.bundle import read_manifest
    from ortpack.kernel.hardware import this_machine

    bundle = Path(args.bundle)
    plans = (
        {}
        if args.images_only
        else chosen(text_plans(read_manifest(bundle).name, args.seconds), args.loads, args.repeat)
    )
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if args.compare_with:
        trees.insert(0, ("before", Path(args.compare_with).resolve()))
    rows = []
    if args.images_only and not args.image_bundle:
        parser.error("--images-only needs --image-bundle")
    for label, tree in trees:
        if not args.images_only:
            rows += measure(label, tree, bundle, plans, args.max_memory)
        if args.image_bundle:
            images = chosen(image_plans(), args.loads, args.repeat)
            rows += measure(label, tree, Path(args.image_bundle), images, args.max_memory)
    print()
    print(results_table(rows))
    write_results(
        args.out,
        {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0))},
            "cpu_model": this_machine().cpu_model,
            "deadline_s": DEADLINE_S,
            "runs": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
