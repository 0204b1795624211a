"""What a request holds per body byte, by task and input form, measured: the evidence for the
memory budget's factors (serving/memory.py, which still reserves 4x any body and 5x decoded pixels).

    python bench/memory_factors.py [--text-bundle DIR] [--image-bundle DIR] [--out bench/results/memory_factors.json]

Each request is sent from another process to the real app on a port of this process (uvicorn on a
thread), under `tracemalloc`: the peak of what Python and numpy allocated while it ran, less what
was allocated before, divided by the body's size, and again less the decoded pixels ("besides
pixels": what the body costs besides its images). ONNX Runtime's own buffers (its arena, the
float copies of a running batch) are not traced. Without bundles: the text bundle is built as the
suite's tiny one, the image bundle is `dist/mobilenet_v3_small` (`make bench-image` builds it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import sys
import tempfile
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


JSON = "application/json"


def photo_jpeg(width: int = 1280, height: int = 960) -> bytes:
    from PIL import Image

    from ortpack.components.core.validation_data import ImageSpec, render_image

    buffer = io.BytesIO()
    Image.fromarray(render_image(ImageSpec(height, width, "photo", 3))).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def forms(task: str, name: str) -> dict[str, tuple[str, bytes, str]]:
    """Form -> (path, body, content type) for one request of each input form the task takes."""
    import numpy as np
    from PIL import Image

    if task == "text-embedding":
        texts = [f"document {i} about the retrieval of vectors from an index " * 30 for i in range(256)]
        body = json.dumps({"input": texts}).encode()
        return {"JSON texts (256 x ~1,800 chars)": ("/v1/embeddings", body, JSON)}
    jpeg = photo_jpeg()
    encoded = base64.b64encode(jpeg).decode()
    pixels = np.asarray(Image.open(io.BytesIO(photo_jpeg(320, 240))).convert("RGB"))  # the v2 tensor: decoded
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, *pixels.shape]}
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": pixels.nbytes}}]}).encode()
    v2_json = json.dumps({"inputs": [{**tensor, "data": pixels.ravel().tolist()}]}).encode()
    return {
        "raw bytes (1280x960 JPEG)": ("/v1/classify", jpeg, "image/jpeg"),
        "base64 JSON (1280x960 JPEG)": ("/v1/classify/json", json.dumps({"images": [encoded]}).encode(), JSON),
        "v2 JSON (UINT8 320x240x3)": (f"/v2/models/{name}/infer", v2_json, JSON),
        "v2 binary (UINT8 320x240x3)": (f"/v2/models/{name}/infer", header + pixels.tobytes(), f"binary:{len(header)}"),
    }


SEND = """
import sys, urllib.request
path, kind, header = sys.argv[2], sys.argv[3], sys.argv[4]
request = urllib.request.Request(sys.argv[1] + path, data=open(sys.argv[5], "rb").read(), method="POST")
if kind.startswith("binary:"):
    request.add_header("Inference-Header-Content-Length", kind.split(":")[1])
else:
    request.add_header("Content-Type", kind)
print(urllib.request.urlopen(request, timeout=120).status)
"""


def measure(bundle: Path, work: Path) -> list[dict[str, Any]]:
    """The app on a real port in this process (uvicorn on a thread); each request sent from another
    process, so that what is traced is the server's alone."""
    import subprocess
    import threading
    import time

    import uvicorn

    from bench.serve_load import free_port
    from ortpack.kernel.bundle import read_manifest
    from ortpack.serving.app import serving_app
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    manifest = read_manifest(bundle)
    task = manifest.task_settings.task
    config = ServeConfig(bundle=str(bundle), variant="cpu-fp32", max_batch_size=8)
    service = load_service(bundle, config, Metrics())
    service.open_lone(config.max_batch_size, config.warmup)
    app = serving_app(service, config)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    loop_thread = threading.Thread(target=server.run, daemon=True)
    started = False

    async def start() -> None:
        await service.start(config)

    rows = []
    try:
        loop_thread.start()
        while not server.started:
            time.sleep(0.05)
        asyncio.run_coroutine_threadsafe(start(), server_loop(server)).result(120)
        started = True
        for form, (path, body, kind) in forms(task, manifest.name).items():
            file = work / "body"
            file.write_bytes(body)
            send = [sys.executable, "-c", SEND, f"http://127.0.0.1:{port}", path, kind, "", str(file)]
            first = subprocess.run(send, capture_output=True, text=True)  # warm: pools, caches
            assert first.stdout.strip() == "200", (form, first.stdout, first.stderr[-500:])
            tracemalloc.start()
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            answer = subprocess.run(send, capture_output=True, text=True)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert answer.stdout.strip() == "200", (form, answer.stdout, answer.stderr[-500:])
            rows.append({"task": task, "form": form, "body_bytes": len(body), "peak_bytes": peak - before,
                         "decoded_bytes": decoded_bytes(service, form, body),
                         "per_body_byte": (peak - before) / len(body)})  # fmt: skip
    finally:
        if started:
            asyncio.run_coroutine_threadsafe(service.stop(), server_loop(server)).result(60)
        server.should_exit = True
        loop_thread.join(30)
    return rows


def server_loop(server: Any) -> asyncio.AbstractEventLoop:
    """The event loop uvicorn's `server.run` runs on (its thread's)."""
    return next(iter(server.servers)).get_loop()  # type: ignore[no-any-return]


def decoded_bytes(service: Any, form: str, body: bytes) -> int:
    """The pixels the request's images decode to (held apart by the budget: 5x): the decoded
    file for the JPEG forms, the tensor itself for v2."""
    if "JPEG" in form:
        return int(service.runtime.images.decoder.decode(photo_jpeg(), "the body").nbytes)
    if "UINT8" in form:
        return 320 * 240 * 3
    return 0


def text_bundle(work: Path) -> Path:
    from bench.faults import tiny_bundle

    return tiny_bundle(work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text-bundle", default="")
    parser.add_argument("--image-bundle", default=str(ROOT / "dist" / "mobilenet_v3_small"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory_factors.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ortpack-memory-") as tmp:
        bundles = [Path(args.text_bundle) if args.text_bundle else text_bundle(Path(tmp))]
        if Path(args.image_bundle).is_dir():
            bundles.append(Path(args.image_bundle))
        else:
            print(f"no image bundle at {args.image_bundle} (make bench-image builds it): text only")
        for bundle in bundles:
            rows += measure(bundle, Path(tmp))
    from bench.serve_load import table

    print(table([["task", "form", "body MB", "peak MB", "decoded MB", "per body byte", "besides pixels"],
                 *[[r["task"], r["form"], f"{r['body_bytes'] / 1e6:.2f}", f"{r['peak_bytes'] / 1e6:.2f}",
                    f"{r['decoded_bytes'] / 1e6:.2f}", f"{r['per_body_byte']:.2f}",
                    f"{(r['peak_bytes'] - r['decoded_bytes']) / r['body_bytes']:.2f}"] for r in rows]]))  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": datetime.now(UTC).isoformat(timespec="seconds"), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
