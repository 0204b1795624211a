"""Step 3: the parity gate. Compare a variant with the PyTorch reference outputs.

Read-only and thorough: input/output names, dtypes and dynamic axes first, then values at batch
size 1 (unpadded) and at a padded batch (a frozen batch axis or a padding bug shows up there),
on the shipped validation set. Every miss is collected, the numbers are kept, and only then does
the caller decide (`ParityReport.raise_if_failed`). Needs only ONNX Runtime and numpy.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import ParityReport
from components.core.specs import ParityThresholds
from serving.runtime import SessionPlan, create_session

log = logging.getLogger("ortpack.validate")

PADDED_BATCH = 32
NEIGHBOURS = 10
# metric -> (comparison, threshold field): how each gated metric is compared with its threshold
GATES = {
    "max_abs_diff": ("<=", "max_abs_diff"),
    "mean_abs_diff": ("<=", "mean_abs_diff"),
    "min_cosine": (">=", "min_cosine"),
    "mean_cosine": (">=", "mean_cosine"),
    "neighbour_agreement": (">=", "min_neighbour_agreement"),
    "top1_agreement": (">=", "min_top1_agreement"),
    "top5_agreement": (">=", "min_top5_agreement"),
    "max_pixel_diff": ("<=", "max_pixel_diff"),
}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(axis=1)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return num / np.maximum(den, 1e-12)


def nearest_neighbours(emb: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's `k` most cosine-similar other rows (ties broken by index)."""
    x = emb.astype(np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def neighbour_overlap(reference: np.ndarray, candidate: np.ndarray, k: int = NEIGHBOURS) -> np.ndarray:
    """Per row: the share of its k nearest neighbours (PyTorch) that the candidate keeps."""
    k = min(k, len(reference) - 1)
    ref_nn, cand_nn = nearest_neighbours(reference, k), nearest_neighbours(candidate, k)
    return np.array([len(set(r) & set(c)) / k for r, c in zip(ref_nn, cand_nn, strict=True)])


def _check_text_signature(session: Any, input_names: list[str]) -> list[str]:
    misses = []
    got = {i.name: i for i in session.get_inputs()}
    if set(got) != set(input_names):
        misses.append(f"inputs are {sorted(got)}, expected {sorted(input_names)}")
    for name in input_names:
        spec = got.get(name)
        if spec is None:
            continue
        if spec.type != "tensor(int64)":
            misses.append(f"input {name} is {spec.type}, expected tensor(int64)")
        if len(spec.shape) != 2 or any(isinstance(d, int) for d in spec.shape):
            misses.append(f"input {name} has shape {spec.shape}, expected two dynamic axes")
    outputs = session.get_outputs()
    if len(outputs) != 1 or outputs[0].name != "sentence_embedding":
        misses.append(f"outputs are {[o.name for o in outputs]}, expected ['sentence_embedding']")
    elif outputs[0].type != "tensor(float)" or isinstance(outputs[0].shape[0], int):
        misses.append(
            f"output sentence_embedding is {outputs[0].type} {outputs[0].shape}, expected float32 [batch, dim]"
        )
    return misses


def _run_text(session: Any, ref: Any, input_names: list[str], batch: int) -> np.ndarray:
    """Embed every sentence, `batch` at a time in file order, padded to each batch's longest."""
    lengths = ref["lengths"]
    rows = []
    for start in range(0, len(lengths), batch):
        end = min(start + batch, len(lengths))
        width = int(lengths[start:end].max())
        feeds = {name: np.ascontiguousarray(ref[name][start:end, :width]) for name in input_names}
        rows.append(session.run(None, feeds)[0])
    return np.concatenate(rows).astype(np.float32)


def _text_values(
    ref_out: np.ndarray, outputs: dict[int, np.ndarray], dedupe: np.ndarray
) -> tuple[dict[str, float], dict[str, list[float]]]:
    values: dict[str, float] = {}
    worst_cos = np.ones(len(ref_out))
    for batch, out in outputs.items():
        diff = np.abs(out.astype(np.float64) - ref_out)
        cos = cosine_rows(out, ref_out)
        worst_cos = np.minimum(worst_cos, cos)
        values.update(
            {
                f"b{batch}.max_abs_diff": float(diff.max()),
                f"b{batch}.mean_abs_diff": float(diff.mean()),
                f"b{batch}.min_cosine": float(cos.min()),
                f"b{batch}.mean_cosine": float(cos.mean()),
            }
        )
    batches = sorted(outputs)
    for metric, pick in (("max_abs_diff", max), ("mean_abs_diff", max), ("min_cosine", min), ("mean_cosine", min)):
        values[metric] = pick(values[f"b{b}.{metric}"] for b in batches)
    # Identical token sequences ("", " ", "\t" all tokenize alike) are counted once: their
    # embeddings tie exactly, and a tie broken differently is not a real disagreement.
    overlaps = {b: neighbour_overlap(ref_out[dedupe], outputs[b][dedupe]) for b in batches}
    for b in batches:
        values[f"b{b}.neighbour_agreement"] = float(overlaps[b].mean())
    values["neighbour_agreement"] = min(values[f"b{b}.neighbour_agreement"] for b in batches)
    values["batch_max_abs_diff"] = float(np.abs(outputs[batches[0]] - outputs[batches[-1]]).max())
    # per sentence: the worst cosine over both batch sizes, and the overlaps of the batch size
    # whose mean is the gated neighbour_agreement (so the plotted mean is the gated number)
    worst_batch = min(batches, key=lambda b: values[f"b{b}.neighbour_agreement"])
    per_item = {
        "cosine": [round(float(c), 7) for c in worst_cos],
        "neighbour_overlap": [float(o) for o in overlaps[worst_batch]],
    }
    return values, per_item


def _image_signature(session: Any) -> list[str]:
    misses = []
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or inputs[0].name != "images" or inputs[0].type != "tensor(uint8)":
        misses.append(f"inputs are {[(i.name, i.type) for i in inputs]}, expected images uint8")
    elif len(inputs[0].shape) != 4 or inputs[0].shape[3] != 3 or any(isinstance(d, int) for d in inputs[0].shape[:3]):
        misses.append(f"input images has shape {inputs[0].shape}, expected [batch, height, width, 3]")
    if len(outputs) != 1 or outputs[0].name != "probabilities" or outputs[0].type != "tensor(float)":
        misses.append(f"outputs are {[(o.name, o.type) for o in outputs]}, expected probabilities float32")
    return misses


def _topk_overlap(ref: np.ndarray, out: np.ndarray, k: int) -> np.ndarray:
    a, b = np.argsort(-ref, axis=1)[:, :k], np.argsort(-out, axis=1)[:, :k]
    return np.array([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)])


def _check_images(
    session: Any,
    ref: Any,
    thresholds: ParityThresholds,
    variant_id: str,
    validated_on: str,
    preprocess_path: Path | None,
) -> ParityReport:
    """Probabilities at batch 1 (every image) and 8 (same-size groups); top-1/top-5 agreement;
    pixel agreement of the preprocessing with torchvision's, in uint8 levels."""
    from components.core.validation_data import ImageSpec, render_image

    misses = _image_signature(session)
    if misses:
        return ParityReport(
            variant_id=variant_id,
            task="image-classification",
            thresholds=thresholds.as_dict(),
            values={},
            misses=misses,
            validated_on=validated_on,
            samples=0,
        )
    specs = [
        ImageSpec(int(h), int(w), str(k), int(s))
        for h, w, k, s in zip(ref["heights"], ref["widths"], ref["kinds"], ref["seeds"], strict=True)
    ]
    images = [render_image(spec) for spec in specs]
    expected = ref["outputs"].astype(np.float64)
    log.info("validate %s: %d images at batch 1 and 8 on %s", variant_id, len(images), validated_on)
    single = np.concatenate([session.run(None, {"images": im[None]})[0] for im in images])
    # the set starts with groups of 8 same-size images (validation_images): those run as batches
    grouped = [i for i in range(0, len(specs) - 7, 8) if len({(s.height, s.width) for s in specs[i : i + 8]}) == 1]
    batched_rows = {}
    for start in grouped:
        out = session.run(None, {"images": np.stack(images[start : start + 8])})[0]
        for row in range(8):
            batched_rows[start + row] = out[row]
    idx8 = sorted(batched_rows)
    outputs = {1: (np.arange(len(specs)), single), 8: (np.array(idx8), np.stack([batched_rows[i] for i in idx8]))}
    values: dict[str, float] = {}
    for batch, (idx, out) in outputs.items():
        diff = np.abs(out.astype(np.float64) - expected[idx])
        values[f"b{batch}.max_abs_diff"] = float(diff.max())
        values[f"b{batch}.mean_abs_diff"] = float(diff.mean())
        values[f"b{batch}.top1_agreement"] = float(np.mean(out.argmax(1) == expected[idx].argmax(1)))
        values[f"b{batch}.top5_agreement"] = float(_topk_overlap(expected[idx], out, 5).mean())
    for metric, pick in (
        ("max_abs_diff", max),
        ("mean_abs_diff", max),
        ("top1_agreement", min),
        ("top5_agreement", min),
    ):
        values[metric] = pick(values[f"b{b}.{metric}"] for b in outputs)
    values["batch_max_abs_diff"] = float(np.abs(outputs[8][1] - single[outputs[8][0]]).max())
    nonfinite = int((~np.isfinite(single)).any(axis=1).sum())
    values["nonfinite_rows"] = float(nonfinite)
    if preprocess_path is not None and preprocess_path.is_file():
        from serving.runtime import SessionPlan, create_session

        pre = create_session(
            preprocess_path,
            SessionPlan(providers=["CPUExecutionProvider"], online_optimization=True, reason="preprocessing check"),
        )
        meta = json.loads(Path(preprocess_path).with_name("export.json").read_text())["preprocessing"]
        mean = np.array(meta["mean"]).reshape(3, 1, 1) * 255.0
        std = np.array(meta["std"]).reshape(3, 1, 1) * 255.0
        # the graph's float result rounded to a uint8 level, as torchvision's uint8 kernel outputs
        levels = [np.rint(pre.run(None, {"images": im[None]})[0][0] * std + mean) for im in images]
        pixel_diff = np.stack(
            [np.abs(lv - px.astype(np.float64)) for lv, px in zip(levels, ref["pixels"], strict=True)]
        )
        values["max_pixel_diff"] = float(pixel_diff.max())
        values["mean_pixel_diff"] = float(pixel_diff.mean())
    misses = gate(values, thresholds)
    if nonfinite:
        misses.insert(0, f"{nonfinite} outputs contain NaN or inf")
    report = ParityReport(
        variant_id=variant_id,
        task="image-classification",
        thresholds=thresholds.as_dict(),
        values=values,
        misses=misses,
        validated_on=validated_on,
        samples=len(specs),
        per_item={
            "prob_diff": [float(d) for d in np.abs(single - expected).max(axis=1)],
            "top5_overlap": [float(o) for o in _topk_overlap(expected, single, 5)],
        },
    )
    log.info(
        "validate %s: %s (max_abs_diff %.3g, top1 %.3f, top5 %.3f, pixels %.3g)",
        variant_id,
        "PASS" if report.passed else "MISS",
        values["max_abs_diff"],
        values["top1_agreement"],
        values["top5_agreement"],
        values.get("max_pixel_diff", float("nan")),
    )
    return report


def gate(values: dict[str, float], thresholds: ParityThresholds) -> list[str]:
    """Every threshold the values miss, as `metric value vs threshold` lines."""
    misses = []
    for metric, (op, field) in GATES.items():
        limit = getattr(thresholds, field)
        if limit is None or metric not in values:
            continue
        value = values[metric]
        ok = value <= limit if op == "<=" else value >= limit
        if not ok or np.isnan(value):
            shown = f"{value:.6g}"
            if shown == f"{limit:g}":  # rounding hides the gap: show enough digits to see it
                shown = repr(float(value))
            misses.append(f"{metric} {shown} (needs {op} {limit:g})")
    return misses


def check_parity(
    model_path: Path,
    reference_path: Path,
    thresholds: ParityThresholds,
    *,
    variant_id: str,
    plan: SessionPlan | None = None,
    preprocess_path: Path | None = None,
) -> ParityReport:
    """Compare the variant at `model_path` with the PyTorch reference; return every number.

    Never raises on a miss: call `raise_if_failed()` on the report after logging it.
    """
    ref = np.load(reference_path, allow_pickle=False)
    task = str(ref["task"])
    input_names = [str(n) for n in ref["input_names"]]
    try:
        plan = plan or SessionPlan(
            providers=["CPUExecutionProvider"], online_optimization=True, reason="no build record"
        )
        session = create_session(Path(model_path), plan)
    except Exception as exc:  # noqa: BLE001 - a graph ORT cannot load is a miss, not a crash
        return ParityReport(
            variant_id=variant_id,
            task=task,
            thresholds=thresholds.as_dict(),
            values={},
            misses=[f"ONNX Runtime cannot load the model: {' '.join(str(exc).split())[:300]}"],
            validated_on="none",
            samples=0,
        )
    validated_on = session.get_providers()[0]
    if task == "image-classification":
        return _check_images(session, ref, thresholds, variant_id, validated_on, preprocess_path)
    misses = _check_text_signature(session, input_names)
    if misses:
        return ParityReport(
            variant_id=variant_id,
            task=task,
            thresholds=thresholds.as_dict(),
            values={},
            misses=misses,
            validated_on=validated_on,
            samples=0,
        )
    ref_out = ref["outputs"].astype(np.float64)
    log.info("validate %s: %d sentences at batch 1 and %d on %s", variant_id, len(ref_out), PADDED_BATCH, validated_on)
    outputs = {b: _run_text(session, ref, input_names, b) for b in (1, PADDED_BATCH)}
    nonfinite = sum(int((~np.isfinite(o)).any(axis=1).sum()) for o in outputs.values())
    _, first_index = np.unique(ref["input_ids"], axis=0, return_index=True)
    values, per_item = _text_values(
        ref_out,
        {b: np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) for b, o in outputs.items()},
        np.sort(first_index),
    )
    values["nonfinite_rows"] = float(nonfinite)
    misses = gate(values, thresholds)
    if nonfinite:
        misses.insert(0, f"{nonfinite} outputs contain NaN or inf")
    report = ParityReport(
        variant_id=variant_id,
        task=task,
        thresholds=thresholds.as_dict(),
        values=values,
        misses=misses,
        validated_on=validated_on,
        samples=len(ref_out),
        per_item=per_item,
    )
    log.info(
        "validate %s: %s (max_abs_diff %.3g, min_cosine %.6f, neighbour_agreement %.4f)",
        variant_id,
        "PASS" if report.passed else "MISS",
        values["max_abs_diff"],
        values["min_cosine"],
        values["neighbour_agreement"],
    )
    return report


def validate_variant(
    variant_dir: Path, export_dir: Path, thresholds: ParityThresholds, *, out_dir: Path | None = None
) -> ParityReport:
    """Check the variant built by `optimize_model` in `variant_dir`; save `parity.json` in
    `out_dir` (default: `variant_dir`)."""
    from components.core.artifacts import ExportResult, OptimizeResult
    from serving.runtime import plan_for

    built = OptimizeResult.load(variant_dir)
    export = ExportResult.load(export_dir)
    plan = plan_for(built)
    report = check_parity(
        Path(variant_dir) / built.model_file,
        Path(export_dir) / export.reference_file,
        thresholds,
        variant_id=built.variant_id,
        plan=plan,
        preprocess_path=Path(export_dir) / "preprocess.onnx" if export.task == "image-classification" else None,
    )
    report.save(Path(out_dir) if out_dir else variant_dir)
    return report
