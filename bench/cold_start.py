"""Cold start of ortpack's server: process start to readiness 200, and where the time went.

    python bench/cold_start.py [--bundle dist/all-MiniLM-L6-v2] [--variant cpu-int8] [--runs 3]
        [--compare-with DIR] [--out bench/results/cold_start.json]
    python bench/cold_start.py --image TAG [--image TAG ...] [--trust-key PUB.pem] [--bundle DIR]
        [--runs 5] [--engine podman] [--out bench/results/cold_start_container.json]

Starts `python -m ortpack.serving` `--runs` times (the bundle's every check on: sha256 of every file, the
node probe check, warm-up) and polls /v2/health/ready as bench/serve_load.py does. Each start's
ready line carries its start-up phases (serving/startup.py: began and ended, seconds since the
server's `main` began); the table shows the median of each over the runs. `--compare-with DIR`
adds the server run from DIR's `serving/` (e.g. `git archive REV serving | tar -x -C DIR`), its
starts interleaved with this tree's. Prints the table, writes `--out` (JSON).

With `--image`, each image is started as deploy/ runs it (`ENGINE run -d`: read-only root, user
10001, no capabilities, a tmpfs /tmp, the bundle bind-mounted read-only, ORTPACK_WORKERS=2, and
with `--trust-key` the signature checked), the images' starts interleaved; the clock runs from
just before `run` to the first 200 from /v2/health/ready, and `run` returning (the container
created and started) is reported beside it. The phases are the server's own, as on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_load import BEFORE, free_port, server_commands, table, wait_ready, write_results  # noqa: E402
from ortpack.components.core.timing import LoadWatch  # noqa: E402
from ortpack.kernel.hardware import this_machine  # noqa: E402

# serving/startup.py's phases, in the order they usually begin
PHASES = ("imports", "fetch", "manifest", "verify", "session", "node check", "http imports", "warm-up", "listen")


def one_start(name: str, bundle: Path, variant: str, before: Path | None) -> dict[str, Any]:
    """Start server `name` (bench/serve_load.py's commands), wait for readiness, stop it: the
    polled cold start and the phases its ready line reports."""
    port = free_port()
    command, env = server_commands(bundle, port, variant, before)[name]
    cwd = Path(env.pop("ORTPACK_CWD", ROOT))
    command = [*command, "--log-level", "info", "--log-format", "json"]  # the last --log-level counts
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=log)
        try:
            cold = wait_ready(f"http://127.0.0.1:{port}", proc)
        finally:
            proc.terminate()
            proc.wait(30)
        log.seek(0)
        records = [json.loads(line) for line in log if line.startswith("{")]
    (ready,) = [r for r in records if r.get("message", "").startswith("ready:")]
    return {"cold_start_s": cold, "phases": ready.get("startup", {})}  # code before the timeline: none


def one_container_start(engine: str, image: str, bundle: Path, trust_key: Path | None) -> dict[str, Any]:
    """`ENGINE run` IMAGE as deploy/ runs it, polled until ready, then removed."""
    import time
    import urllib.request

    port = free_port()
    name = f"ortpack-cold-start-{port}"
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "images/containers.conf"))}
    trust = (
        [f"--mount=type=bind,source={trust_key.resolve()},destination=/etc/ortpack/trust-key.pem,ro=true",
         "--env=ORTPACK_TRUST_KEY=/etc/ortpack/trust-key.pem"]
        if trust_key else []
    )  # fmt: skip
    command = [
        engine, "run", "-d", "--name", name, "--read-only", "--user=10001:10001", "--cap-drop=ALL",
        "--security-opt=no-new-privileges", f"--publish=127.0.0.1:{port}:8080",
        "--mount=type=tmpfs,destination=/tmp,tmpfs-mode=1777",
        f"--mount=type=bind,source={bundle.resolve()},destination=/models/bundle,ro=true",
        "--env=ORTPACK_BUNDLE=/models/bundle", "--env=ORTPACK_WORKERS=2", "--env=ORTPACK_LOG_FORMAT=json",
        "--env=ORTPACK_SHUTDOWN_GRACE_S=0", *trust, image,
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    returned = time.perf_counter() - start
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if time.perf_counter() - start > 120:
                    raise SystemExit(f"{image} not ready after 120 s") from None
            time.sleep(0.005)
        ready = time.perf_counter() - start
        logs = subprocess.run([engine, "logs", name], capture_output=True, text=True, env=env)
    finally:
        subprocess.run([engine, "rm", "-f", "-t", "0", name], capture_output=True, env=env)
    records = [json.loads(line) for line in (logs.stdout + logs.stderr).splitlines() if line.startswith("{")]
    (line,) = [r for r in records if r.get("message", "").startswith("ready:")]
    return {"cold_start_s": ready, "run_returned_s": returned, "phases": line.get("startup", {})}


def medians(starts: list[dict[str, Any]]) -> dict[str, Any]:
    """The median cold start, and the median began/ended/seconds of each phase, over the starts."""
    names = [n for n in PHASES if any(n in s["phases"] for s in starts)]
    phases = {}
    for name in names:
        spans = [s["phases"][name] for s in starts if name in s["phases"]]
        phases[name] = {
            "began_s": statistics.median(a for a, _ in spans),
            "ended_s": statistics.median(b for _, b in spans),
            "seconds": statistics.median(b - a for a, b in spans),
        }
    return {"cold_start_s": statistics.median(s["cold_start_s"] for s in starts), "phases": phases}


def phase_table(results: dict[str, Any]) -> str:
    servers = list(results["servers"])
    rows = [["phase", *(f"{name}: began-ended, s" for name in servers), *(f"{name}: s" for name in servers)]]
    names = [n for n in PHASES if any(n in results["servers"][s]["median"]["phases"] for s in servers)]
    for name in names:
        spans, seconds = [], []
        for server in servers:
            phase = results["servers"][server]["median"]["phases"].get(name)
            spans.append(f"{phase['began_s']:.2f}-{phase['ended_s']:.2f}" if phase else "-")
            seconds.append(f"{phase['seconds']:.2f}" if phase else "-")
        rows.append([name, *spans, *seconds])
    rows.append(
        [
            "**process start to ready (polled)**",
            *("" for _ in servers),
            *(f"**{results['servers'][s]['median']['cold_start_s']:.2f}**" for s in servers),
        ]
    )
    return table(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "all-MiniLM-L6-v2"), help="bundle to serve")
    parser.add_argument("--variant", default="cpu-int8", help="variant to serve")
    parser.add_argument("--runs", type=int, default=3, help="starts per server (median reported)")
    parser.add_argument("--compare-with", type=Path, help="also start the server from DIR's serving/")
    parser.add_argument("--out", help="JSON results (default bench/results/cold_start[_container].json)")
    parser.add_argument("--image", action="append", help="start this container image instead (repeatable)")
    parser.add_argument("--trust-key", type=Path, help="with --image: check the bundle's signature with this key")
    parser.add_argument("--engine", default="podman", help="with --image: the container engine")
    args = parser.parse_args()
    if args.image:
        return containers(args)
    args.out = args.out or str(ROOT / "bench" / "results" / "cold_start.json")

    names = ([BEFORE] if args.compare_with else []) + ["ortpack"]
    starts: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with LoadWatch() as load:
        for run in range(args.runs):
            for name in names:  # interleaved: a drift of the machine's load hits both alike
                starts[name].append(one_start(name, Path(args.bundle), args.variant, args.compare_with))
                print(f"{name} run {run + 1}: ready in {starts[name][-1]['cold_start_s']:.2f} s", flush=True)
    results = {
        "bundle": Path(args.bundle).name,
        "variant": args.variant,
        "cpu": this_machine().summary(),
        "python": platform.python_version(),
        "load": load.record.as_stats(),
        "servers": {name: {"median": medians(runs), "runs": runs} for name, runs in starts.items()},
    }
    print("\n" + phase_table(results))
    print(f"\n{args.runs} starts each, median; {this_machine().summary()}; {load.record.describe()}")
    write_results(args.out, results)
    return 0


def containers(args: argparse.Namespace) -> int:
    """--image: each image's container start, interleaved, median of --runs."""
    starts: dict[str, list[dict[str, Any]]] = {image: [] for image in args.image}
    with LoadWatch() as load:
        for run in range(args.runs):
            for image in args.image:
                starts[image].append(one_container_start(args.engine, image, Path(args.bundle), args.trust_key))
                one = starts[image][-1]
                print(f"{image} run {run + 1}: `run` returned in {one['run_returned_s']:.2f} s, "
                      f"ready in {one['cold_start_s']:.2f} s", flush=True)  # fmt: skip
    results = {
        "bundle": Path(args.bundle).name,
        "engine": args.engine,
        "signature_checked": bool(args.trust_key),
        "cpu": this_machine().summary(),
        "load": load.record.as_stats(),
        "servers": {
            image: {
                "median": {**medians(runs), "run_returned_s": statistics.median(r["run_returned_s"] for r in runs)},
                "runs": runs,
            }
            for image, runs in starts.items()
        },
    }
    print("\n" + phase_table(results))
    print(f"\n{args.runs} starts each, median, `run` to ready; {this_machine().summary()}; {load.record.describe()}")
    write_results(args.out or str(ROOT / "bench" / "results" / "cold_start_container.json"), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
