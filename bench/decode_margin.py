"""How small may a reduced JPEG decode be? PyTorch on libjpeg's reduced decode against the full one.

    python bench/decode_margin.py [--weights FILE] [--images 200] [--margins 1.5,1.75,1.875,2]

Reduced decoding (kernel/images.py) asks libjpeg for the smallest DCT scale (1/2, 1/4, 1/8)
that keeps the shorter side at least `margin x resize_size`; the graph then resizes that. For
each margin this generates `--images` photo-like JPEGs (the validation set's contents: gradients,
shapes, text, zone plates; qualities 70-95; chroma 4:2:0, 4:2:2, 4:4:4; 4:3, 3:2 and 16:9, both
ways) whose shorter side is exactly twice the margin's size, the worst case (the 1/2 decode lands
on the margin itself), and compares MobileNetV3-small's top-1, top-5 and probabilities (torchvision
transforms, PyTorch) on the reduced against the full decode. Writes bench/results/decode_margin.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ASPECTS = ((4, 3), (3, 2), (16, 9), (3, 4), (2, 3), (9, 16))
CONTENTS = ("photo", "edges", "text", "fine")
DECISIVE = 0.02  # reference top-1 ahead of the second by at least this: not a tie any graph may flip


def measure(weights: Path, margins: list[float], images: int) -> dict[str, Any]:
    import torch

    from ortpack.components.core.exporters.image_classification import Classifier, classify_pixels
    from ortpack.components.core.exporters.image_common import preprocessing_spec, reference_decode
    from ortpack.components.core.exporters.image_models import load_image_network, parse_image_source
    from ortpack.components.core.specs import ExportSpec
    from ortpack.components.core.validation_data import EncodedImageSpec, encode_validation_image
    from ortpack.kernel.gates import topk_overlap
    from ortpack.kernel.images import ImageDecoder

    torch.set_num_threads(1)
    spec = ExportSpec(
        source="mobilenet_v3_small", task="image-classification", name="m", options={"weights": str(weights)}
    )
    pre = preprocessing_spec(spec)
    network, _ = load_image_network(parse_image_source(spec.source), str(weights), pre["crop_size"])
    classifier = Classifier(network).eval()
    out: dict[str, Any] = {}
    for margin in margins:
        side = math.ceil(margin * pre["resize_size"])
        decoder = ImageDecoder(1 << 40, reduce_to=side)
        full_rows, reduced_rows, started = [], [], time.perf_counter()
        for i in range(images):
            a, b = ASPECTS[i % len(ASPECTS)]
            short = 2 * side  # the 1/2 decode lands exactly on the margin
            width, height = (short * a // b, short) if a >= b else (short, short * b // a)
            file = EncodedImageSpec(
                width=width,
                height=height,
                content=CONTENTS[i % len(CONTENTS)],
                format="JPEG",
                quality=(95, 90, 85, 75, 70)[i % 5],
                subsampling=(2, 1, 0)[i % 3],
                seed=50_000 + i,
            )
            data = encode_validation_image(file)
            reduced = decoder.decode(data)
            assert min(reduced.shape[:2]) == side, (reduced.shape, side)
            full_rows.append(classify_pixels(classifier, pre, reference_decode(data)))
            reduced_rows.append(classify_pixels(classifier, pre, reduced))
        full, red = np.stack(full_rows).astype(np.float64), np.stack(reduced_rows).astype(np.float64)
        diff = np.abs(full - red).max(axis=1)
        ranked = np.sort(full, axis=1)
        decisive = ranked[:, -1] - ranked[:, -2] >= DECISIVE  # the reference's top-1 leads clearly
        agree = full.argmax(1) == red.argmax(1)
        result = {
            "min_side": side,
            "images": images,
            "top1_agreement": float(np.mean(agree)),
            "decisive_images": int(decisive.sum()),
            "decisive_top1_agreement": float(np.mean(agree[decisive])) if decisive.any() else 1.0,
            "top5_agreement": float(topk_overlap(full, red, 5).mean()),
            "max_abs_diff": float(diff.max()),
            "p99_abs_diff": float(np.percentile(diff, 99)),
            "median_abs_diff": float(np.median(diff)),
            "seconds": time.perf_counter() - started,
        }
        out[f"{margin:g}"] = result
        print(
            f"margin {margin:g}x ({side} px): top-1 {result['top1_agreement']:.4f} "
            f"({result['decisive_top1_agreement']:.4f} on {result['decisive_images']} decisive), "
            f"top-5 {result['top5_agreement']:.4f}, "
            f"max |diff| {result['max_abs_diff']:.4f} (p99 {result['p99_abs_diff']:.4f}, median "
            f"{result['median_abs_diff']:.4f}), {images} images",
            flush=True,
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default=str(ROOT / "dist" / "mobilenet_v3_small.safetensors"))
    parser.add_argument("--images", type=int, default=200, help="images per margin")
    parser.add_argument("--margins", default="1.5,1.75,1.875,2", help="comma-separated margins (x resize size)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_margin.json"))
    args = parser.parse_args()
    weights = Path(args.weights)
    if not weights.is_file():
        from tests.models import make_image_weights

        make_image_weights("mobilenet_v3_small", weights)
    results = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": "mobilenet_v3_small (random weights, made non-degenerate: tests/models.py)",
        "margins": measure(weights, [float(m) for m in args.margins.split(",")], args.images),
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
