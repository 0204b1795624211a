"""What batching images buys on the CPU: ms of one thread's CPU per image by batch size, for each
image bundle's served variant (one intra-op thread, as each server worker runs it).

    python bench/image_batching.py [dist/mobilenet_v3_small dist/efficientnet-lite0-embedding ...]

The graph resizes each image from its full size, so the sizes are the crop, VGA and a 1280x960
photo. Writes bench/results/image_batching.json. Why the server runs one image per call on the CPU
(`--max-batch-pixels 0`): docs/image-classification.md#batching.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.serve_load import table, write_results  # noqa: E402
from ortpack.kernel.hardware import this_machine  # noqa: E402

BUNDLES = ("mobilenet_v3_small", "efficientnet-lite0-embedding", "fall-yolov8s")
SIZES = ((224, 224), (480, 640), (960, 1280))
BATCHES = (1, 2, 4, 8)


def per_image_ms(session: Any, name: str, batch: Any, calls: int) -> float:
    """CPU ms per image of `calls` runs of `batch` (this thread's CPU time: other load does not count)."""
    session.run(None, {name: batch})
    started = time.thread_time()
    for _ in range(calls):
        session.run(None, {name: batch})
    return (time.thread_time() - started) / calls * 1000 / len(batch)


def measure(bundle: Path) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from ortpack.kernel.bundle import read_manifest
    from ortpack.kernel.runtime import serving_session
    from ortpack.kernel.selection import choose_variant

    manifest = read_manifest(bundle)
    variant = choose_variant(manifest, "auto", ort.get_available_providers(), this_machine())
    session, _ = serving_session((bundle / variant.file).read_bytes(), variant, intra_op_threads=1)
    name = session.get_inputs()[0].name
    rows = []
    rng = np.random.default_rng(0)
    for height, width in SIZES:
        image = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        ms = {b: per_image_ms(session, name, np.stack([image] * b), max(3, 24 // b)) for b in BATCHES}
        rows.append({"image": f"{width}x{height}", "ms_per_image": ms})
        print(f"{bundle.name} {width}x{height}: " + ", ".join(f"b{b} {v:.2f}" for b, v in ms.items()), flush=True)
    return {"bundle": bundle.name, "variant": variant.id, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundles", nargs="*", help="image bundles (default: those under dist/ of " + ", ".join(BUNDLES))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "image_batching.json"), help="JSON output")
    args = parser.parse_args()
    bundles = [Path(b) for b in args.bundles] or [ROOT / "dist" / b for b in BUNDLES if (ROOT / "dist" / b).is_dir()]
    if not bundles:
        raise SystemExit("no image bundle given or found under dist/ (make run builds them)")
    machine = this_machine()
    results = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": machine.cpu_model,
        "cpu_count": os.cpu_count(),
        "models": [measure(b) for b in bundles],
    }
    rows = [["model (variant)", "image", *(f"b{b} ms/image" for b in BATCHES), "b8 / b1"]]
    for model in results["models"]:
        for row in model["rows"]:
            ms = row["ms_per_image"]
            per_batch = [f"{ms[b]:.2f}" for b in BATCHES]
            rows.append([f"{model['bundle']} ({model['variant']})", row["image"], *per_batch, f"{ms[8] / ms[1]:.2f}x"])
    print(f"\nCPU ms per image by batch size, one thread ({results['cpu']}):")
    print(table(rows))
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
