"""Agreement of an image bundle with PyTorch on photos its parity gate did not use.

    python bench/heldout_images.py --bundle dist/efficientnet_lite0 --photos DIR \
        --model examples.efficientnet_lite:efficientnet_lite0 --weights W.pth

Every variant runs the served path (the server's decoder, exact and, where the bundle allows it,
reduced, then the graph at batch 1) on each photo; PyTorch runs the model on Pillow's full decode
with torchvision's transforms (the same reference the gate uses). Prints top-1, top-5 and decisive
top-1 agreement per variant and decode mode (kernel/gates.py), writes bench/results/heldout_images.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pytorch_probabilities(files: list[tuple[str, bytes]], pre: dict[str, Any], model: str, weights: str | None) -> Any:
    """PyTorch's probabilities of each (name, bytes) file: Pillow's full decode, torchvision's
    transforms (`pre`: the bundle's preprocessing), the model."""
    import torch

    from ortpack.components.core.exporters.image_classification import Classifier, classify_pixels
    from ortpack.components.core.exporters.image_common import reference_decode
    from ortpack.components.core.exporters.image_models import load_image_network, parse_image_source

    network, _ = load_image_network(parse_image_source(model), weights, int(pre["crop_size"]))
    classifier = Classifier(network).eval()
    with torch.inference_mode():
        return np.stack([classify_pixels(classifier, pre, reference_decode(data)) for _, data in files])


def served_agreement(session: Any, files: list[tuple[str, bytes]], expected: Any, decoder: Any) -> dict[str, float]:
    """A variant's agreement with `expected` on the served path: `decoder`, then the graph at batch 1."""
    from ortpack.kernel.gates import probability_metrics

    rows = [session.run(None, {"images": decoder.decode(data, name)[None]})[0][0] for name, data in files]
    return probability_metrics(expected, np.stack(rows))


def heldout_agreement(bundle: Path, photos: Path, model: str, weights: str | None) -> dict[str, Any]:
    """{variant: {decode mode: metrics}} on the photos in `photos`."""
    from ortpack.components.core.validation_data import read_image_files
    from ortpack.kernel.bundle import verify_bundle
    from ortpack.kernel.images import ImageDecoder
    from ortpack.kernel.runtime import create_session, plan_for

    manifest = verify_bundle(bundle)
    assert manifest.task_settings.preprocessing is not None
    pre = manifest.task_settings.preprocessing.model_dump()
    files = read_image_files(str(photos), "held-out photos")
    expected = pytorch_probabilities(files, pre, model, weights)
    decoders = {"exact": ImageDecoder(max_pixels=1 << 40)}
    if pre.get("decode_min_side"):
        decoders["reduced"] = ImageDecoder(max_pixels=1 << 40, reduce_to=int(pre["decode_min_side"]))
    results: dict[str, Any] = {}
    for variant in manifest.variants:
        session = create_session(bundle / variant.file, plan_for(variant))
        results[variant.id] = {
            mode: served_agreement(session, files, expected, decoder) for mode, decoder in decoders.items()
        }
    return {"photos": len(files), "variants": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--photos", required=True)
    parser.add_argument("--model", required=True, help="what the bundle was built from (--model of the build)")
    parser.add_argument("--weights")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "heldout_images.json"))
    args = parser.parse_args()
    from ortpack.kernel.hardware import this_machine

    result = heldout_agreement(Path(args.bundle), Path(args.photos), args.model, args.weights)
    print(f"{result['photos']} held-out photos ({this_machine().summary()})")
    print(f"{'variant':10s} {'decode':8s} {'top-1':>6s} {'top-5':>6s} {'decisive top-1':>15s} {'max|diff|':>9s}")
    for variant, modes in result["variants"].items():
        for mode, m in modes.items():
            decisive = f"{m['decisive_top1_agreement']:.3f} of {int(m['decisive_rows'])}"
            print(
                f"{variant:10s} {mode:8s} {m['top1_agreement']:6.3f} {m['top5_agreement']:6.3f} "
                f"{decisive:>15s} {m['max_abs_diff']:9.3f}"
            )
    result.update(created_at=datetime.now(UTC).isoformat(timespec="seconds"), machine=this_machine().as_dict())
    result.update(bundle=args.bundle, model=args.model)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
