"""Image serving benchmark: a naive PyTorch + FastAPI classifier and ortpack's server, one run.

    python bench/image_serve.py [--bundle dist/mobilenet_v3_small] [--seconds 10]

Both serve MobileNetV3-small with the same weights (random, made non-degenerate: no trained
weights are available offline; the work per image is the same). The workload is the published
one: the same ~400 KB JPEG (1600x1200) posted as base64 JSON, closed loop (wrk) at concurrency 1,
8 and 50, after a discarded warm-up run. Reported: requests/s, p50/p99, errors, peak RSS of the
server's process tree, CPU per request, cold start. Writes bench/results/image_serve.json.
If the bundle is missing it is built first (`ortpack build`, cpu fp32 and int8).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serve_load import (  # noqa: E402
    cold_start_table,
    free_port,
    print_run,
    run_wrk,
    started_server,
    table,
    write_results,
)

CONCURRENCY = (1, 8, 50)


def make_jpeg(target_bytes: int = 400_000) -> bytes:
    """A 1600x1200 photo-like JPEG of about `target_bytes` (the quality is searched)."""
    from PIL import Image

    from components.core.validation_data import ImageSpec, render_image

    image = Image.fromarray(render_image(ImageSpec(1200, 1600, "smooth", 42)))
    best = b""
    for quality in range(95, 40, -1):
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=quality)
        best = buf.getvalue()
        if len(best) <= target_bytes:
            break
    return best


def ensure_bundle(bundle: Path, weights: Path) -> None:
    if not weights.is_file():
        from tests.models import make_image_weights

        make_image_weights("mobilenet_v3_small", weights)
    if not bundle.is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "build",
                "--model",
                "mobilenet_v3_small",
                "--task",
                "image-classification",
                "--weights",
                str(weights),
                "--precisions",
                "fp32,int8",
                "--out",
                str(bundle),
            ],
            cwd=ROOT,
            check=True,
        )


def bench(
    name: str, command: list[str], env: dict[str, str], port: int, bodies: Path, seconds: float
) -> dict[str, Any]:
    with started_server(name, command, env, port) as (url, handle, cold):
        run_wrk(url, bodies, 8, 3, handle, path="/v1/classify/json")
        runs = []
        for connections in CONCURRENCY:
            result = run_wrk(url, bodies, connections, seconds, handle, path="/v1/classify/json")
            result["concurrency"] = connections
            runs.append(result)
            print_run(f"c={connections}", result)
        return {"server": name, "cold_start_s": cold, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "mobilenet_v3_small"), help="image bundle to serve")
    parser.add_argument(
        "--weights",
        default=str(ROOT / "dist" / "mobilenet_v3_small.safetensors"),
        help="the weights both servers load (made if missing)",
    )
    parser.add_argument("--seconds", type=float, default=10, help="duration of each measured run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "image_serve.json"), help="JSON output")
    args = parser.parse_args()
    bundle, weights = Path(args.bundle), Path(args.weights)
    ensure_bundle(bundle, weights)
    jpeg = make_jpeg()
    results: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "jpeg_bytes": len(jpeg),
        "servers": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        bodies = Path(tmp) / "bodies.jsonl"
        bodies.write_text(json.dumps({"image": base64.b64encode(jpeg).decode()}) + "\n")
        uvicorn = [
            sys.executable,
            "-m",
            "uvicorn",
            "--workers",
            str(os.cpu_count() or 2),
            "--log-level",
            "warning",
            "--no-access-log",
        ]
        port = free_port()
        results["servers"].append(
            bench(
                "naive pytorch",
                [*uvicorn, "--port", str(port), "bench.baselines.naive_image:app"],
                {"NAIVE_WEIGHTS": str(weights)},
                port,
                bodies,
                args.seconds,
            )
        )
        for name, extra in (("ortpack", []), ("ortpack --jpeg-draft", ["--jpeg-draft", "true"])):
            port = free_port()
            command = [
                sys.executable,
                "-m",
                "serving",
                "--bundle",
                str(bundle),
                "--port",
                str(port),
                "--log-level",
                "warning",
                *extra,
            ]
            results["servers"].append(bench(name, command, {}, port, bodies, args.seconds))
    rows = [["server", "conc.", "req/s", "p50 ms", "p99 ms", "errors", "peak RSS MB", "CPU ms/req"]]
    for server in results["servers"]:
        for r in server["runs"]:
            rows.append(
                [
                    server["server"],
                    str(r["concurrency"]),
                    f"{r['requests_per_s']:.1f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    str(r["errors"]),
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['cpu_ms_per_request']:.1f}",
                ]
            )
    print(
        f"\nimage serving: MobileNetV3-small, the same {len(jpeg) / 1000:.0f} KB JPEG as base64 JSON, "
        f"{os.cpu_count()} cores, {args.seconds:.0f} s per row"
    )
    print(table(rows))
    naive, ours, draft = ({r["concurrency"]: r for r in s["runs"]} for s in results["servers"])
    ratios = [["concurrency", "ortpack vs naive", "--jpeg-draft vs naive", "p99 ms: naive / ortpack / draft"]]
    for c in CONCURRENCY:
        ratios.append(
            [
                str(c),
                f"{ours[c]['requests_per_s'] / naive[c]['requests_per_s']:.1f}x",
                f"{draft[c]['requests_per_s'] / naive[c]['requests_per_s']:.1f}x",
                f"{naive[c]['p99_ms']:.0f} / {ours[c]['p99_ms']:.0f} / {draft[c]['p99_ms']:.0f}",
            ]
        )
    results["ratios"] = ratios
    print("\n" + table(ratios))
    print("\n" + cold_start_table(results["servers"]))
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
