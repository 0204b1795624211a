"""Each task's served share of its bound, measured in alternating rounds.

    python bench/bound_share.py [--tasks text,image,image-embedding,detection] [--rounds 6] [--seconds 6]

The bound of a task is its served variant's engine called directly: each item tokenized or
decoded and run through the graph alone (batch 1), two callers x one thread, no HTTP and no queue
(bench/serve_offline.py `sentence_rate`, `image_rate`). A
shared machine's speed drifts by 20-40 % within minutes (the same text bound read 828 and 513
sentences/s an hour apart on one VM), so a served run against a bound measured minutes before or
after it reads the drift as much as the server. Here each task's server is started once, warmed
up, and measured in rounds: a round runs the bound and the served load back to back (their order
alternates between rounds), and the share is that round's served rate over its bound. The median
round is reported with the range. Each round also gives the CPU per item of both sides (the bench
process during the bound, the server's process during the load): their ratio, the CPU share, is
what the server would serve of the bound if both had the cores to themselves (the time a VM's
host takes its cores away is in neither), and their difference what the server spends beyond the
bound per request.

Workloads (the ones bench/serve_load.py and bench/image_serve.py use): text, all-MiniLM-L6-v2, one
sentence per OpenAI embeddings request at c=32; image classification, MobileNetV3-small, the
reference 1280x960 ~400 KB JPEG as base64 JSON to /v1/classify/json at c=50; image embedding,
EfficientNet-Lite0 features, the same JPEG in an OpenAI embeddings request at c=50; detection, the
fall-detection YOLOv8s, the JPEG's bytes to /v1/detect at c=8. A task whose bundle is not in dist/
is skipped (bench/image_serve.py, embed_serve.py and detect_serve.py build theirs). The bound of
a JSON workload leaves the JSON and base64 out: they are the server's work, measured in its share.
Writes bench/results/bound_share.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.image_serve import FILE_LUA, make_jpeg  # noqa: E402
from bench.serve_load import (  # noqa: E402
    LUA,
    free_port,
    run_wrk_script,
    started_server,
    table,
    write_bodies,
    write_results,
)
from bench.serve_offline import image_rate, sentence_rate, served_engine  # noqa: E402
from ortpack.components.core.timing import LoadWatch  # noqa: E402
from ortpack.kernel.hardware import this_machine  # noqa: E402

DRAIN_S = 2.0  # after a load: wrk stops at its deadline, the server still answers what it accepted


@dataclass(frozen=True)
class Task:
    name: str
    bundle: str  # under dist/
    path: str  # the served route
    connections: int
    goal: float  # the served share issue 42 asks for


TASKS = {
    "text": Task("text", "all-MiniLM-L6-v2", "/v1/embeddings", 32, 0.95),
    "image": Task("image", "mobilenet_v3_small", "/v1/classify/json", 50, 0.90),
    "image-embedding": Task("image-embedding", "efficientnet-lite0-embedding", "/v1/embeddings", 50, 0.85),
    "detection": Task("detection", "fall-yolov8s", "/v1/detect", 8, 0.85),
}


def workload(task: Task, engine: Any, tmp: Path, jpeg: bytes) -> tuple[Path, dict[str, str], Any]:
    """The wrk script, its environment, and the bound's step for `task`."""
    if task.name == "text":
        bodies = write_bodies(tmp, task.bundle)[1]
        return LUA, {"WRK_BODIES": str(bodies)}, lambda s: sentence_rate(engine, s)
    body = tmp / f"{task.name}.body"
    if task.name == "detection":
        body.write_bytes(jpeg)
        kind = "image/jpeg"
    else:
        field = "image" if task.name == "image" else "input"
        body.write_text(json.dumps({field: base64.b64encode(jpeg).decode()}))
        kind = "application/json"
    return FILE_LUA, {"WRK_FILE": str(body), "WRK_TYPE": kind}, lambda s: image_rate(engine, jpeg, s)


def measure_task(task: Task, rounds: int, seconds: float, jpeg: bytes) -> dict[str, Any]:
    bundle = ROOT / "dist" / task.bundle
    port = free_port()
    command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port)]
    command += ["--log-level", "warning"]
    engine = served_engine(bundle, "auto")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, started_server(task.name, command, {}, port) as (url, proc, _):
        lua, env, bound_rate = workload(task, engine, Path(tmp), jpeg)
        run_wrk_script(url, task.path, lua, env, task.connections, 3, proc)  # warm-up, discarded
        time.sleep(DRAIN_S)
        for r in range(rounds):

            def bound() -> tuple[float, float]:
                cpu0 = time.process_time()
                with LoadWatch():
                    start = time.perf_counter()
                    rate = bound_rate(seconds)
                    items = rate * (time.perf_counter() - start)
                return rate, (time.process_time() - cpu0) * 1000 / max(1.0, items)

            def served() -> dict[str, Any]:
                result = run_wrk_script(url, task.path, lua, env, task.connections, seconds, proc)
                time.sleep(DRAIN_S)
                return result

            if r % 2 == 0:
                (rate, bound_cpu), load = bound(), served()
            else:
                load, (rate, bound_cpu) = served(), bound()
            row = {
                "bound_per_s": rate,
                "bound_cpu_ms_per_item": bound_cpu,
                "served_per_s": load["requests_per_s"],
                "served_cpu_ms_per_request": load["cpu_ms_per_request"],
                "loop_cpu_ms_per_request": load["main_thread_cpu_ms_per_request"],
                "p99_ms": load["p99_ms"],
                "errors": load["errors"],
                "share": load["requests_per_s"] / rate,
                "cpu_share": bound_cpu / load["cpu_ms_per_request"],
            }
            rows.append(row)
            print(
                f"  round {r + 1}: bound {rate:.0f}/s, served {row['served_per_s']:.0f} req/s, "
                f"share {row['share']:.0%}; CPU ms per item: bound {bound_cpu:.2f}, served "
                f"{row['served_cpu_ms_per_request']:.2f} (event loop {row['loop_cpu_ms_per_request']:.2f})",
                flush=True,
            )
    shares = [row["share"] for row in rows]
    cpu_shares = [row["cpu_share"] for row in rows]
    extra = [row["served_cpu_ms_per_request"] - row["bound_cpu_ms_per_item"] for row in rows]
    return {
        "task": task.name,
        "bundle": task.bundle,
        "route": task.path,
        "concurrency": task.connections,
        "goal": task.goal,
        "rounds": rows,
        "median_share": statistics.median(shares),
        "min_share": min(shares),
        "max_share": max(shares),
        "median_cpu_share": statistics.median(cpu_shares),
        "median_served_per_s": statistics.median(row["served_per_s"] for row in rows),
        "median_bound_per_s": statistics.median(row["bound_per_s"] for row in rows),
        "median_cpu_beyond_bound_ms": statistics.median(extra),
    }


def report(results: dict[str, Any]) -> None:
    print(f"\nserved share of the bound, {results['rounds']} alternating rounds of {results['seconds']:.0f} s each,")
    print(f"{results['cpu_count']} cores ({results['cpu']}, {results['int8_kernel']} int8 kernels)")
    rows = [
        [
            "task",
            "workload",
            "bound /s (median)",
            "served /s (median)",
            "share: median (range)",
            "goal",
            "CPU share (median)",
            "server CPU beyond the bound, ms/request",
        ]
    ]
    for t in results["tasks"]:
        rows.append(
            [
                t["task"],
                f"{t['route']} c={t['concurrency']}",
                f"{t['median_bound_per_s']:.0f}",
                f"{t['median_served_per_s']:.0f}",
                f"{t['median_share']:.0%} ({t['min_share']:.0%}-{t['max_share']:.0%})",
                f"{t['goal']:.0%}",
                f"{t['median_cpu_share']:.0%}",
                f"{t['median_cpu_beyond_bound_ms']:.2f}",
            ]
        )
    print(table(rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    parser.add_argument("--rounds", type=int, default=6, help="alternating bound/served rounds per task")
    parser.add_argument("--seconds", type=float, default=6, help="duration of each bound and each load")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bound_share.json"), help="JSON output")
    args = parser.parse_args()
    machine = this_machine()
    results: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": machine.cpu_model,
        "int8_kernel": machine.int8_kernel,
        "cpu_count": os.cpu_count(),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "tasks": [],
    }
    jpeg = make_jpeg()
    for name in args.tasks.split(","):
        task = TASKS[name]
        if not (ROOT / "dist" / task.bundle).is_dir():
            print(f"{name}: no dist/{task.bundle}, skipped (its bench builds it)", flush=True)
            continue
        print(f"{name}: dist/{task.bundle}, {task.path} at c={task.connections}", flush=True)
        results["tasks"].append(measure_task(task, args.rounds, args.seconds, jpeg))
    report(results)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
