"""The offline side of bench/serve_load.py: what the served variant does without HTTP.

The engine called directly (no HTTP, no queue): the throughput of two one-thread callers at batch
1 and 8 (the bound a server can approach), the latency of one call on a one-thread session and on
the server's lone session, the CPU cost of each layer of ortpack's server per single-sentence
request, and the machine's measured int8 peak against what one sentence costs of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "components" / "core" / "data" / "retrieval_queries.jsonl"  # the shipped queries


def shipped_queries() -> list[str]:
    """The shipped retrieval queries, one sentence each."""
    return [json.loads(line) for line in QUERIES.read_text().splitlines() if line.strip()]


def offline_latency(bundle: Path, variant: str, calls: int = 600) -> dict[str, float]:
    """The engine bound at concurrency 1: p50 ms of one sentence, batch 1, called directly, on a
    one-thread worker session and on the lone session (every core), in alternate calls."""
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    config = ServeConfig(bundle=str(bundle), variant=variant)
    service = load_service(bundle, config, Metrics())
    service.open_lone(config.max_batch_size)  # as the server does once ready
    queries = shipped_queries()
    payloads = service.engine.encoder.encode(queries).payloads
    engines: dict[str, Any] = {"1 thread": service.engine}
    if service.batcher.lone_backend is not None:
        engines[f"lone ({service.batcher.lone_threads} threads)"] = service.batcher.lone_backend
    times: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(calls + 50):
        for name, backend in engines.items():
            t0 = time.perf_counter()
            backend.run([payloads[i % len(payloads)]])
            if i >= 50:
                times[name].append(time.perf_counter() - t0)
            time.sleep(0.001)  # a lone session's spinning threads settle before the next engine
    return {name: sorted(t)[len(t) // 2] * 1000 for name, t in times.items()}


def per_second(step: Callable[[int, int], int], seconds: float, callers: int = 2) -> float:
    """Items per second when `callers` threads each call `step(caller, i)` (its i-th call, which
    returns the items it did) in a loop for `seconds`: the bound of a server's model workers."""
    done = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def work(caller: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            items = step(caller, i)
            i += 1
            with lock:
                done[0] += items

    threads = [threading.Thread(target=work, args=(k,)) for k in range(callers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / (time.perf_counter() - t0)


def served_engine(bundle: Path, variant: str) -> Any:
    """The engine `ortpack-serve --variant VARIANT` would run on this machine (its node check and
    plan included), loaded in this process."""
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    return load_service(bundle, ServeConfig(bundle=str(bundle), variant=variant), Metrics()).engine


def text_payloads(engine: Any) -> list[Any]:
    """The shipped queries, tokenized by `engine`: one payload per sentence."""
    queries = shipped_queries()
    return list(engine.encoder.encode(queries).payloads)


def text_rate(engine: Any, payloads: list[Any], batch: int, seconds: float) -> float:
    """Sentences per second: `engine.run` on groups of `batch` tokenized sentences, two callers x
    one thread (the callers take alternate groups)."""
    groups = [payloads[i : i + batch] for i in range(0, len(payloads) - batch + 1, batch)]
    for g in groups[:20]:
        engine.run(g)

    def step(caller: int, i: int) -> int:
        group = groups[(caller + 2 * i) % len(groups)]
        engine.run(group)
        return len(group)

    return per_second(step, seconds)


def sentence_rate(engine: Any, seconds: float) -> float:
    """Sentences per second: each of the shipped queries tokenized and run alone (batch 1), two
    callers x one thread: the bound of a one-sentence-per-request workload, tokenizing included
    (the server tokenizes each request's sentence too)."""
    queries = shipped_queries()
    for q in queries[:20]:
        engine.run(engine.encoder.encode([q]).payloads)

    def step(caller: int, i: int) -> int:
        engine.run(engine.encoder.encode([queries[(caller + 2 * i) % len(queries)]]).payloads)
        return 1

    return per_second(step, seconds)


def image_rate(engine: Any, data: bytes, seconds: float) -> float:
    """Images per second: the engine's decoder and graph on the encoded file `data`, batch 1, two
    callers x one thread."""
    for _ in range(5):
        engine.run([engine.decoder.decode(data)])

    def step(caller: int, i: int) -> int:
        engine.run([engine.decoder.decode(data)])
        return 1

    return per_second(step, seconds)


def offline_bound(bundle: Path, variant: str, seconds: float = 4.0) -> dict[str, float]:
    """The served variant called directly (no HTTP, no queue): two callers x one thread, the
    configuration the server runs under load, at batch 1 and 8; sentences per second."""
    engine = served_engine(bundle, variant)
    payloads = text_payloads(engine)
    return {f"batch_{batch}": text_rate(engine, payloads, batch, seconds) for batch in (1, 8)}


def image_bound(bundle: Path, variant: str, files: dict[str, bytes], seconds: float = 4.0) -> dict[str, float]:
    """An image task's bound for each encoded file in `files`: the served variant's own engine
    (its decoder, in the decode mode the server picks, and its graph) called directly, no HTTP, no
    queue, two callers x one thread at batch 1; images per second. For a base64 JSON workload
    the base64 decode is the server's work too: give the file's bytes, the bound then leaves the
    JSON and base64 out (the served share measures them with the rest)."""
    engine = served_engine(bundle, variant)
    return {name: image_rate(engine, data, seconds) for name, data in files.items()}


def layer_costs(bundle: Path, variant: str, http_cpu_ms: float) -> dict[str, float]:
    """Microseconds of CPU per single-sentence request in each layer of ortpack's server."""
    import numpy as np
    import orjson

    from ortpack.serving.batcher import Batcher
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    service = load_service(bundle, ServeConfig(bundle=str(bundle), variant=variant), Metrics())
    queries = shipped_queries()
    bodies = [orjson.dumps({"input": q, "model": "m"}) for q in queries]
    encoded = [service.engine.encoder.encode([q]) for q in queries]

    def per_call(fn: Any, n: int = 2000) -> float:
        t0 = time.thread_time()
        for i in range(n):
            fn(i % len(queries))
        return (time.thread_time() - t0) / n * 1e6

    row = np.zeros(service.manifest.sizes["dim"], dtype=np.float32)
    costs = {
        "json parse": per_call(lambda i: orjson.loads(bodies[i])),
        "tokenize": per_call(lambda i: service.engine.encoder.encode([queries[i]])),
        "json answer": per_call(
            lambda i: orjson.dumps(
                {
                    "object": "list",
                    "data": [{"object": "embedding", "index": 0, "embedding": row}],
                    "model": "m",
                    "usage": {"prompt_tokens": 20, "total_tokens": 20},
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
        ),
        "onnx runtime (batch 1, 1 thread)": per_call(lambda i: service.engine.run(encoded[i].payloads), 800),
    }

    class NullBackend:
        def run(self, payloads: Any) -> Any:
            return np.zeros((len(payloads), 4), dtype=np.float32)

    async def queue_round_trips(n: int = 3000) -> float:
        batcher = Batcher(NullBackend(), max_batch_size=32, max_queue_size=1024, workers=2)
        batcher.start()
        t0 = time.process_time()  # the loop thread and the worker threads: the whole queue layer
        for i in range(n):
            await batcher.submit([encoded[i % len(encoded)].payloads[0]], [32], 10.0)
        used = time.process_time() - t0
        await batcher.stop()
        return used / n * 1e6

    costs["queue (batcher + thread hand-off)"] = asyncio.run(queue_round_trips())
    costs["http (uvicorn + routing + metrics, from a no-op route under load)"] = http_cpu_ms * 1000
    return costs


def int8_peak_share(bundle: Path, variant: str) -> dict[str, float]:
    """The machine's measured int8 peak and what one sentence costs of it (bench/engine_options.py):
    multiply-accumulates per second of ORT's MatMulInteger on every core, and the variant's int8
    multiply-accumulates per sentence of the shipped queries (0 for a variant without int8 products)."""
    import numpy as np

    from bench.engine_options import int8_macs_per_token, int8_peak
    from ortpack.kernel.bundle import read_manifest, read_verified
    from ortpack.kernel.contracts import TextSettings
    from ortpack.kernel.tokenizer import TextEncoder

    manifest = read_manifest(bundle)
    model = read_verified(bundle, manifest, manifest.variant(variant).file)
    settings = manifest.task_settings
    assert isinstance(settings, TextSettings), "bench/serve_load.py measures text bundles"
    encoder = TextEncoder(
        read_verified(bundle, manifest, settings.tokenizer.file).decode(),
        max_tokens=settings.tokenizer.max_length,
        truncate=True,
        buckets=(8,),
    )
    queries = shipped_queries()
    tokens = float(np.mean([len(p) for p in encoder.encode(queries).payloads]))
    return {
        "int8_peak_macs_per_s": int8_peak(len(os.sched_getaffinity(0))),
        "int8_macs_per_sentence": tokens * int8_macs_per_token(model),
    }
