"""The CPU an HTTP request costs a Python server that does nothing else, beside the bound it is
measured against.

    python bench/http_floor.py [--seconds 10]

bench/baselines/floor.py (uvicorn with httptools and uvloop, the stack ortpack-serve runs; the body
read, orjson's parse, pybase64's decode of an image, a fixed answer) under the workloads of
bench/bound_share.py: the reference 1280x960 JPEG as base64 JSON at c=50, and one sentence per
OpenAI embeddings request at c=32. Reported per request: the server's CPU and the load generator's
(wrk, on the same cores). With a task's bound in CPU per item (bench/bound_share.py), the highest
share any server on this stack could reach is bound / (bound + floor): what is left to reach a
share goal is the room above the floor. Writes bench/results/http_floor.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.image_serve import FILE_LUA, make_jpeg  # noqa: E402
from bench.serve_load import (  # noqa: E402
    LUA,
    free_port,
    measured_on,
    run_wrk_script,
    started_server,
    table,
    write_bodies,
    write_results,
)


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children (each wrk run is one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="duration of each measured run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "http_floor.json"), help="JSON output")
    args = parser.parse_args()
    results: dict[str, Any] = {
        **measured_on(),
        "runs": [],
    }
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "bench.baselines.floor:app", "--port", str(port)]
    command += ["--http", "httptools", "--loop", "uvloop", "--log-level", "warning", "--no-access-log"]
    with tempfile.TemporaryDirectory() as tmp, started_server("floor", command, {}, port) as (url, proc, _):
        image = Path(tmp) / "image.json"
        image.write_text(json.dumps({"image": base64.b64encode(make_jpeg()).decode()}))
        workloads = [
            ("image, base64 JSON", FILE_LUA, {"WRK_FILE": str(image), "WRK_TYPE": "application/json"}, 50),
            ("one sentence", LUA, {"WRK_BODIES": str(write_bodies(Path(tmp), "floor")[1])}, 32),
        ]
        for name, lua, env, connections in workloads:
            run_wrk_script(url, "/", lua, env, connections, 3, proc)  # warm-up, discarded
            before = children_cpu_s()
            run = run_wrk_script(url, "/", lua, env, connections, args.seconds, proc)
            run["client_cpu_ms_per_request"] = (children_cpu_s() - before) * 1000 / max(1, run["requests"])
            run.update(workload=name, concurrency=connections)
            results["runs"].append(run)
            print(f"  {name} c={connections}: {run['requests_per_s']:.0f} req/s", flush=True)
    rows = [["workload", "req/s", "server CPU ms/request", "wrk CPU ms/request"]]
    for run in results["runs"]:
        rows.append(
            [
                f"{run['workload']}, c={run['concurrency']}",
                f"{run['requests_per_s']:.0f}",
                f"{run['cpu_ms_per_request']:.3f}",
                f"{run['client_cpu_ms_per_request']:.3f}",
            ]
        )
    cores = f"{results['cpu_count']} cores ({results['cpu']})"
    print(f"\nthe floor: a do-nothing server on uvicorn + httptools + uvloop, {cores}")
    print(table(rows))
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
