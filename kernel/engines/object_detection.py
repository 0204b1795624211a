"""The object-detection engine: decoded images in (the graph letterboxes or resizes them, decodes
boxes and runs non-maximum suppression), each image's detections out, best first: `boxes`
`[k, 4]` (x0, y0, x1, y1 in the image's own pixels), `scores` `[k]`, `labels` `[k]`, split from
the graph's flat outputs by their `batch_index`.

Detections are compared by matching (`match`): within one image, a candidate detection matches
the unmatched reference detection of its label that it overlaps most, at IoU 0.5 or more, best
scores first. The gate and every node's probe check read the same numbers (`detection_metrics`):
matched recall and precision, over all detections and over the decisive ones (well above the
score threshold), the smallest IoU of a matched pair, the largest corner difference of matched
boxes in pixels, the largest score difference, and the largest difference in an image's count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ortpack.kernel.contracts.object_detection import BATCH_INDEX, BOXES, LABELS, SCORES, ObjectDetectionSettings
from ortpack.kernel.engine import EngineContext, EngineSpec, Item
from ortpack.kernel.engines.images import ImageEngine

MATCH_IOU = 0.5
HALF_PIXEL = 0.5
# how far above the score threshold a detection is decisive (int8 moved scores by up to 0.13 on the
# trained YOLOv8s: docs/object-detection.md)
DECISIVE_MARGIN = 0.1


class DetectionEngine(ImageEngine):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        settings = ctx.settings
        if not isinstance(settings, ObjectDetectionSettings):
            raise ValueError(f"not an object-detection bundle: {settings.task}")
        # the graph's own limit (a graph exported for batch 1: 1) and the server's (0: any)
        self.max_batch_size = min((n for n in (settings.max_batch, ctx.options.max_batch_images) if n), default=0)
        self.max_detections = settings.thresholds.max_detections
        size = settings.preprocessing.size
        self.crop = size  # warm-up's first shape: the model's own input size
        self._names: list[str] | None = None

    def run(self, payloads: Sequence[np.ndarray]) -> list[Item]:
        if self._names is None:
            self._names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(self._names, self.session.run(None, self.feeds(payloads)), strict=True))
        return split(out, len(payloads), self.max_detections)


def split(out: dict[str, np.ndarray], images: int, max_detections: int) -> list[Item]:
    """The graph's flat detections (with their `batch_index`) as one item per image, best first,
    at most `max_detections` each."""
    index = np.asarray(out[BATCH_INDEX]).reshape(-1)
    boxes = np.asarray(out[BOXES], dtype=np.float32).reshape(-1, 4)
    scores = np.asarray(out[SCORES], dtype=np.float32).reshape(-1)
    labels = np.asarray(out[LABELS]).astype(np.int64).reshape(-1)
    items: list[Item] = []
    for image in range(images):
        rows = np.flatnonzero(index == image)
        rows = rows[np.argsort(-scores[rows], kind="stable")][:max_detections]
        items.append(
            {
                BOXES: boxes[rows],
                SCORES: scores[rows],
                LABELS: labels[rows],
                BATCH_INDEX: np.full(len(rows), image, dtype=np.int64),
            }
        )
    return items


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes `a` [n, 4] and `b` [m, 4] (x0, y0, x1, y1), each side widened by half
    a pixel: boxes are compared as the pixels they touch, so a box clipped to a line at the image's
    edge (zero area: both models clip it alike) still matches itself."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    widen = np.array([-HALF_PIXEL, -HALF_PIXEL, HALF_PIXEL, HALF_PIXEL])
    a, b = np.asarray(a, dtype=np.float64) + widen, np.asarray(b, dtype=np.float64) + widen
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 2], b[None, :, 2])
    y1 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return np.asarray(inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9))


def match(reference: Item, candidate: Item, threshold: float = MATCH_IOU) -> list[tuple[int, int]]:
    """(reference row, candidate row) pairs: each candidate, best score first, takes the unmatched
    reference detection of its label it overlaps most, at IoU `threshold` or more."""
    ref_boxes = np.asarray(reference[BOXES], dtype=np.float64)
    cand_boxes = np.asarray(candidate[BOXES], dtype=np.float64)
    overlaps = iou(cand_boxes, ref_boxes)
    same = np.asarray(candidate[LABELS])[:, None] == np.asarray(reference[LABELS])[None, :]
    overlaps = np.where(same, overlaps, 0.0)
    taken: set[int] = set()
    pairs = []
    for c in np.argsort(-np.asarray(candidate[SCORES]), kind="stable"):
        best, best_iou = -1, threshold
        for r in np.argsort(-overlaps[c], kind="stable"):
            if overlaps[c, r] < best_iou:
                break
            if int(r) not in taken:
                best, best_iou = int(r), overlaps[c, r]
                break
        if best >= 0:
            taken.add(best)
            pairs.append((best, int(c)))
    return pairs


def detection_metrics(
    reference: Sequence[Item], candidate: Sequence[Item], score_threshold: float | None = None
) -> dict[str, float]:
    """How the candidate's detections agree with the reference's, over every image:

    - matched recall and precision (1.0 when there is nothing to match), their F1;
    - decisive recall and precision: the same over the detections scoring at least
      `DECISIVE_MARGIN` above the score threshold (the reference's for recall, the candidate's for
      precision). A detection near the threshold appears or not with the smallest change of its
      score; a decisive one must not. Without `score_threshold` (a probe, which does not know it)
      the lowest score either side reports stands for it: at or above the real one, so the
      decisive sets are no larger than the gate's;
    - the smallest IoU of a matched pair, the largest corner difference of matched boxes in
      pixels, the largest score difference of matched detections, the largest difference in an
      image's count, and the counts.
    """
    matched = total_ref = total_cand = 0
    box_diff = score_diff = count_diff = 0.0
    min_iou = 1.0
    if score_threshold is None:
        scores = [float(np.min(item[SCORES])) for item in (*reference, *candidate) if len(item[SCORES])]
        score_threshold = min(scores, default=0.0)
    decisive = score_threshold + DECISIVE_MARGIN
    decisive_ref = decisive_ref_found = decisive_cand = decisive_cand_found = 0
    for ref, cand in zip(reference, candidate, strict=True):
        pairs = match(ref, cand)
        matched += len(pairs)
        total_ref += len(ref[SCORES])
        total_cand += len(cand[SCORES])
        count_diff = max(count_diff, float(abs(len(ref[SCORES]) - len(cand[SCORES]))))
        ref_boxes, cand_boxes = np.asarray(ref[BOXES]), np.asarray(cand[BOXES])
        for r, c in pairs:
            box_diff = max(box_diff, float(np.abs(ref_boxes[r] - cand_boxes[c]).max()))
            score_diff = max(score_diff, float(abs(float(ref[SCORES][r]) - float(cand[SCORES][c]))))
            min_iou = min(min_iou, float(iou(ref_boxes[r : r + 1], cand_boxes[c : c + 1])[0, 0]))
        found_ref, found_cand = {r for r, _ in pairs}, {c for _, c in pairs}
        strong_ref = np.flatnonzero(np.asarray(ref[SCORES]) >= decisive)
        strong_cand = np.flatnonzero(np.asarray(cand[SCORES]) >= decisive)
        decisive_ref += len(strong_ref)
        decisive_ref_found += sum(int(r) in found_ref for r in strong_ref)
        decisive_cand += len(strong_cand)
        decisive_cand_found += sum(int(c) in found_cand for c in strong_cand)
    recall = matched / total_ref if total_ref else 1.0
    precision = matched / total_cand if total_cand else 1.0
    f1 = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
    return {
        "matched_recall": recall,
        "matched_precision": precision,
        "matched_f1": f1,
        "decisive_recall": decisive_ref_found / decisive_ref if decisive_ref else 1.0,
        "decisive_precision": decisive_cand_found / decisive_cand if decisive_cand else 1.0,
        "min_matched_iou": min_iou,
        "max_box_diff_px": box_diff,
        "max_score_diff": score_diff,
        "max_count_diff": count_diff,
        "detections": float(total_ref),
        "decisive_detections": float(decisive_ref),
        "images": float(len(reference)),
    }


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    return detection_metrics(reference, candidate)


ENGINE = EngineSpec(name="object-detection", open=DetectionEngine, probe_metrics=probe_metrics)
