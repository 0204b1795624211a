"""Image-embedding serving benchmark: a naive PyTorch + FastAPI embedder and ortpack's, one run.

    python bench/embed_serve.py [--bundle dist/efficientnet-lite0-embedding] [--seconds 10]

Both serve EfficientNet-Lite0's pooled features (examples/efficientnet_lite.py with its ImageNet
weights, `make trained`; the classifier dropped, L2-normalised). The bundle is built first if
missing (fp32 and int8, gated on photos from tests/photos.py). The workload is image
classification's: the same ~400 KB 1280x960 JPEG (bench/image_serve.py) posted as base64 in an
OpenAI embeddings request to /v1/embeddings, closed loop (wrk) at concurrency 1 and 50, after a
discarded warm-up run; for ortpack also the raw bytes to /v1/embeddings/image. Before the load,
each server's vector for the JPEG is compared with the naive server's (cosine). Reported:
requests/s, p50/p99, errors, peak RSS, CPU per request, cold start. Writes
bench/results/embed_serve.json.
"""

from __future__ import annotations

import argparse
import base64
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
from bench.image_serve import HEIGHT, WIDTH, make_jpeg, runs_table  # noqa: E402
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

CONCURRENCY = (1, 50)
FILE_LUA = ROOT / "bench" / "wrk" / "post_file.lua"
DRAIN_S = 3.0
MODEL = "examples.efficientnet_lite:efficientnet_lite0"
LITE = {"mean": (127 / 255,) * 3, "std": (128 / 255,) * 3}


def ensure_bundle(bundle: Path, weights: Path) -> None:
    if bundle.is_dir():
        return
    from tests.photos import write_photo_sets

    with tempfile.TemporaryDirectory() as tmp:
        photos = write_photo_sets(Path(tmp), validation=48, calibration=32, heldout=0)
        command = [sys.executable, "-m", "ortpack.pipelines.cli", "build", "--model", MODEL]
        command += ["--task", "image-embedding", "--weights", str(weights), "--precisions", "fp32,int8"]
        command += [
            "--mean",
            ",".join(f"{v:.6f}" for v in LITE["mean"]),
            "--std",
            ",".join(f"{v:.6f}" for v in LITE["std"]),
        ]
        command += ["--task-option", "head=drop", "--name", "efficientnet-lite0-embedding"]
        command += ["--validation-images", str(photos.validation), "--calibration-images", str(photos.calibration)]
        subprocess.run([*command, "--out", str(bundle)], cwd=ROOT, check=True)


def bench(
    name: str, command: list[str], env: dict[str, str], port: int, files: dict[str, Path], seconds: float, raw: bool
) -> dict[str, Any]:
    json_body = {"WRK_FILE": str(files["json"]), "WRK_TYPE": "application/json"}
    workloads = [("base64 JSON", "/v1/embeddings", json_body)]
    if raw:
        workloads.append(
            ("raw bytes", "/v1/embeddings/image", {"WRK_FILE": str(files["jpeg"]), "WRK_TYPE": "image/jpeg"})
        )
    with started_server(name, command, env, port) as (url, handle, cold):
        answer = httpx.post(
            f"{url}/v1/embeddings",
            content=files["json"].read_bytes(),
            headers={"content-type": "application/json"},
            timeout=60,
        )
        answer.raise_for_status()
        run_wrk_script(url, "/v1/embeddings", FILE_LUA, json_body, 8, 3, handle)
        runs = []
        for workload, path, lua_env in workloads:
            for connections in CONCURRENCY:
                time.sleep(DRAIN_S)
                result = run_wrk_script(url, path, FILE_LUA, lua_env, connections, seconds, handle)
                result.update(workload=workload, concurrency=connections)
                runs.append(result)
                print_run(f"{workload} c={connections}", result)
        vector = answer.json()["data"][0]["embedding"]
        return {"server": name, "cold_start_s": cold, "runs": runs, "vector": vector}


def main() -> int:
    from tests.trained import efficientnet_lite0_weights

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "efficientnet-lite0-embedding"), help="bundle to serve")
    parser.add_argument("--seconds", type=float, default=10, help="duration of each measured run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "embed_serve.json"), help="JSON output")
    args = parser.parse_args()
    bundle, weights = Path(args.bundle), efficientnet_lite0_weights()
    ensure_bundle(bundle, weights)
    manifest = json.loads((bundle / "manifest.json").read_text())
    jpeg = make_jpeg()
    body = json.dumps({"input": base64.b64encode(jpeg).decode()})
    results: dict[str, Any] = {
        **measured_on(),
        "bundle": str(bundle),
        "variants": [v["id"] for v in manifest["variants"]],
        "jpeg": {"width": WIDTH, "height": HEIGHT, "bytes": len(jpeg), "body_bytes": len(body)},
        "servers": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        files = {"json": Path(tmp) / "body.json", "jpeg": Path(tmp) / "image.jpg"}
        files["json"].write_text(body)
        files["jpeg"].write_bytes(jpeg)
        uvicorn = [sys.executable, "-m", "uvicorn", "--workers", str(os.cpu_count() or 2), "--log-level", "warning"]
        port = free_port()
        command = [*uvicorn, "--no-access-log", "--port", str(port), "bench.baselines.naive_embed:app"]
        print("naive pytorch", flush=True)
        env = {"NAIVE_WEIGHTS": str(weights)}
        results["servers"].append(bench("naive pytorch", command, env, port, files, args.seconds, raw=False))
        for variant in ("auto", *results["variants"]):
            port = free_port()
            command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port)]
            command += ["--log-level", "warning", "--variant", variant]
            print(f"ortpack --variant {variant}", flush=True)
            results["servers"].append(bench(f"ortpack {variant}", command, {}, port, files, args.seconds, raw=True))
    print("bounds: decode + graph, no HTTP, 2 callers x 1 thread", flush=True)
    variants = ("auto", *results["variants"])
    results["bounds"] = {v: image_bound(bundle, v, {"jpeg": jpeg})["jpeg"] for v in variants}
    naive = np.array(results["servers"][0]["vector"])
    for server in results["servers"]:
        vector = np.array(server.pop("vector"))
        server["cosine_vs_naive"] = float(vector @ naive / (np.linalg.norm(vector) * np.linalg.norm(naive)))
    report(results, args.seconds)
    write_results(args.out, results)
    return 0


def report(results: dict[str, Any], seconds: float) -> None:
    jpeg = results["jpeg"]
    print(
        f"\nimage embeddings: EfficientNet-Lite0 features, the same {jpeg['width']}x{jpeg['height']} "
        f"{jpeg['bytes'] / 1000:.0f} KB JPEG, {results['cpu_count']} cores ({results['cpu']}), {seconds:.0f} s per row"
    )
    print(runs_table(results["servers"]))
    runs = {(s["server"], r["workload"], r["concurrency"]): r for s in results["servers"] for r in s["runs"]}

    def speed(server: str, workload: str, concurrency: int) -> float:
        return float(runs[(server, workload, concurrency)]["requests_per_s"])

    top = CONCURRENCY[-1]
    ratios = [
        [
            "server", "cosine vs naive", *(f"base64 c={c} vs naive" for c in CONCURRENCY), "bound img/s",
            f"base64 c={top} of bound", f"raw c={top} of bound",
        ]
    ]  # fmt: skip
    for server in results["servers"]:
        name = server["server"]
        bound = results["bounds"].get(name.removeprefix("ortpack "))
        raw = runs.get((name, "raw bytes", top))
        ratios.append(
            [
                name,
                f"{server['cosine_vs_naive']:.5f}",
                *(
                    f"{speed(name, 'base64 JSON', c) / speed('naive pytorch', 'base64 JSON', c):.2f}x"
                    for c in CONCURRENCY
                ),
                f"{bound:.1f}" if bound else "-",
                f"{speed(name, 'base64 JSON', top) / bound:.0%}" if bound else "-",
                f"{float(raw['requests_per_s']) / bound:.0%}" if bound and raw else "-",
            ]
        )
    results["ratios"] = ratios
    print("\n" + table(ratios))
    print("\n" + cold_start_table(results["servers"]))


if __name__ == "__main__":
    sys.exit(main())
