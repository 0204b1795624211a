"""The image-embedding family: one vector per image (a torchvision classifier's pooled features,
your own module, or a .pt2) with the image classifier's preprocessing, pooling and L2
normalisation in the graph (exporter: components/core/exporters/image_embedding.py), `images`
uint8 `[batch, height, width, 3]` to `image_embedding` float32 `[batch, dim]`.

Gated on vector distance, cosine and neighbour agreement at batch 1 and 8 (raw images through the
graph's preprocessing against torchvision's) and on the served path (the encoded files through the
server's decoder), the worst of them; and on retrieval, the check this task owns: cropped,
rescaled and re-encoded copies of every validation file (`retrieval_copies`) search the files,
and the variant's Recall@1 is compared with PyTorch's own (`retrieval_recall_ratio`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortpack.components.core.exporters.hf_vision import hf_vision_type
from ortpack.components.core.exporters.image_models import parse_image_source
from ortpack.components.core.exporters.image_retrieval import RECALL_AT, retrieval_copies, retrieval_recall
from ortpack.components.core.quantization.int8_search import session
from ortpack.components.core.quantization.recipes import STATIC_INT8_RECIPES
from ortpack.components.core.quantization.static_int8 import family_int8
from ortpack.components.core.reference import Reference
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.components.core.tasks.image_classification import calibration_images, raw_images
from ortpack.components.core.validation_data import (
    ImageSpec,
    encode_validation_image,
    encoded_validation_images,
    render_image,
    unpack_files,
)
from ortpack.kernel.contracts.image_embedding import CONTRACT, OUTPUT
from ortpack.kernel.engine import as_items
from ortpack.kernel.gates import cosine_rows, embedding_metrics, gate, neighbour_overlap
from ortpack.kernel.images import ImageDecoder
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec


PROBE_IMAGES = 16
PROBE_MAX_BYTES = 600_000

GATES = CONTRACT.gates
# fp32 differs from PyTorch by the preprocessing's rounding (one uint8 level: image_common.py);
# int8 must keep 95 % of PyTorch's own retrieval
THRESHOLDS = {
    "fp32": ParityThresholds.of(
        GATES, min_cosine=0.999, mean_cosine=0.9999, min_neighbour_agreement=0.95, min_retrieval_recall_ratio=0.99
    ),
    "fp16": ParityThresholds.of(
        GATES, min_cosine=0.995, mean_cosine=0.999, min_neighbour_agreement=0.9, min_retrieval_recall_ratio=0.98
    ),
    "int8": ParityThresholds.of(
        GATES, min_cosine=0.98, mean_cosine=0.99, min_neighbour_agreement=0.8, min_retrieval_recall_ratio=0.95
    ),
}


def resolve_source(value: str) -> tuple[str, str]:
    if hf_vision_type(value) is not None:  # a Hugging Face vision checkpoint directory
        path = Path(value).expanduser().resolve()
        return str(path), path.name
    source = parse_image_source(value)
    return source.value, source.default_name


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.image_embedding import export_image_embedder

    return export_image_embedder(spec, out_dir)


def _run(session: Any, images: list[np.ndarray]) -> np.ndarray:
    return np.asarray(session.run(None, {"images": np.stack(images)})[0], dtype=np.float32)


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """Vectors at batch 1 (every raw image) and 8 (same-size groups), of the encoded files through
    the server's decoder, and the retrieval check; distance, cosine and neighbours are gated on
    the worst of the three scopes."""
    images = raw_images(ref)
    single = np.concatenate([_run(session, [im]) for im in images])
    scopes = {"b1": embedding_metrics(ref["outputs"], single)}
    grouped = [i for i in range(0, len(images) - 7, 8) if len({im.shape for im in images[i : i + 8]}) == 1]
    if grouped:
        index = np.concatenate([np.arange(i, i + 8) for i in grouped])
        batched = np.concatenate([_run(session, images[i : i + 8]) for i in grouped])
        scopes["b8"] = embedding_metrics(ref["outputs"][index], batched)
        batch_diff = float(np.abs(batched - single[index]).max())
    decoder = ImageDecoder(max_pixels=1 << 40)
    files = ref.served_files()
    served = np.concatenate([_run(session, [decoder.decode(f, "validation file")]) for f in files])
    scopes["served.exact"] = embedding_metrics(ref["served_outputs"], served)
    copies = unpack_files(ref["retrieval_offsets"], ref["retrieval_data"])
    queries = np.concatenate([_run(session, [decoder.decode(c, "retrieval copy")]) for c in copies])
    values: dict[str, float] = {"served.images": float(len(files))}
    for scope, numbers in scopes.items():
        values.update({f"{scope}.{k}": v for k, v in numbers.items()})
    for metric, pick in (
        ("max_abs_diff", max),
        ("mean_abs_diff", max),
        ("min_cosine", min),
        ("mean_cosine", min),
        ("neighbour_agreement", min),
    ):
        values[metric] = pick(scopes[s][metric] for s in scopes)
    if grouped:
        values["batch_max_abs_diff"] = batch_diff
    for k in RECALL_AT:
        mine = retrieval_recall(queries, served, ref["retrieval_targets"], k)
        theirs = float(ref[f"retrieval_recall_at_{k}"])
        values[f"retrieval.recall_at_{k}"] = mine
        values[f"retrieval.reference_recall_at_{k}"] = theirs
        values[f"retrieval.ratio_at_{k}"] = mine / theirs if theirs else 1.0
    values["retrieval.copies"] = float(len(copies))
    values["retrieval_recall_ratio"] = values[f"retrieval.ratio_at_{RECALL_AT[0]}"]
    nonfinite = int((~np.isfinite(single)).any(axis=1).sum() + (~np.isfinite(served)).any(axis=1).sum())
    values["nonfinite_rows"] = float(nonfinite)
    cos = cosine_rows(served, ref["served_outputs"])
    return Comparison(
        values=values,
        per_item={
            "cosine_gap": [float(1 - c) for c in cos],
            "neighbours": [float(x) for x in neighbour_overlap(ref["served_outputs"], served, 10)],
        },
        samples=len(images) + len(files) + len(copies),
        misses=[f"{nonfinite} vectors contain NaN or inf"] if nonfinite else [],
    )


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    from ortpack.components.core.exporters.image_common import BENCH_SHAPES

    return {
        key: (n, {"images": np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)])})
        for key, (n, h, w) in BENCH_SHAPES.items()
    }


def quantize_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> dict[str, Any]:
    """Static int8 of the convolutions on ONNX Runtime's int8 kernels, calibrated on the user's
    calibration photos (else generated images), judged by the int8 gate, the most sensitive layers
    returned to float until it passes (components/core/quantization/static_int8.py; else the best retrieval is
    kept). A pinned `recipe` is built alone."""
    images = calibration_images(export_dir)
    ref = Reference.load(export_dir / export.reference_file)

    def judge(candidate: Path) -> tuple[dict[str, float], list[str]]:
        values = compare(session(candidate), ref, export_dir).values
        quality = {k: values[k] for k in ("min_cosine", "mean_cosine", "retrieval_recall_ratio")}
        return quality, gate(values, THRESHOLDS["int8"].as_dict(), GATES)

    result = family_int8(src, dst, images, recipe, judge, lambda q: (q["retrieval_recall_ratio"], q["mean_cosine"]))
    result.pop("passed", None)
    return result


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """Up to PROBE_IMAGES small encoded validation files, spread over the set, with PyTorch's vectors."""
    ref = Reference.load(export_dir / export.reference_file)
    files = ref.served_files()
    small = [i for i, f in enumerate(files) if len(f) <= PROBE_MAX_BYTES] or list(range(len(files)))
    picked = small[:: max(1, len(small) // PROBE_IMAGES)][:PROBE_IMAGES]
    return Probe(
        task=export.task,
        kind="files",
        inputs=[files[i] for i in picked],
        outputs=as_items(OUTPUT, ref["served_outputs"][picked]),
    )


def retrieval_set() -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """The generated encoded validation images (documents) and their retrieval copies (queries):
    what `ortpack bundle diff` and the pipeline's baseline check search with by default."""
    documents = [encode_validation_image(spec) for spec in encoded_validation_images()]
    queries, _ = retrieval_copies(documents)
    return tuple(queries), tuple(documents)


def _cosine_gate(thresholds: dict[str, float]) -> float | None:
    limit = thresholds.get("min_cosine")
    return None if limit is None else 1 - limit


FAMILY = TaskFamily(
    name="image-embedding",
    description="image embeddings: pooled features with resize, crop, normalisation and L2 norm in the graph",
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=quantize_int8,
    int8_recipes=tuple(STATIC_INT8_RECIPES),
    select_probe=select_probe,
    retrieval_set=retrieval_set,
    report=ReportSpec(
        columns=(
            ("min cos", "min_cosine", ".5f"),
            ("mean cos", "mean_cosine", ".5f"),
            ("neighbours", "neighbour_agreement", ".3f"),
            ("recall ratio", "retrieval_recall_ratio", ".3f"),
        ),
        distance=("cosine_gap", "1 - cosine to PyTorch's vector, per served file", _cosine_gate),
        agreement=(
            "neighbours",
            10,
            "share of files by how many of their 10 nearest files (PyTorch) the variant keeps",
        ),
        unit="images",
    ),
)
