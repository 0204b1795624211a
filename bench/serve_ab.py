"""A/B of ortpack's server between source trees: the same workload, servers started in turn.

    python bench/serve_ab.py --bundle dist/mobilenet_v3_small --workload image-json \
        --tree before=/tmp/before --tree after=. [--rounds 3] [--seconds 8] [--concurrency 50] [-- SERVER ARGS]

Each round starts each tree's `python -m ortpack.serving` (PYTHONPATH=tree), warms it up (3 s),
then one closed-loop wrk run: requests/s, p99, the server's CPU per request (all its threads) and
its event loop's (main thread), and the share of the machine's CPU left idle during the run (a
server whose workers wait for its event loop leaves the cores idle though requests are queued).
Trees alternate within each round, so a machine whose speed drifts (a shared one does, by 10-20 %)
moves both. Workloads: `image-json` (a 1280x960 photo-like JPEG of ~400 KB as base64 JSON to
/v1/classify/json, the published image workload), `image-raw` (its bytes to /v1/classify),
`text` (bench/serve_load.py's one-sentence bodies to /v1/embeddings). Prints each run and the
medians; writes --out (JSON). `git worktree add /tmp/before REV` makes a tree of another commit.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

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
from ortpack.kernel.hardware import this_machine  # noqa: E402


def workload(name: str, directory: Path, model: str) -> tuple[str, Path, dict[str, str]]:
    """(path, Lua script, its environment) of a named workload, its bodies written to `directory`."""
    if name == "text":
        return "/v1/embeddings", LUA, {"WRK_BODIES": str(write_bodies(directory, model)[1])}
    jpeg = make_jpeg()
    if name == "image-raw":
        (directory / "image.jpg").write_bytes(jpeg)
        return "/v1/classify", FILE_LUA, {"WRK_FILE": str(directory / "image.jpg"), "WRK_TYPE": "image/jpeg"}
    if name == "image-json":
        (directory / "body.json").write_text(json.dumps({"image": base64.b64encode(jpeg).decode()}))
        return "/v1/classify/json", FILE_LUA, {"WRK_FILE": str(directory / "body.json"), "WRK_TYPE": "application/json"}
    raise SystemExit(f"unknown workload {name!r}: text, image-json or image-raw")


def one_run(tree: Path, args: argparse.Namespace, route: tuple[str, Path, dict[str, str]]) -> dict[str, Any]:
    port = free_port()
    command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(Path(args.bundle).resolve())]
    command += ["--port", str(port), "--log-level", "warning", *args.server_args]
    env = {"PYTHONPATH": str(tree), "ORTPACK_CWD": str(tree)}
    path, lua, lua_env = route
    with started_server(str(tree), command, env, port) as (url, handle, _):
        run_wrk_script(url, path, lua, lua_env, args.concurrency, 3, handle)
        time.sleep(1)
        psutil.cpu_percent()  # the machine's CPU use is measured from here
        result = run_wrk_script(url, path, lua, lua_env, args.concurrency, args.seconds, handle)
        result["idle_share"] = 1 - psutil.cpu_percent() / 100  # idle and iowait, since the call above
    return result


def medians_of(runs: dict[str, list[dict[str, Any]]], keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Each label's median of each of `keys` over its runs."""
    return {label: {k: statistics.median(r[k] for r in rows) for k in keys} for label, rows in runs.items()}


def print_medians(
    args: argparse.Namespace,
    model: str,
    label: str,
    medians: dict[str, dict[str, float]],
    columns: dict[str, Callable[[dict[str, float]], str]],
) -> None:
    """The medians as a table (a row per label, a cell per column), under a line naming the
    workload (args.workload, args.concurrency, args.rounds), the model and the machine."""
    rows = [[label, *columns]] + [[name, *(cell(m) for cell in columns.values())] for name, m in medians.items()]
    print(
        f"\n{args.workload} at c={args.concurrency}, {model}, medians of {args.rounds} rounds, "
        f"{psutil.cpu_count()} cores ({this_machine().cpu_model})"
    )
    print(table(rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", required=True, help="the bundle every tree's server serves")
    parser.add_argument("--workload", default="image-json", help="text, image-json or image-raw")
    parser.add_argument("--tree", action="append", required=True, help="LABEL=DIR, a source tree (twice or more)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_ab.json"))
    parser.add_argument("server_args", nargs="*", help="after --: arguments for every server (e.g. --decode exact)")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    manifest = json.loads((Path(args.bundle) / "manifest.json").read_text())
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp:
        route = workload(args.workload, Path(tmp), manifest["name"])
        for round_ in range(args.rounds):
            for label, tree in trees.items():
                result = one_run(Path(tree).resolve(), args, route)
                runs[label].append(result)
                print(
                    f"round {round_ + 1} {label}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.0f} ms, "
                    f"CPU {result['cpu_ms_per_request']:.2f} ms/req (event loop "
                    f"{result['main_thread_cpu_ms_per_request']:.2f}), idle {result['idle_share']:.0%}, "
                    f"errors {result['errors']}",
                    flush=True,
                )
    keys = ("requests_per_s", "p99_ms", "cpu_ms_per_request", "main_thread_cpu_ms_per_request", "idle_share")
    medians = medians_of(runs, keys)
    columns = {
        "req/s": lambda m: f"{m['requests_per_s']:.1f}",
        "p99 ms": lambda m: f"{m['p99_ms']:.0f}",
        "CPU ms/req": lambda m: f"{m['cpu_ms_per_request']:.2f}",
        "of it event loop": lambda m: f"{m['main_thread_cpu_ms_per_request']:.2f}",
        "CPU idle": lambda m: f"{m['idle_share']:.0%}",
    }
    print_medians(args, manifest["name"], "tree", medians, columns)
    results = {
        **measured_on(),
        "bundle": manifest["name"],
        "workload": args.workload,
        "concurrency": args.concurrency,
        "server_args": args.server_args,
        "trees": trees,
        "runs": runs,
        "medians": medians,
    }
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
