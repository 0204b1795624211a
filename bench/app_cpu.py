"""Where an image request's CPU goes inside ortpack's server, thread by thread, without HTTP.

    python bench/app_cpu.py [--bundle dist/mobilenet_v3_small] [--requests 2000] [--concurrency 8]

ortpack's application (serving/app.py: the route, the request context, admission, the memory
budget, the decode threads, the batcher and its model threads, the answer and the metrics) is
called in-process with the reference 1280x960 JPEG as base64 JSON, `concurrency` requests at once,
no socket and no uvicorn (bench/http_floor.py prices those). Each thread's CPU per request is read
from /proc and set beside the same work done alone: the decoder and the graph called directly on
one thread. Two runs:

- `served`: the bundle's decoder and graph, as the server runs them;
- `null`: the same app with a decoder and a model that return at once. What the event loop spends
  here is the app's own Python with its caches warm; the difference from `served` is what sharing
  two cores with the decode and the model costs it (cache and thread contention).

Image classification (`/v1/classify/json`, `image`) and image embeddings (`/v1/embeddings`,
`input`) bundles.

Then calls an event loop makes, alone and beside two threads running Python (as the decode and
model threads do between their native calls): a call that releases the GIL (a system call, numpy
over ~500 elements) must take it back behind them, which is why the server makes none of them on
the event loop per request. Writes bench/results/app_cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.image_serve import make_jpeg  # noqa: E402
from bench.serve_load import measured_on, table, write_results  # noqa: E402

ROUTES = {"image-classification": ("/v1/classify/json", "image"), "image-embedding": ("/v1/embeddings", "input")}
GROUPS = {"event loop": "MainThread", "decode threads": "ortpack-decode", "model threads": "ortpack-model"}


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[thread.name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def by_group(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """ms of CPU per request of each thread group, between two `thread_cpu` readings."""
    spent = {group: 0.0 for group in GROUPS}
    for name, seconds in after.items():
        for group, prefix in GROUPS.items():
            if name.startswith(prefix):
                spent[group] += seconds - before.get(name, 0.0)
    return {group: seconds * 1000 / requests for group, seconds in spent.items()}


def alone_ms(work: Callable[[], Any], calls: int) -> float:
    """ms of CPU per call of `work` on this thread, after two calls to warm it."""
    work(), work()
    began = time.thread_time()
    for _ in range(calls):
        work()
    return (time.thread_time() - began) * 1000 / calls


class NullDecoder:
    """Returns the same decoded image at once (its pixels still held in the memory budget)."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels

    def decode(self, data: Any, where: str = "image", reserve: Callable[[int], None] | None = None) -> np.ndarray:
        if reserve is not None:
            reserve(self.pixels.nbytes)
        return self.pixels


class NullModel:
    """Returns the same output row for every payload at once."""

    def __init__(self, row: dict[str, np.ndarray]) -> None:
        self.row = row

    def run(self, payloads: Any) -> list[dict[str, np.ndarray]]:
        return [self.row for _ in payloads]


def measure(bundle: Path, null: bool, requests: int, concurrency: int) -> dict[str, Any]:
    """One run: a service loaded from `bundle`, `requests` requests, `concurrency` at once."""
    from ortpack.serving.app import create_app
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    config = ServeConfig(bundle=str(bundle))
    service = load_service(bundle, config, Metrics())
    route, field = ROUTES[service.manifest.task]
    jpeg = make_jpeg()
    body = orjson.dumps({field: base64.b64encode(jpeg).decode()})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    app = create_app(service, config)
    engine = service.engine
    pixels = engine.decoder.decode(jpeg)
    alone = {
        "decode": alone_ms(lambda: engine.decoder.decode(jpeg), 200),
        "model": alone_ms(lambda: engine.run([pixels]), 200),
    }

    async def one() -> None:
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": "POST",
            "path": route,
            "raw_path": route.encode(),
            "query_string": b"",
            "headers": headers,
            "root_path": "",
            "scheme": "http",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 1),
            "ortpack.arrival": time.perf_counter(),
        }
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if delivered:
                await asyncio.Event().wait()  # the client never goes away
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        status: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(scope, receive, send)
        if status != [200]:
            raise RuntimeError(f"{route} answered {status}")

    async def run() -> dict[str, Any]:
        await service.start(config)
        if null:
            service.runtime.images.decoder = NullDecoder(pixels)
            service.batcher.backend = NullModel(engine.run([pixels])[0])
        await asyncio.gather(*[one() for _ in range(2 * concurrency)])  # every thread started and warm

        async def client(count: int) -> None:
            for _ in range(count):
                await one()

        before, began = thread_cpu(), time.perf_counter()
        await asyncio.gather(*[client(requests // concurrency) for _ in range(concurrency)])
        seconds, after = time.perf_counter() - began, thread_cpu()
        await service.stop()
        done = requests // concurrency * concurrency
        return {"requests_per_s": done / seconds, "cpu_ms_per_request": by_group(before, after, done)}

    import uvloop

    result = uvloop.run(run())
    result.update(task=service.manifest.task, route=route, mode="null" if null else "served", alone_ms=alone)
    return result


def gil_calls(calls: int = 300) -> list[dict[str, Any]]:
    """CPU and wall time per call of a few calls, alone and beside two threads running Python."""
    import random
    import uuid

    row = np.random.default_rng(0).random(1000, dtype=np.float32)
    ids = random.Random()
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    cases: dict[str, Callable[[], Any]] = {
        "uuid.uuid4().hex (os.urandom)": lambda: uuid.uuid4().hex,
        "random.Random().getrandbits(128)": lambda: ids.getrandbits(128),
        "os.pread of /proc/self/statm": lambda: os.pread(statm, 256, 0),
        "numpy: negate 1,000 floats": lambda: -row,
        "numpy: argpartition of 1,000 floats": lambda: np.argpartition(row, 995),
        "numpy: negate 400 floats": lambda: -row[:400],
        "numpy: argmax of 1,000 floats": lambda: row.argmax(),
    }

    def timed(work: Callable[[], Any]) -> tuple[float, float]:
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            work()
        return (time.thread_time() - cpu) * 1e6 / calls, (time.perf_counter() - wall) * 1e6 / calls

    alone = {name: timed(work) for name, work in cases.items()}
    busy = True

    def spin() -> None:
        while busy:
            pass

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for thread in spinners:
        thread.start()
    try:
        beside = {name: timed(work) for name, work in cases.items()}
    finally:
        busy = False
        for thread in spinners:
            thread.join()
        os.close(statm)
    return [
        {
            "call": name,
            "alone_cpu_us": alone[name][0],
            "beside_cpu_us": beside[name][0],
            "beside_wall_us": beside[name][1],
        }
        for name in cases
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "dist" / "mobilenet_v3_small")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "app_cpu.json"), help="JSON output")
    args = parser.parse_args()
    results: dict[str, Any] = {
        **measured_on(),
        "bundle": args.bundle.name,
        "runs": [measure(args.bundle, null, args.requests, args.concurrency) for null in (False, True)],
    }
    served = results["runs"][0]
    rows = [["run", "req/s", *(f"{group}, ms/request" for group in GROUPS)]]
    for run in results["runs"]:
        cpu = run["cpu_ms_per_request"]
        rows.append([run["mode"], f"{run['requests_per_s']:.0f}", *(f"{cpu[group]:.3f}" for group in GROUPS)])
    alone = served["alone_ms"]
    rows.append(["alone, one thread", "", "", f"{alone['decode']:.3f}", f"{alone['model']:.3f}"])
    cores = f"{results['cpu_count']} cores ({results['cpu']})"
    print(f"\n{args.bundle.name}, {served['route']}, in-process, c={args.concurrency}, {cores}")
    print(table(rows))
    results["gil_calls"] = gil_calls()
    rows = [["call", "alone: CPU us", "beside two busy threads: CPU us", "wall us"]]
    for call in results["gil_calls"]:
        rows.append(
            [
                call["call"],
                f"{call['alone_cpu_us']:.1f}",
                f"{call['beside_cpu_us']:.1f}",
                f"{call['beside_wall_us']:.1f}",
            ]
        )
    print("\ncalls on one thread, alone and beside two threads running Python")
    print(table(rows))
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
