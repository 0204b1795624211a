"""Is it the HTTP stack, or one process, that keeps a served task below its bound? The same server
behind other fronts, in alternating rounds.

    python bench/fronts.py --bundle dist/mobilenet_v3_small --workload image-json \
        [--fronts uvicorn,granian,two-processes] [--rounds 4] [--seconds 8] [--concurrency 50]

Fronts (each serves the bundle with the same service and application, serving/app.py):

- `uvicorn`: the server as shipped, `python -m ortpack.serving`: uvicorn with ortpack's protocol
  (serving/protocol.py) on httptools and uvloop, one process.
- `granian`: the same ASGI application behind granian, an HTTP server written in Rust: its own
  sockets, parser and body buffering, one worker process, uvloop for the application. What a native
  HTTP front would save. Needs granian (`make bench-fronts` installs it); skipped without it.
- `two-processes`: two servers of one model thread and one decode thread each
  (`--workers 1 --lone-threads 1`), on two ports, each loaded by its own wrk with half the
  connections: what worker processes would gain (two GILs, no thread of one waiting for the
  other's).

Each round measures every front in turn (their order alternates between rounds) on one of
bench/serve_ab.py's workloads, after 3 s of warm-up: requests/s, p99, the server's CPU per request
(every process and thread of it), the load generator's (wrk shares the two cores with the server;
a task's bound has no client) and the share of the machine's CPU left idle. Prints each run and
the medians; writes --out (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_ab import medians_of, print_medians, workload  # noqa: E402
from bench.serve_load import free_port, measured_on, run_wrk_script, started_server, write_results  # noqa: E402

FRONTS = ("uvicorn", "granian", "two-processes")
WARM_UP_S = 3


def granian_app() -> Any:
    """The server's ASGI application for granian (`--factory bench.fronts:granian_app`): the bundle
    and every option from ORTPACK_* variables, as `python -m ortpack.serving` reads them."""
    from ortpack.serving.app import create_app
    from ortpack.serving.config import parse_config
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    config = parse_config([])
    service = load_service(Path(config.bundle), config, Metrics())
    return create_app(service, config)


def server_command(front: str, bundle: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one server of `front` on `port`."""
    if front == "granian":
        command = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--loop", "uvloop", "--log-level", "warning"]
        command += ["--factory", "bench.fronts:granian_app"]
        env = {"ORTPACK_BUNDLE": str(bundle), "ORTPACK_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
        return command, env
    command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port)]
    command += ["--log-level", "warning"]
    if front == "two-processes":
        command += ["--workers", "1", "--lone-threads", "1"]
    return command, {}


@contextlib.contextmanager
def servers(front: str, bundle: Path) -> Iterator[list[tuple[str, psutil.Process]]]:
    """The front's servers, ready: (url, process) for each."""
    count = 2 if front == "two-processes" else 1
    with contextlib.ExitStack() as stack:
        started = []
        for i in range(count):
            port = free_port()
            command, env = server_command(front, bundle, port)
            url, handle, _ = stack.enter_context(started_server(f"{front} {i + 1}", command, env, port))
            started.append((url, handle))
        yield started


def one_run(
    front: str, bundle: Path, route: tuple[str, Path, dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    """One closed-loop run of `front`: its connections split evenly between its servers."""
    path, lua, lua_env = route
    with servers(front, bundle) as started:
        share = args.concurrency // len(started)

        def load(seconds: float) -> list[dict[str, Any]]:
            results: list[dict[str, Any]] = [{} for _ in started]

            def run(i: int) -> None:
                url, handle = started[i]
                results[i] = run_wrk_script(url, path, lua, lua_env, share, seconds, handle)

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(started))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if not all(results):
                raise SystemExit(f"{front}: a load run failed")
            return results

        load(WARM_UP_S)
        time.sleep(1)
        psutil.cpu_percent()  # the machine's CPU use is measured from here
        clients = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk's, once it has exited
        parts = load(args.seconds)
        idle = 1 - psutil.cpu_percent() / 100
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_s = after.ru_utime + after.ru_stime - clients.ru_utime - clients.ru_stime
    requests = sum(p["requests"] for p in parts)
    return {
        "requests_per_s": sum(p["requests_per_s"] for p in parts),
        "p99_ms": max(p["p99_ms"] for p in parts),
        "cpu_ms_per_request": sum(p["cpu_ms_per_request"] * p["requests"] for p in parts) / max(1, requests),
        "client_cpu_ms_per_request": client_s * 1000 / max(1, requests),
        "errors": sum(p["errors"] for p in parts),
        "idle_share": idle,
        "servers": parts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", required=True, help="the bundle every front serves")
    parser.add_argument("--workload", default="image-json", help="text, image-json or image-raw")
    parser.add_argument("--fronts", default=",".join(FRONTS), help="comma-separated: " + ", ".join(FRONTS))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fronts.json"))
    args = parser.parse_args()
    fronts = [f for f in args.fronts.split(",") if f]
    if unknown := [f for f in fronts if f not in FRONTS]:
        raise SystemExit(f"unknown fronts {unknown}: {', '.join(FRONTS)}")
    if "granian" in fronts and importlib.util.find_spec("granian") is None:
        print("granian is not installed (make bench-fronts installs it): its front is skipped", flush=True)
        fronts.remove("granian")
    bundle = Path(args.bundle).resolve()
    manifest = json.loads((bundle / "manifest.json").read_text())
    runs: dict[str, list[dict[str, Any]]] = {front: [] for front in fronts}
    with tempfile.TemporaryDirectory() as tmp:
        route = workload(args.workload, Path(tmp), manifest["name"])
        for round_ in range(args.rounds):
            for front in fronts if round_ % 2 == 0 else fronts[::-1]:
                result = one_run(front, bundle, route, args)
                runs[front].append(result)
                print(
                    f"round {round_ + 1} {front}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.0f} ms, "
                    f"CPU {result['cpu_ms_per_request']:.2f} ms/req"
                    f" (wrk {result['client_cpu_ms_per_request']:.2f}), idle {result['idle_share']:.0%}, "
                    f"errors {result['errors']}",
                    flush=True,
                )
    keys = ("requests_per_s", "p99_ms", "cpu_ms_per_request", "client_cpu_ms_per_request", "idle_share")
    medians = medians_of(runs, keys)
    first = medians[fronts[0]]["requests_per_s"]
    columns = {
        "req/s": lambda m: f"{m['requests_per_s']:.1f}",
        f"vs {fronts[0]}": lambda m: f"{m['requests_per_s'] / first:.2f}x",
        "p99 ms": lambda m: f"{m['p99_ms']:.0f}",
        "server CPU ms/req": lambda m: f"{m['cpu_ms_per_request']:.2f}",
        "wrk CPU ms/req": lambda m: f"{m['client_cpu_ms_per_request']:.2f}",
        "CPU idle": lambda m: f"{m['idle_share']:.0%}",
    }
    print_medians(args, manifest["name"], "front", medians, columns)
    results = {
        **measured_on(),
        "bundle": manifest["name"],
        "workload": args.workload,
        "concurrency": args.concurrency,
        "fronts": fronts,
        "granian": _version("granian"),
        "runs": runs,
        "medians": medians,
    }
    write_results(args.out, results)
    return 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
