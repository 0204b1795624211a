"""The container images, measured: size (installed, and what a registry stores and a node pulls:
the compressed layers), and the serving image's cold start (`run` to /v2/health/ready answering
200) against the same bundle served by a process on the host.

    python bench/images.py --bundle dist/all-MiniLM-L6-v2 [--runs 5] [--engine podman]

Needs the images (`make images`) and a bundle (`make run`). The compressed size comes from
`save` piped through gzip (what `push` uploads for these layers, within a few per cent). Prints a
table, writes bench/results/images.json.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONF = ROOT / "images" / "containers.conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONF))}


def run(engine: str, *args: str) -> str:
    return subprocess.run([engine, *args], check=True, capture_output=True, text=True, env=engine_env()).stdout


def image_sizes(engine: str, tag: str) -> dict[str, float]:
    installed = int(run(engine, "image", "inspect", "--format", "{{.Size}}", tag).strip())
    save = subprocess.Popen([engine, "save", tag], stdout=subprocess.PIPE, env=engine_env())
    compressed = 0
    assert save.stdout is not None
    sink = _Counter()
    with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=6) as out:
        for block in iter(lambda: save.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
            out.write(block)
    save.wait()
    compressed = sink.count
    return {"installed_mb": installed / 1e6, "compressed_mb": compressed / 1e6}


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def wait_ready(url: str, timeout: float = 60) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"not ready after {timeout} s")


def container_cold_start(engine: str, tag: str, bundle: Path) -> dict[str, float]:
    port = free_port()
    name = f"ortpack-bench-{port}"
    start = time.monotonic()
    subprocess.run(
        [
            engine, "run", "-d", "--name", name, "--read-only", "--user", "10001:10001",
            f"--publish=127.0.0.1:{port}:8080",
            f"--mount=type=bind,source={bundle.resolve()},destination=/bundle,ro=true",
            "--mount=type=tmpfs,destination=/tmp", "--env=ORTPACK_BUNDLE=/bundle", tag,
        ],
        check=True, capture_output=True, env=engine_env(),
    )  # fmt: skip
    try:
        run_returned = time.monotonic() - start
        ready = wait_ready(f"http://127.0.0.1:{port}") + run_returned
        logs = subprocess.run([engine, "logs", name], capture_output=True, text=True, env=engine_env())
        own = re.search(r"ready: .* in ([0-9.]+) s", logs.stdout + logs.stderr)
        return {"run_returned_s": run_returned, "ready_s": ready, "server_says_s": float(own[1]) if own else -1.0}
    finally:
        subprocess.run([engine, "rm", "-f", "-t", "0", name], capture_output=True, env=engine_env())


def host_cold_start(bundle: Path) -> float:
    port = free_port()
    start = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        return time.monotonic() - start
    finally:
        process.terminate()
        process.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", default="dist/all-MiniLM-L6-v2")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine", default="podman")
    parser.add_argument("--repo", default="ghcr.io/ortpack")
    parser.add_argument("--skip-component", action="store_true", help="do not size the component image (~2 min)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "images.json"))
    args = parser.parse_args()
    from ortpack import __version__
    from ortpack.components.core.timing import LoadWatch
    from ortpack.kernel.hardware import this_machine

    bundle = Path(args.bundle)
    serve, component = f"{args.repo}/ortpack-serve:{__version__}", f"{args.repo}/ortpack-component:{__version__}"
    sizes = {"serve": image_sizes(args.engine, serve)}
    if not args.skip_component:
        sizes["component"] = image_sizes(args.engine, component)
    with LoadWatch() as load:
        container = [container_cold_start(args.engine, serve, bundle) for _ in range(args.runs)]
        host = [host_cold_start(bundle) for _ in range(args.runs)]

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    print(f"{'image':10s} {'installed MB':>13s} {'compressed MB':>14s}")
    for name, size in sizes.items():
        print(f"{name:10s} {size['installed_mb']:13.1f} {size['compressed_mb']:14.1f}")
    print(f"\ncold start of {bundle.name}, median of {args.runs} ({this_machine().summary()}):")
    returned, ready = median([c["run_returned_s"] for c in container]), median([c["ready_s"] for c in container])
    own = median([c["server_says_s"] for c in container])
    print(f"  container: `run` returned {returned:.2f} s, ready {ready:.2f} s (the server's own count: {own:.2f} s)")
    print(f"  host process: ready {median(host):.2f} s; {load.record.describe()}")
    result: dict[str, Any] = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": this_machine().as_dict(),
        "platform": platform.platform(),
        "engine": args.engine,
        "bundle": str(bundle),
        "sizes": sizes,
        "cold_start": {"container": container, "host_ready_s": host, **load.record.as_stats()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
