"""Image serving benchmark: a naive PyTorch server, a simple ONNX Runtime one and ortpack's, one run.

    python bench/image_serve.py [--bundle dist/mobilenet_v3_small] [--seconds 10]
    python bench/image_serve.py --bundle dist/efficientnet-lite0 \
        --model examples.efficientnet_lite:efficientnet_lite0 --weights W.pth

Every server serves the bundle's model with the same weights: by default MobileNetV3-small with
random weights made non-degenerate (built if missing); with --model, the model the bundle was built
from (the naive server takes the bundle's preprocessing from its manifest; the simple one runs its
graph). The workload is the published one: the same ~400 KB 1280x960 JPEG posted as base64 JSON to
/v1/classify/json, closed loop (wrk) at concurrency 1, 8 and 50, after a discarded warm-up run; for
ortpack also the raw bytes to /v1/classify. Servers: the naive one, a simple FastAPI + ONNX Runtime
one on the same graph (bench/baselines/simple_ort_image.py), ortpack with its default decode (what
the bundle's parity gate validated) and ortpack with `--decode exact`. Reported: requests/s,
p50/p99, errors, peak RSS of the server's process tree, CPU per request, cold start; the CPU of one
request split into its stages (JSON, base64, decode, graph preprocessing and network, the rest:
HTTP, routing, queue), and the offline bound (decode + graph per image, no HTTP, two threads;
measured before and after the servers, the higher taken) with each served c=50 figure's share of
it. Writes bench/results/image_serve.json. If the bundle is missing it is built first (`ortpack
build`).
"""

from __future__ import annotations

import argparse
import base64
import collections
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_load import (  # noqa: E402
    cold_start_table,
    free_port,
    load_cell,
    measured_on,
    print_run,
    run_wrk_script,
    started_server,
    table,
    write_results,
)
from bench.serve_offline import per_second  # noqa: E402
from ortpack.components.core.timing import LoadWatch  # noqa: E402
from ortpack.kernel.hardware import this_machine  # noqa: E402

CONCURRENCY = (1, 8, 50)
FILE_LUA = ROOT / "bench" / "wrk" / "post_file.lua"
DRAIN_S = 3.0  # between runs: wrk stops at its deadline, the server still answers what it accepted
WIDTH, HEIGHT, TARGET_BYTES = 1280, 960, 400_000


def make_jpeg() -> bytes:
    """A 1280x960 photo-like JPEG (the validation set's "photo" content) of at most ~400 KB: the
    highest quality that fits."""
    from PIL import Image

    from ortpack.components.core.validation_data import EncodedImageSpec, render_content

    image = Image.fromarray(
        render_content(EncodedImageSpec(width=WIDTH, height=HEIGHT, content="photo", format="JPEG", seed=42))
    )
    best = b""
    for quality in range(98, 40, -1):
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=quality)
        best = buf.getvalue()
        if len(best) <= TARGET_BYTES:
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
                "ortpack.pipelines.cli",
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
    name: str, command: list[str], env: dict[str, str], port: int, files: dict[str, Path], seconds: float, raw: bool
) -> dict[str, Any]:
    # one fixed body per workload: wrk formats the request once (formatting a 500 KB body per
    # request in Lua costs the load generator, which shares the two cores, ~5 ms each)
    json_body = {"WRK_FILE": str(files["json"]), "WRK_TYPE": "application/json"}
    workloads = [("base64 JSON", "/v1/classify/json", FILE_LUA, json_body)]
    if raw:
        workloads.append(
            ("raw bytes", "/v1/classify", FILE_LUA, {"WRK_FILE": str(files["jpeg"]), "WRK_TYPE": "image/jpeg"})
        )
    with started_server(name, command, env, port) as (url, handle, cold):
        run_wrk_script(url, *workloads[0][1:], 8, 3, handle)
        runs = []
        for workload, path, lua, lua_env in workloads:
            for connections in CONCURRENCY:
                time.sleep(DRAIN_S)  # the previous run's accepted requests finish first
                result = run_wrk_script(url, path, lua, lua_env, connections, seconds, handle)
                result.update(workload=workload, concurrency=connections)
                runs.append(result)
                print_run(f"{workload} c={connections}", result)
        return {"server": name, "cold_start_s": cold, "runs": runs}


def per_call_ms(fn: Callable[[], Any], n: int) -> float:
    """CPU milliseconds of one call (this thread's CPU time, so other load does not count)."""
    fn()
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n * 1000


def graph_split(model: Path, variant: Any, image: Any, runs: int = 30) -> dict[str, float]:
    """ms per call in the graph's preprocessing (`pre/` nodes) and network (`net/`), from ONNX
    Runtime's profile of a session loaded as the server loads it (one thread, its online level)."""
    import onnxruntime as ort

    from ortpack.kernel.runtime import plan_for

    plan = plan_for(variant)
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        options.intra_op_num_threads = 1
        options.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if plan.online_optimization
            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        session = ort.InferenceSession(str(model), options, providers=plan.providers)
        for _ in range(runs):
            session.run(None, {"images": image[None]})
        events = json.loads(Path(session.end_profiling()).read_text())
    total: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            total["preprocess" if event["name"].startswith("pre/") else "network"] += event["dur"]
    return {key: value / 1000 / runs for key, value in total.items()}


def served_graph(bundle: Path) -> tuple[Any, Any, dict[str, Any], str]:
    """What `--variant auto` serves, as the server opens it: (the variant, its session with one
    thread, the decoders by mode: "exact" and the bundle's "default", why the default is what it is)."""
    import onnxruntime as ort

    from ortpack.kernel.bundle import read_manifest
    from ortpack.kernel.images import ImageDecoder, choose_decoder
    from ortpack.kernel.runtime import serving_session
    from ortpack.kernel.selection import choose_variant

    manifest = read_manifest(bundle)
    variant = choose_variant(manifest, "auto", ort.get_available_providers(), this_machine())
    session, _ = serving_session((bundle / variant.file).read_bytes(), variant, intra_op_threads=1)
    preprocessing = manifest.task_settings.preprocessing  # type: ignore[attr-defined]
    default, why = choose_decoder(preprocessing, variant, "auto", 40_000_000, manifest.name)
    return variant, session, {"exact": ImageDecoder(40_000_000), "default": default}, why


def stage_costs(bundle: Path, jpeg: bytes, body: bytes) -> dict[str, Any]:
    """Offline CPU per request in each stage, for the variant `--variant auto` serves: JSON parse,
    base64, decode (exact and the bundle's default), the graph split into preprocessing and
    network (for the image each decode gives); and the offline bound: decode + graph per image on
    two threads (the server's model workers), no HTTP, images per second."""
    import orjson

    from ortpack.kernel.images import decode_base64

    variant, session, decoders, why = served_graph(bundle)
    text = orjson.loads(body)["image"]
    costs: dict[str, Any] = {"variant": variant.id, "default_decode": why}
    costs["json parse"] = per_call_ms(lambda: orjson.loads(body), 200)
    costs["base64"] = per_call_ms(lambda: decode_base64(text, "image"), 200)
    for name, decoder in decoders.items():
        image = decoder.decode(jpeg)
        costs[f"decode {name}"] = per_call_ms(lambda decoder=decoder: decoder.decode(jpeg), 30)
        costs[f"decoded size {name}"] = f"{image.shape[1]}x{image.shape[0]}"
        costs[f"graph {name}"] = per_call_ms(lambda image=image: session.run(None, {"images": image[None]}), 30)
        split = graph_split(bundle / variant.file, variant, image)  # profiled: only the shares count
        share = split.get("preprocess", 0.0) / max(1e-9, sum(split.values()))
        costs[f"graph {name} preprocess"] = costs[f"graph {name}"] * share
        costs[f"graph {name} network"] = costs[f"graph {name}"] * (1 - share)
        costs[f"offline bound {name}"] = offline_bound(decoder, session, jpeg)
    return costs


def image_bounds(bundle: Path, jpeg: bytes) -> dict[str, float]:
    """The offline bound of each decode ("default", "exact"), as `stage_costs` measures it."""
    _, session, decoders, _ = served_graph(bundle)
    return {mode: offline_bound(decoder, session, jpeg) for mode, decoder in decoders.items()}


def offline_bound(decoder: Any, session: Any, jpeg: bytes, seconds: float = 4.0) -> float:
    """Images per second: decode + graph at batch 1 on two threads, nothing else."""

    def step(caller: int, i: int) -> int:
        session.run(None, {"images": decoder.decode(jpeg)[None]})
        return 1

    return per_second(step, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default=str(ROOT / "dist" / "mobilenet_v3_small"), help="image bundle to serve")
    parser.add_argument(
        "--weights",
        default=str(ROOT / "dist" / "mobilenet_v3_small.safetensors"),
        help="the weights both servers load (made if missing, for the default model)",
    )
    parser.add_argument(
        "--model",
        default="mobilenet_v3_small",
        help="the bundle's model, as --model of the build named it (torchvision name or PACKAGE.MODULE:FACTORY)",
    )
    parser.add_argument("--seconds", type=float, default=10, help="duration of each measured run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "image_serve.json"), help="JSON output")
    args = parser.parse_args()
    bundle, weights = Path(args.bundle), Path(args.weights)
    if args.model == "mobilenet_v3_small":
        ensure_bundle(bundle, weights)
    manifest = json.loads((bundle / "manifest.json").read_text())
    preprocessing = manifest["task_settings"]["preprocessing"]
    naive_env = {
        "NAIVE_WEIGHTS": str(weights),
        "NAIVE_IMAGE_MODEL": args.model,
        "NAIVE_PREPROCESSING": json.dumps(
            {k: preprocessing[k] for k in ("resize_size", "crop_size", "interpolation", "mean", "std")}
        ),
    }
    jpeg = make_jpeg()
    body = json.dumps({"image": base64.b64encode(jpeg).decode()})
    results: dict[str, Any] = {
        **measured_on(),
        "model": args.model,
        "bundle": str(bundle),
        "decode": preprocessing.get("decode", "exact"),
        "jpeg": {"width": WIDTH, "height": HEIGHT, "bytes": len(jpeg), "body_bytes": len(body)},
        "servers": [],
    }
    print(f"JPEG {WIDTH}x{HEIGHT}, {len(jpeg) / 1000:.0f} KB; offline stage costs", flush=True)
    with LoadWatch() as load:
        results["stages"] = stage_costs(bundle, jpeg, body.encode())
    results["stages_load"] = load.record.as_stats()  # the offline bound is wall-clock: load matters
    with tempfile.TemporaryDirectory() as tmp:
        files = {"json": Path(tmp) / "body.json", "jpeg": Path(tmp) / "image.jpg"}
        files["json"].write_text(body)
        files["jpeg"].write_bytes(jpeg)
        uvicorn = [sys.executable, "-m", "uvicorn", "--workers", str(os.cpu_count() or 2), "--log-level", "warning"]
        port = free_port()
        results["servers"].append(
            bench(
                "naive pytorch",
                [*uvicorn, "--no-access-log", "--port", str(port), "bench.baselines.naive_image:app"],
                naive_env,
                port,
                files,
                args.seconds,
                raw=False,
            )
        )
        port = free_port()
        results["servers"].append(
            bench(
                "simple ort",
                [*uvicorn, "--no-access-log", "--port", str(port), "bench.baselines.simple_ort_image:app"],
                {"BUNDLE": str(bundle), "VARIANT": results["stages"]["variant"]},
                port,
                files,
                args.seconds,
                raw=False,
            )
        )
        for name, extra in (("ortpack", []), ("ortpack --decode exact", ["--decode", "exact"])):
            port = free_port()
            command = [sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port)]
            command += ["--log-level", "warning", *extra]
            results["servers"].append(bench(name, command, {}, port, files, args.seconds, raw=True))
        # the bound again after the servers (a shared machine's speed drifts within a run): each
        # decode's share is against the higher of the two
        again = image_bounds(bundle, jpeg)
        for mode, value in again.items():
            key = f"offline bound {mode}"
            results["stages"][f"{key} runs"] = [results["stages"][key], value]
            results["stages"][key] = max(results["stages"][key], value)
    report(results, args.seconds)
    write_results(args.out, results)
    return 0


def runs_table(servers: list[dict[str, Any]], workload: bool = True) -> str:
    """One row per run of each server (with its workload's name when `workload`): requests/s,
    latency, errors, memory, CPU per request (and its main thread's share: in ortpack's server the
    event loop) and the machine's load."""
    columns = ["conc.", "req/s", "p50 ms", "p99 ms", "errors", "peak RSS MB", "CPU ms/req", "of it main thread", "load"]
    rows = [["server", *(["workload"] if workload else []), *columns]]
    for server in servers:
        for r in server["runs"]:
            rows.append(
                [
                    server["server"],
                    *([r["workload"]] if workload else []),
                    str(r["concurrency"]),
                    f"{r['requests_per_s']:.1f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    str(r["errors"]),
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['cpu_ms_per_request']:.1f}",
                    f"{r['main_thread_cpu_ms_per_request']:.2f}" if "main_thread_cpu_ms_per_request" in r else "-",
                    load_cell(r),
                ]
            )
    return table(rows)


def bound_cell(stages: dict[str, Any], mode: str) -> str:
    """The bound taken, then the two measures (before / after the servers)."""
    runs = " / ".join(f"{v:.0f}" for v in stages[f"offline bound {mode} runs"])
    return f"{stages[f'offline bound {mode}']:.0f} ({runs})"


def report(results: dict[str, Any], seconds: float) -> None:
    jpeg = results["jpeg"]
    print(
        f"\nimage serving: {results['model']} (default decode {results['decode']}), the same "
        f"{jpeg['width']}x{jpeg['height']} {jpeg['bytes'] / 1000:.0f} KB "
        f"JPEG, {results['cpu_count']} cores ({results['cpu']}), {seconds:.0f} s per row"
    )
    print(runs_table(results["servers"]))
    runs = {(s["server"], r["workload"], r["concurrency"]): r for s in results["servers"] for r in s["runs"]}
    ratios = [
        [
            "workload",
            "conc.",
            "default vs naive",
            "exact vs naive",
            "default vs simple ort",
            "exact vs simple ort",
            "p99 ms: naive / simple / default / exact",
        ]
    ]
    for workload in ("base64 JSON", "raw bytes"):
        for c in CONCURRENCY:
            naive, simple = runs[("naive pytorch", "base64 JSON", c)], runs[("simple ort", "base64 JSON", c)]
            ours, exact = runs[("ortpack", workload, c)], runs[("ortpack --decode exact", workload, c)]
            ratios.append(
                [
                    workload + ("" if workload == "base64 JSON" else " (others: JSON)"),
                    str(c),
                    *(
                        f"{a['requests_per_s'] / b['requests_per_s']:.2f}x"
                        for a, b in ((ours, naive), (exact, naive), (ours, simple), (exact, simple))
                    ),
                    f"{naive['p99_ms']:.0f} / {simple['p99_ms']:.0f} / {ours['p99_ms']:.0f} / {exact['p99_ms']:.0f}",
                ]
            )
    results["ratios"] = ratios
    print("\n" + table(ratios))
    stages = results["stages"]
    split = [["stage (CPU ms per request)", "default decode", "exact decode"]]
    split.append(["decoded image", stages["decoded size default"], stages["decoded size exact"]])
    for label, key in (("JSON parse", "json parse"), ("base64", "base64")):
        split.append([label, f"{stages[key]:.2f}", f"{stages[key]:.2f}"])
    for label, key in (
        ("decode", "decode"),
        ("graph: preprocessing", "graph {} preprocess"),
        ("graph: network", "graph {} network"),
    ):
        split.append(
            [label, *(f"{stages[key.format(m) if '{' in key else f'{key} {m}']:.2f}" for m in ("default", "exact"))]
        )
    for mode_label, server in (("default", "ortpack"), ("exact", "ortpack --decode exact")):
        measured = runs[(server, "base64 JSON", 50)]["cpu_ms_per_request"]
        known = stages["json parse"] + stages["base64"] + stages[f"decode {mode_label}"] + stages[f"graph {mode_label}"]
        stages[f"rest {mode_label}"] = measured - known
        stages[f"server {mode_label}"] = measured
    split.append(
        ["the rest: HTTP, routing, queue, answer", f"{stages['rest default']:.2f}", f"{stages['rest exact']:.2f}"]
    )
    split.append(
        ["server total at c=50 (measured)", f"{stages['server default']:.2f}", f"{stages['server exact']:.2f}"]
    )
    split.append(
        [
            "offline bound, images/s (decode + graph, 2 threads; the higher of before and after the servers)",
            *(bound_cell(stages, mode) for mode in ("default", "exact")),
        ]
    )
    results["cpu_split"] = split
    print(f"\nvariant {stages['variant']}, default decode: {stages['default_decode']}")
    print(table(split))
    shares = [["served at c=50 / offline bound", "default decode", "exact decode"]]
    for workload in ("base64 JSON", "raw bytes"):
        served = [runs[(server, workload, 50)]["requests_per_s"] for server in ("ortpack", "ortpack --decode exact")]
        bounds = [stages["offline bound default"], stages["offline bound exact"]]
        shares.append([workload, *(f"{s / b:.0%} ({s:.0f} of {b:.0f}/s)" for s, b in zip(served, bounds, strict=True))])
    results["shares"] = shares
    print("\n" + table(shares))
    print("\n" + cold_start_table(results["servers"]))


if __name__ == "__main__":
    sys.exit(main())
