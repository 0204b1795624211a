"""The semantic-segmentation engine: decoded images in (the graph resizes, normalises, runs the
network, resizes the logits back to the image and takes the per-pixel argmax), each image's
`label_map` out (uint8 `[height, width]`, the image's own size).

Maps are compared pixel by pixel (`segmentation_metrics`), by the gate and every node's probe check
alike: the share of pixels with PyTorch's class (over all pixels, and the worst image's), the mean
IoU over the classes either side finds, and, where the reference says which pixels PyTorch
classifies decisively (its top class leads the runner-up by `DECISIVE_MARGIN` in probability),
the share of those that agree. A pixel on a boundary between two classes flips with the smallest
change of its logits; a decisive one must not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ortpack.kernel.contracts.semantic_segmentation import OUTPUT, SemanticSegmentationSettings
from ortpack.kernel.engine import EngineContext, EngineSpec, Item, as_items
from ortpack.kernel.engines.images import ImageEngine

DECISIVE = "decisive"  # a reference's per-pixel mask of the pixels PyTorch classifies decisively
# What the graph may hold for one image's logits resized back to it (float32, one per class and
# pixel): a larger image is refused from its header, before it is decoded (413 when served).
# 1 GiB: 12.8 MP at 21 classes, 1.8 MP at ADE20K's 150 (and never above the server's own limit).
MAP_BUDGET = 1 << 30


def max_map_pixels(classes: int, limit: int) -> int:
    """The largest image (in pixels) whose resized logits fit `MAP_BUDGET`, at most `limit`."""
    return max(1024, min(limit, MAP_BUDGET // (4 * max(classes, 1))))


class SegmentationEngine(ImageEngine):
    """An image engine whose one output per image is its class map; warm-up starts at the size
    the network sees."""

    def __init__(self, ctx: EngineContext) -> None:
        settings = ctx.settings
        if not isinstance(settings, SemanticSegmentationSettings):
            raise ValueError(f"not a semantic-segmentation bundle: {settings.task}")
        limit = max_map_pixels(len(settings.labels), ctx.options.max_image_pixels)
        super().__init__(dataclasses.replace(ctx, options=dataclasses.replace(ctx.options, max_image_pixels=limit)))
        self.max_image_pixels = limit
        self.crop = settings.preprocessing.size

    def run(self, payloads: Sequence[np.ndarray]) -> list[Item]:
        return as_items(OUTPUT, self.session.run(None, self.feeds(payloads))[0])


def segmentation_metrics(reference: Sequence[Item], candidate: Sequence[Item]) -> dict[str, float]:
    """How the candidate's maps agree with the reference's, over every image (maps compared as
    flat pixels: a probe stores them so):

    - `pixel_agreement`: the share of all pixels with the reference's class; `min_image_agreement`:
      the worst image's share;
    - `mean_iou`: per class, intersection over union of its pixels summed over the images, averaged
      over the classes present in either map (1.0 when both are empty);
    - `decisive_pixel_agreement`: the share of the reference's decisive pixels (its `decisive`
      mask, when it has one) that agree;
    - `classes_present`: how many classes the reference's maps hold (a map of one class proves
      little), `pixels`, `images`.
    """
    agree = total = decisive_agree = decisive_total = 0
    worst = 1.0
    intersection: dict[int, int] = {}
    union: dict[int, int] = {}
    present: set[int] = set()
    for ref, cand in zip(reference, candidate, strict=True):
        a = np.asarray(ref[OUTPUT]).reshape(-1)
        b = np.asarray(cand[OUTPUT]).reshape(-1)
        if a.shape != b.shape:
            raise ValueError(f"a map of {b.size} pixels against a reference of {a.size}")
        same = a == b
        agree += int(same.sum())
        total += a.size
        worst = min(worst, float(same.mean()) if a.size else 1.0)
        if DECISIVE in ref:
            mask = np.asarray(ref[DECISIVE]).reshape(-1).astype(bool)
            decisive_agree += int(same[mask].sum())
            decisive_total += int(mask.sum())
        ref_counts = np.bincount(a, minlength=256)
        cand_counts = np.bincount(b, minlength=256)
        both = np.bincount(a[same], minlength=256)
        present.update(int(c) for c in np.flatnonzero(ref_counts))
        for found in np.flatnonzero(ref_counts + cand_counts):
            c = int(found)
            intersection[c] = intersection.get(c, 0) + int(both[c])
            union[c] = union.get(c, 0) + int(ref_counts[c] + cand_counts[c] - both[c])
    ious = [intersection[c] / union[c] for c in union if union[c]]
    values = {
        "pixel_agreement": agree / total if total else 1.0,
        "min_image_agreement": worst,
        "mean_iou": float(np.mean(ious)) if ious else 1.0,
        "classes_present": float(len(present)),
        "pixels": float(total),
        "images": float(len(reference)),
    }
    if decisive_total:
        values["decisive_pixel_agreement"] = decisive_agree / decisive_total
        values["decisive_pixels"] = float(decisive_total)
    return values


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    return segmentation_metrics(reference, candidate)


ENGINE = EngineSpec(name="semantic-segmentation", open=SegmentationEngine, probe_metrics=probe_metrics)
