"""Vision int8, measured: fp32 and int8 of the image models that install here, latency against each
other and against PyTorch eager, int8 quality by the task's gate, and what ONNX Runtime runs.

    python bench/vision_int8.py [--models resnet50,lite0,lite0-embedding,yolov8s] \
        [--compare-with DIR] [--out bench/results/vision_int8.json]

Models (`MODELS`): ResNet-50 (torchvision, random weights: for speed), EfficientNet-Lite0 with its
ImageNet weights as a classifier and as image embeddings (`make trained`), the trained YOLOv8s fall
detector (`make trained`). Photos: tests/photos.py's validation (the gate), calibration (int8) and
held-out sets (classifiers: agreement on photos the gate never saw, exact decode, batch 1).

Each model is exported once; each variant is built by the optimize step and gated by the validate
step of this checkout; `--compare-with DIR` (a checkout of the code before, e.g. `git worktree add
/tmp/before HEAD~1`) also builds int8 with that code's optimize step, from the same export, in a
subprocess, gated by this checkout's validate step. The variants are then timed here, in one
process, in alternate rounds (components/core/timing.py), each session as a server creates it
(online level as recorded, one intra-op thread per core) at the build benchmark's shapes (batch 1
and 8 of 480x640 photos, preprocessing included; detectors batch 1), PyTorch eager among them
(torchvision's transforms and the model, as the export measures it; the detector's whole path).
Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEAN_LITE, STD_LITE = (0.498, 0.498, 0.498), (0.502, 0.502, 0.502)  # EfficientNet-Lite: (x*255-127)/128
QUALITY = {
    "image-classification": ("top1_agreement", "top5_agreement", "served.exact.decisive_top1_agreement"),
    "image-embedding": ("min_cosine", "mean_cosine", "retrieval_recall_ratio"),
    "object-detection": ("decisive_recall", "decisive_precision", "min_matched_iou", "max_score_diff"),
}


def model_specs(photos: Any, work: Path) -> dict[str, dict[str, Any]]:
    from torchvision.models import ResNet50_Weights

    from tests.trained import efficientnet_lite0_weights

    labels = work / "imagenet.txt"
    labels.write_text("\n".join(ResNet50_Weights.DEFAULT.meta["categories"]) + "\n")
    common = {"validation_images": str(photos.validation), "calibration_images": str(photos.calibration)}

    def lite0() -> dict[str, Any]:
        return {"weights": str(efficientnet_lite0_weights()), "mean": MEAN_LITE, "std": STD_LITE, **common}

    return {
        "resnet50": {"source": "resnet50", "task": "image-classification", "options": lambda: dict(common)},
        "lite0": {
            "source": "examples.efficientnet_lite:efficientnet_lite0",
            "task": "image-classification",
            "options": lambda: {**lite0(), "labels": str(labels)},
        },
        "lite0-embedding": {
            "source": "examples.efficientnet_lite:efficientnet_lite0",
            "task": "image-embedding",
            "options": lite0,
        },
        "yolov8s": {
            "source": "examples.yolov8:fall_detector",
            "task": "object-detection",
            "options": lambda: {"decoder": "yolo", **common},
        },
    }


MODELS = ("resnet50", "lite0", "lite0-embedding", "yolov8s")


def build_before(checkout: Path, export_dir: Path, out: Path) -> None:
    """int8 built by another checkout's optimize step (its own recipe search), in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-m", "ortpack.pipelines.cli", "optimize", "--export", str(export_dir)]
    cmd += ["--target", "cpu", "--precision", "int8", "--out", str(out), "--force", "-q"]
    subprocess.run(cmd, check=True, env=env, cwd=checkout)


def heldout(task: str, export_dir: Path, spec: dict[str, Any], photos: Path, dirs: dict[str, Path]) -> dict[str, Any]:
    """Classifiers: each variant's agreement with PyTorch on the held-out photos (exact decode,
    batch 1), as bench/heldout_images.py measures a bundle."""
    if task != "image-classification" or not spec.get("weights"):  # random weights: nothing to agree on
        return {}
    from bench.heldout_images import pytorch_probabilities, served_agreement
    from ortpack.components.core.artifacts import ExportResult, OptimizeResult
    from ortpack.components.core.validation_data import read_image_files
    from ortpack.kernel.images import ImageDecoder
    from ortpack.kernel.runtime import create_session, plan_for

    pre = ExportResult.load(export_dir).task_settings["preprocessing"]
    files = read_image_files(str(photos), "held-out photos")
    expected = pytorch_probabilities(files, pre, spec["source"], spec.get("weights"))
    decoder = ImageDecoder(max_pixels=1 << 40)
    out = {}
    for vid, directory in dirs.items():
        session = create_session(directory / "model.onnx", plan_for(OptimizeResult.load(directory)))
        out[vid] = served_agreement(session, files, expected, decoder)
    return out


def torch_calls(task: str, spec: dict[str, Any], export_dir: Path) -> dict[str, Any]:
    """{shape: one PyTorch eager call} at the benchmark shapes, the way the export measures it:
    torchvision's transforms then the model (classifier or embedder); the detector's whole path
    (letterbox, network, decoding, NMS) on one photo."""
    import torch

    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.benchmark import bench_feeds
    from ortpack.components.core.exporters.image_classification import Classifier
    from ortpack.components.core.exporters.image_common import reference_transform
    from ortpack.components.core.exporters.image_embedding import Embedder
    from ortpack.components.core.exporters.image_models import load_image_network, parse_image_source

    export = ExportResult.load(export_dir)
    feeds = bench_feeds(export)
    if task == "object-detection":
        from examples.yolov8 import fall_detector
        from ortpack.components.core.exporters.detection_graphs import YoloReference

        reference = YoloReference(fall_detector(), 640, 114, 0.25, 0.45, 300)
        return {shape: partial(reference, images["images"][0]) for shape, (_, images) in feeds.items()}
    pre = export.task_settings["preprocessing"]
    network, _ = load_image_network(parse_image_source(spec["source"]), spec.get("weights"), int(pre["crop_size"]))
    model = (Classifier(network) if task == "image-classification" else Embedder(network, True)).eval()
    transform = reference_transform(pre)
    mean, std = torch.tensor(pre["mean"]).view(1, 3, 1, 1), torch.tensor(pre["std"]).view(1, 3, 1, 1)

    @torch.inference_mode()
    def call(batch: torch.Tensor) -> torch.Tensor:
        x = transform(batch.permute(0, 3, 1, 2)).float() / 255.0
        return model((x - mean) / std)

    return {shape: partial(call, torch.from_numpy(images["images"])) for shape, (_, images) in feeds.items()}


def time_variants(
    export_dir: Path, dirs: dict[str, Path], torch_calls_: dict[str, Any]
) -> dict[str, dict[str, dict[str, float]]]:
    """{engine: {shape: {min_ms, p50_ms}}}: every variant and PyTorch at every benchmark shape, in
    alternate rounds in this process, each session as the server creates it."""
    from ortpack.components.core.artifacts import ExportResult, OptimizeResult
    from ortpack.components.core.benchmark import bench_feeds
    from ortpack.components.core.timing import measure_interleaved, timed
    from ortpack.kernel.hardware import this_machine
    from ortpack.kernel.runtime import create_session, plan_for

    cores = this_machine().cores
    sessions = {
        vid: create_session(d / "model.onnx", plan_for(OptimizeResult.load(d)), intra_op_threads=cores)
        for vid, d in dirs.items()
    }
    out: dict[str, dict[str, dict[str, float]]] = {vid: {} for vid in [*dirs, "pytorch"]}
    for shape, (_, feeds) in bench_feeds(ExportResult.load(export_dir)).items():
        calls = {vid: timed(partial(s.run, None, feeds)) for vid, s in sessions.items()}
        calls["pytorch"] = timed(torch_calls_[shape])
        # 50 ms between calls: each engine's thread pool spin-waits after its call, and would take
        # the cores from the next engine's call (as in bench/model_latency.py)
        stats = measure_interleaved(
            calls, warmup=2, min_iters=5, max_iters=60, budget_s=2.0, honour_quick=False, settle_s=0.05
        )
        for vid in calls:
            out[vid][shape] = {k: round(stats[vid][k], 3) for k in ("min_ms", "p50_ms")}
    return out


def run_model(
    name: str, spec: dict[str, Any], work: Path, photos: Any, before: Path | None, *, reuse: bool = False
) -> dict[str, Any]:
    """Export, build and gate `name` in `work/name` (or, `reuse`, read what an earlier run left
    there), then time and compare its variants."""
    import shutil

    from ortpack.components.core.artifacts import ExportResult, OptimizeResult, ParityReport
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    root = work / name
    options = spec["options"]()
    export_dir = root / "export"
    dirs = {"cpu-fp32": root / "fp32", "cpu-int8": root / "int8"}
    if before is not None:
        dirs["before-int8"] = root / "before-int8"
    if not reuse:
        shutil.rmtree(root, ignore_errors=True)
        spec_ = ExportSpec(source=spec["source"], task=spec["task"], name=name, options=options)
        export_model(spec_, export_dir)
        for precision in ("fp32", "int8"):
            optimize_model(export_dir, VariantSpec(target="cpu", precision=precision), dirs[f"cpu-{precision}"])
        if before is not None:
            build_before(before, export_dir, dirs["before-int8"])
    result: dict[str, Any] = {"task": spec["task"], "variants": {}}
    for vid, directory in dirs.items():
        precision = "fp32" if vid.endswith("fp32") else "int8"
        if reuse:
            parity = ParityReport.load(directory)
        else:
            parity = validate_variant(directory, export_dir, thresholds_for(spec["task"], precision))
        built = OptimizeResult.load(directory)
        int8 = built.metrics.get("int8") or {}
        if "kernels" not in int8 and precision == "int8":  # the code before did not count them
            from ortpack.components.core.quantization.static_int8 import kernel_census

            int8["kernels"] = kernel_census(directory / "model.onnx", level=built.online_optimization_level)
        result["variants"][vid] = {
            "passed": parity.passed,
            "misses": parity.misses,
            "quality": {k: parity.values[k] for k in QUALITY[spec["task"]] if k in parity.values},
            "recipe": int8.get("candidate") or int8.get("recipe"),
            "weight_bits": int8.get("weight_bits"),
            "float_layers": list(int8.get("float_layers") or {}),
            "kernels": int8.get("kernels"),
            "online_level": built.online_optimization_level,
        }
    latency = time_variants(export_dir, dirs, torch_calls(spec["task"], {**spec, **options}, export_dir))
    torch = latency.pop("pytorch")
    for vid, shapes in latency.items():
        row = result["variants"][vid]
        row["latency_ms"] = shapes
        row["vs_fp32"] = {s: round(latency["cpu-fp32"][s]["p50_ms"] / v["p50_ms"], 3) for s, v in shapes.items()}
        row["vs_torch"] = {s: round(torch[s]["p50_ms"] / v["p50_ms"], 3) for s, v in shapes.items()}
    result["torch_ms"] = {s: v["p50_ms"] for s, v in torch.items()}
    at_export = ExportResult.load(export_dir).torch_latency  # measured alone, at export: for comparison
    result["torch_at_export_ms"] = {s: round(v["p50_ms"], 3) for s, v in at_export.items()}
    for vid, metrics in heldout(spec["task"], export_dir, {**spec, **options}, photos.heldout, dirs).items():
        result["variants"][vid]["heldout"] = {
            k: metrics[k] for k in ("top1_agreement", "top5_agreement", "decisive_top1_agreement", "decisive_rows")
        }
    return result


def _heldout(metrics: dict[str, float] | None) -> str:
    return f"{metrics['top1_agreement']:.3f} ({metrics['decisive_top1_agreement']:.3f})" if metrics else "-"


def print_table(results: dict[str, Any]) -> None:
    header = ["model", "variant", "gate", "p50 b1", "p50 b8", "×fp32 b1", "×fp32 b8", "×torch b1", "×torch b8"]
    header += ["int8 convs", "float convs", "fp32 layers", "quality", "held-out top-1 (decisive)"]
    rows = [header]
    for model, res in results.items():
        for vid, v in res["variants"].items():
            lat, kernels = v["latency_ms"], v.get("kernels") or {}
            shapes = ("b1_480x640", "b8_480x640")
            heldout_ = v.get("heldout")
            rows.append(
                [
                    model,
                    vid + (f" ({v['recipe']})" if v.get("recipe") else ""),
                    "pass" if v["passed"] else "MISS",
                    *(f"{lat[s]['p50_ms']:.1f}" if s in lat else "-" for s in shapes),
                    *(f"{v['vs_fp32'][s]:.2f}" if s in v["vs_fp32"] else "-" for s in shapes),
                    *(f"{v['vs_torch'][s]:.2f}" if s in v["vs_torch"] else "-" for s in shapes),
                    str((kernels.get("int8") or {}).get("QLinearConv", "-")) if kernels else "-",
                    str((kernels.get("float") or {}).get("Conv", 0) + (kernels.get("float") or {}).get("FusedConv", 0))
                    if kernels
                    else "-",
                    str(len(v.get("float_layers") or [])),
                    " ".join(f"{k.split('.')[-1]}={val:.3f}" for k, val in v["quality"].items()),
                    _heldout(heldout_),
                ]
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--compare-with", type=Path, help="a checkout of the code before: its int8 is built too")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "vision_int8")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vision_int8.json")
    parser.add_argument("--reuse", action="store_true", help="time and compare what an earlier run built in --work")
    args = parser.parse_args()
    import logging

    from ortpack.kernel.hardware import this_machine
    from tests.photos import write_photo_sets

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    photos = write_photo_sets(args.work / "photos")
    specs = model_specs(photos, args.work)
    results = {}
    for name in args.models.split(","):
        if name not in specs:
            parser.error(f"unknown model {name!r} (known: {', '.join(MODELS)})")
        results[name] = run_model(name, specs[name], args.work, photos, args.compare_with, reuse=args.reuse)
    machine = this_machine()
    record = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine.as_dict(),
        "compare_with": str(args.compare_with) if args.compare_with else None,
        "models": results,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\n{machine.summary()}; latency p50 ms, 480x640 photos with preprocessing in the graph")
    print_table(results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
