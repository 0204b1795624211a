"""Serving benchmark: a naive PyTorch + FastAPI server, a simple FastAPI + ONNX Runtime server and
ortpack's server, on the same bundle's model, in one run.

    python bench/serve_load.py [--bundle dist/all-MiniLM-L6-v2] [--seconds 10] [--variant cpu-int8]
        [--compare-with DIR] [--out bench/results/serve_load.json]

Load comes from `wrk` (C, closed loop: each connection sends its next request when the last is
answered), posting single sentences of 16-32 tokens from the shipped queries
(components/core/data/retrieval_queries.jsonl) at concurrency 1, 8 and 32, and 16-sentence
requests at concurrency 8. Every server gets a discarded warm-up
run first. Reported per run: requests/s, sentences/s, p50/p99 latency, errors (non-2xx and
socket), peak RSS of the server's process tree, and its CPU time per request; per server: cold
start (process start to readiness 200). For ortpack's server, also where a request's time went:
the mean of each stage of `ortpack_request_stage_seconds` over the run (scraped from /metrics
before and after it; serving/stages.py). Also: the offline bound (the same variant called
directly, no HTTP: the throughput of two one-thread callers, measured before and after the
servers and the higher taken, and the latency of one call on one thread and on the server's lone
session) and the CPU cost of each layer of ortpack's server.

`--compare-with DIR` adds another ortpack server run from DIR's `serving/` (e.g. the code before a
change: `git archive REV serving | tar -x -C DIR`), so before and after are measured in one run.
Every server serves the same variant (`--variant`, int8 by default: the simple server's). Prints
tables, writes `--out` (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_offline import int8_peak_share, layer_costs, offline_bound, offline_latency  # noqa: E402
from ortpack.components.core.timing import LoadRecord, LoadWatch  # noqa: E402

LUA = ROOT / "bench" / "wrk" / "post_bodies.lua"
QUERIES = ROOT / "components" / "core" / "data" / "retrieval_queries.jsonl"  # the shipped queries
WORKLOADS = [("1 sentence", 1, 1), ("1 sentence", 8, 1), ("1 sentence", 32, 1), ("16 sentences", 8, 16)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_commands(
    bundle: Path, port: int, variant: str = "cpu-int8", before: Path | None = None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    uvicorn = [
        sys.executable,
        "-m",
        "uvicorn",
        "--workers",
        "2",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    ortpack = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle.resolve()), "--port", str(port)]
    ortpack += ["--variant", variant, "--log-level", "warning"]
    commands = {
        "naive pytorch": ([*uvicorn, "bench.baselines.naive_torch:app"], {}),
        "simple ort int8": ([*uvicorn, "bench.baselines.simple_ort:app"], {"BUNDLE": str(bundle), "VARIANT": variant}),
        "ortpack": (ortpack, {}),
    }
    if before is not None:  # `python -m ortpack.serving` from DIR imports DIR/serving first
        commands[BEFORE] = (ortpack, {"PYTHONPATH": str(before.resolve()), "ORTPACK_CWD": str(before.resolve())})
    return commands


BEFORE = "ortpack before"
STAGE_ROUTE = "/v1/embeddings"


def stage_totals(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each stage of ortpack_request_stage_seconds on the embeddings route; empty
    for a server that does not export it (the peers, or ortpack before it did)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "ortpack_request_stage_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("route") != STAGE_ROUTE or sample.name.endswith("_bucket"):
                continue
            pair = totals.setdefault(sample.labels["stage"], [0.0, 0.0])
            pair[0 if sample.name.endswith("_sum") else 1] = sample.value
    return {stage: (pair[0], pair[1]) for stage, pair in totals.items()}


def stage_means_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean ms per request of each stage over a run, from two scrapes."""
    means = {}
    for stage, (total, count) in after.items():
        done = count - before.get(stage, (0.0, 0.0))[1]
        if done > 0:
            means[stage] = (total - before.get(stage, (0.0, 0.0))[0]) * 1000 / done
    return means


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def main_thread_seconds(proc: psutil.Process) -> float:
    """CPU seconds of `proc`'s main thread: in ortpack's server the event loop (HTTP, routing,
    JSON, the batcher's hand-offs, the answers); the model and decode threads are the others."""
    try:
        return next((t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid), 0.0)
    except psutil.NoSuchProcess:
        return 0.0


def cpu_seconds(proc: psutil.Process) -> float:
    total = 0.0
    for p in tree(proc):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_mb(proc: psutil.Process) -> float:
    total = 0
    for p in tree(proc):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 1e6


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> float:
    import urllib.request

    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as answer:
                if answer.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit(f"server at {url} not ready after {timeout} s")


def run_wrk(
    url: str, bodies: Path, connections: int, seconds: float, proc: psutil.Process, path: str = "/v1/embeddings"
) -> dict[str, Any]:
    """One closed-loop wrk run posting the request bodies in `bodies` (bench/wrk/post_bodies.lua)."""
    return run_wrk_script(url, path, LUA, {"WRK_BODIES": str(bodies)}, connections, seconds, proc)


def run_wrk_script(
    url: str, path: str, lua: Path, env: dict[str, str], connections: int, seconds: float, proc: psutil.Process
) -> dict[str, Any]:
    """One closed-loop wrk run of a Lua script that prints a `WRK_JSON {...}` summary: rates,
    latency, errors, peak RSS and CPU per request of the server process `proc`."""
    peak = [rss_mb(proc)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            peak[0] = max(peak[0], rss_mb(proc))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0, loop0 = cpu_seconds(proc), main_thread_seconds(proc)
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "30s"]
    with LoadWatch() as load:
        out = subprocess.run(
            [*command, "-s", str(lua), f"{url}{path}"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            check=True,
        ).stdout
    cpu1, loop1 = cpu_seconds(proc), main_thread_seconds(proc)
    stop.set()
    sampler.join()
    found = re.search(r"WRK_JSON (\{.*\})", out)
    if not found:
        raise SystemExit(f"wrk printed no summary:\n{out}")
    stats = json.loads(found.group(1))
    requests = max(1, stats["requests"])
    return {
        "requests_per_s": stats["requests"] / (stats["duration_us"] / 1e6),
        "p50_ms": stats["p50_us"] / 1000,
        "mean_ms": stats["mean_us"] / 1000,
        "p99_ms": stats["p99_us"] / 1000,
        "errors": sum(stats[k] for k in stats if k.startswith("errors_")),
        "peak_rss_mb": peak[0],
        "cpu_ms_per_request": (cpu1 - cpu0) * 1000 / requests,
        "main_thread_cpu_ms_per_request": (loop1 - loop0) * 1000 / requests,
        "requests": stats["requests"],
        **load.record.as_stats(),  # load_*: the load before and after the run (timing.LoadRecord)
    }


def write_bodies(directory: Path, model: str) -> dict[int, Path]:
    queries = [json.loads(line) for line in QUERIES.read_text().splitlines() if line.strip()]
    paths = {}
    for per_request in {w[2] for w in WORKLOADS}:
        path = directory / f"bodies-{per_request}.jsonl"
        with open(path, "w") as fh:
            for i in range(0, len(queries), 1 if per_request == 1 else 7):
                texts = [queries[(i + k) % len(queries)] for k in range(per_request)]
                fh.write(json.dumps({"input": texts[0] if per_request == 1 else texts, "model": model}) + "\n")
        paths[per_request] = path
    return paths


@contextlib.contextmanager
def started_server(
    name: str, command: list[str], env: dict[str, str], port: int, cwd: Path = ROOT
) -> Iterator[tuple[str, psutil.Process, float]]:
    """Start a server (its output discarded), wait for readiness; yield (url, process, cold start)."""
    url = f"http://127.0.0.1:{port}"
    env = dict(env)
    cwd = Path(env.pop("ORTPACK_CWD", cwd))
    proc = subprocess.Popen(
        command, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        cold = wait_ready(url, proc)
        handle = psutil.Process(proc.pid)
        print(f"{name}: ready in {cold:.2f} s (RSS {rss_mb(handle):.0f} MB); warming up", flush=True)
        yield url, handle, cold
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def load_cell(result: dict[str, Any]) -> str:
    """The load a run was measured under, for a table cell (`-`: not recorded)."""
    load = LoadRecord.from_stats(result)
    return load.short() if load else "-"


def print_run(label: str, result: dict[str, Any]) -> None:
    load = LoadRecord.from_stats(result)
    print(
        f"  {label}: {result['requests_per_s']:.0f} req/s, p50 {result['p50_ms']:.1f} ms, "
        f"p99 {result['p99_ms']:.1f} ms, errors {result['errors']}"
        + (f" ({load.describe()})" if load and load.contaminated else ""),
        flush=True,
    )


def bench_server(
    name: str, command: list[str], env: dict[str, str], port: int, bodies: dict[int, Path], seconds: float
) -> dict[str, Any]:
    started = time.perf_counter()
    with started_server(name, command, env, port) as (url, handle, cold):
        run_wrk(url, bodies[1], 8, 3, handle)
        runs = []
        for label, connections, per_request in WORKLOADS:
            scraped = stage_totals(url) if name.startswith("ortpack") else {}
            result = run_wrk(url, bodies[per_request], connections, seconds, handle)
            if scraped or name == "ortpack":
                result["stages_ms"] = stage_means_ms(scraped, stage_totals(url))
            result.update(
                workload=label,
                concurrency=connections,
                sentences_per_request=per_request,
                sentences_per_s=result["requests_per_s"] * per_request,
            )
            runs.append(result)
            print_run(f"{label} c={connections}", result)
        return {"server": name, "cold_start_s": cold, "startup_total_s": time.perf_counter() - started, "runs": runs}


def http_only_cpu(bundle: Path, variant: str, seconds: float) -> float:
    """Server CPU per request on GET /v2/health/live under load: the HTTP layer alone."""
    port = free_port()
    command, _ = server_commands(bundle, port, variant)["ortpack"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        handle = psutil.Process(proc.pid)
        cpu0 = cpu_seconds(handle)
        out = subprocess.run(
            ["wrk", "-t1", "-c32", f"-d{max(1, round(seconds))}s", f"http://127.0.0.1:{port}/v2/health/live"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        cpu1 = cpu_seconds(handle)
        requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
        return (cpu1 - cpu0) * 1000 / requests
    finally:
        proc.terminate()
        proc.wait(30)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def cold_start_table(servers: list[dict[str, Any]]) -> str:
    return table([["server", "cold start to ready, s"]] + [[s["server"], f"{s['cold_start_s']:.2f}"] for s in servers])


def measured_on() -> dict[str, Any]:
    """When and on what a result was measured: the first fields of a bench's JSON."""
    from ortpack.kernel.hardware import this_machine

    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": this_machine().cpu_model,
        "cpu_count": os.cpu_count(),
    }


def write_results(path: str, results: dict[str, Any]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out}")


def stage_table(servers: list[dict[str, Any]]) -> str:
    """Mean ms per stage of ortpack's answered requests in each run, and the share of the
    server-side total that is not the model."""
    from ortpack.serving.stages import STAGES

    rows = [["server", "workload", "conc.", *STAGES, "not model", "client mean"]]
    for server in servers:
        for r in server["runs"]:
            stages = r.get("stages_ms")
            if not stages or not stages.get("total"):
                continue
            share = 1 - stages.get("model", 0.0) / stages["total"]
            rows.append(
                [server["server"], r["workload"], str(r["concurrency"])]
                + [f"{stages.get(stage, 0.0):.3f}" for stage in STAGES]
                + [f"{share:.0%}", f"{r['mean_ms']:.3f}"]
            )
    return table(rows) if len(rows) > 1 else "(no server exported its stages)"


def goals_table(results: dict[str, Any]) -> list[list[str]]:
    """c=1 p50 and c=32 throughput of every server against the engine bound and the machine's int8
    peak, in one table."""
    bound = results["offline_bound_sentences_per_s"]["batch_1"]
    engine_p50 = min(results["offline_latency_ms"].values())
    peak = results["int8_peak"]
    per_sentence = peak["int8_macs_per_sentence"] / peak["int8_peak_macs_per_s"]
    rows = [
        [
            "server",
            "c=1 p50 ms",
            "c=1 p50 / engine b1 p50",
            "c=32 req/s",
            "c=32 p99 ms",
            "c=32 / offline bound",
            "c=32 % int8 peak",
        ]
    ]
    for server in results["servers"]:
        runs = {(r["workload"], r["concurrency"]): r for r in server["runs"]}
        one, many = runs.get(("1 sentence", 1)), runs.get(("1 sentence", 32))
        if one is None or many is None:
            continue
        rows.append(
            [
                server["server"],
                f"{one['p50_ms']:.2f}",
                f"{one['p50_ms'] / engine_p50:.2f}x",
                f"{many['requests_per_s']:.0f}",
                f"{many['p99_ms']:.1f}",
                f"{many['requests_per_s'] / bound:.0%}",
                f"{many['requests_per_s'] * per_sentence:.1%}" if per_sentence else "-",
            ]
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"), help="bundle to serve")
    parser.add_argument("--seconds", type=float, default=10, help="duration of each measured run")
    parser.add_argument("--servers", default="naive pytorch,simple ort int8,ortpack", help="comma-separated subset")
    parser.add_argument("--variant", default="cpu-int8", help="the variant every server serves")
    parser.add_argument(
        "--compare-with", type=Path, default=None, help="also run ortpack's server from DIR/serving ('ortpack before')"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_load.json"), help="JSON output")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run `make bench-serve` (it installs wrk) or apt-get install wrk")
    from ortpack.kernel.bundle import verify_bundle
    from ortpack.kernel.hardware import this_machine

    bundle = Path(args.bundle)
    manifest = verify_bundle(bundle)
    results: dict[str, Any] = {
        "bundle": manifest.name,
        "variant": args.variant,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "cpu": this_machine().summary(),
        "servers": [],
    }
    names = [s.strip() for s in args.servers.split(",")]
    if args.compare_with is not None and BEFORE not in names:
        names.insert(names.index("ortpack") if "ortpack" in names else len(names), BEFORE)
    # the bound is measured before the servers and after them: a shared machine's speed drifts by
    # 20 % within a run, and a share against one moment's bound moved by as much (99 % vs 80 %)
    print("offline bound, before the servers ...", flush=True)
    first_bound = offline_bound(bundle, args.variant)
    with tempfile.TemporaryDirectory() as tmp:
        bodies = write_bodies(Path(tmp), manifest.name)
        for name in names:
            port = free_port()
            command, env = server_commands(bundle, port, args.variant, args.compare_with)[name]
            results["servers"].append(bench_server(name, command, env, port, bodies, args.seconds))
    print("offline bound after them, and layer costs ...", flush=True)
    with LoadWatch() as load:
        last_bound = offline_bound(bundle, args.variant)
        results["offline_bound_runs"] = [first_bound, last_bound]
        # shares are against the higher of the two: the served figures are never flattered by a slow moment
        results["offline_bound_sentences_per_s"] = {k: max(first_bound[k], last_bound[k]) for k in first_bound}
        results["offline_latency_ms"] = offline_latency(bundle, args.variant)
        results["int8_peak"] = int8_peak_share(bundle, args.variant)
    results["offline_bound_load"] = load.record.as_stats()
    results["layer_cpu_us_per_request"] = layer_costs(bundle, args.variant, http_only_cpu(bundle, args.variant, 5))

    rows = [
        [
            "server",
            "workload",
            "conc.",
            "req/s",
            "sentences/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "peak RSS MB",
            "CPU ms/req",
            "load",
        ]
    ]
    for server in results["servers"]:
        for r in server["runs"]:
            rows.append(
                [
                    server["server"],
                    r["workload"],
                    str(r["concurrency"]),
                    f"{r['requests_per_s']:.0f}",
                    f"{r['sentences_per_s']:.0f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    str(r["errors"]),
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['cpu_ms_per_request']:.2f}",
                    load_cell(r),
                ]
            )
    print(f"\nserving {manifest.name} ({args.variant}) on {results['cpu']}, {args.seconds:.0f} s per run")
    print(table(rows))
    print("\n" + cold_start_table(results["servers"]))
    by_name = {s["server"]: {(r["workload"], r["concurrency"]): r for r in s["runs"]} for s in results["servers"]}
    if {"ortpack", "naive pytorch"} <= set(by_name):
        peers = [p for p in ("naive pytorch", "simple ort int8", BEFORE) if p in by_name]
        ratios = [["workload", *(f"ortpack vs {p}" for p in peers)]]
        for label, connections, _ in WORKLOADS:
            key = (label, connections)
            ours = by_name["ortpack"][key]["requests_per_s"]
            ratios.append(
                [f"{label} c={connections}"] + [f"{ours / by_name[p][key]['requests_per_s']:.2f}x" for p in peers]
            )
        results["throughput_ratios"] = ratios
        print("\n" + table(ratios))
    bound = results["offline_bound_sentences_per_s"]
    first_bound, last_bound = results["offline_bound_runs"]
    print(
        f"\noffline bound ({manifest.name} {args.variant}, 2 callers x 1 thread; the higher of before and "
        "after the servers): "
        + ", ".join(
            f"{k.replace('_', ' ')}: {v:.0f} sentences/s ({first_bound[k]:.0f} / {last_bound[k]:.0f})"
            for k, v in bound.items()
        )
        + "; b1 p50: "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in results["offline_latency_ms"].items())
        + f"; int8 peak {results['int8_peak']['int8_peak_macs_per_s'] / 1e9:.0f} GMAC/s (ORT MatMulInteger), "
        + f"{results['int8_peak']['int8_macs_per_sentence'] / 1e6:.0f} M int8 MACs per sentence"
        + f"; {load.record.describe()}"
    )
    results["goals"] = goals_table(results)
    print("\n" + table(results["goals"]))
    print("\nwhere an ortpack request's time goes (mean ms per answered request, server side):")
    print(stage_table(results["servers"]))
    print(
        "\n"
        + table(
            [["layer", "CPU us per request"]]
            + [[k, f"{v:.0f}"] for k, v in results["layer_cpu_us_per_request"].items()]
        )
    )
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
