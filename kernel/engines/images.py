"""What the engines of image tasks share: payloads are decoded RGB pixels (uint8 `[height, width,
3]`) in the decode mode the bundle's gate validated for the variant (ortpack.kernel.images); images
of one size share a batch and the graph resizes, crops and normalises; a payload costs its
pixels; probe files are decoded by the same decoder."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ortpack.kernel.engine import EngineContext, Item, as_items, declared_cost
from ortpack.kernel.images import choose_decoder

log = logging.getLogger("ortpack.engine")


class ImageEngine:
    """Decoded images of one size in (a batch of one goes in as a view of its image, not a
    stacked copy: a 1280x960 photo is 3.7 MB), the graph's one output per image out."""

    units = "pixels"
    padded = False
    max_batch_size = 0  # any (options.max_batch_images)
    cost_per_byte = 3.0  # a body byte's pixels before any request was seen: a JPEG holds ~0.3 bytes per pixel

    def __init__(self, ctx: EngineContext) -> None:
        preprocessing = getattr(ctx.settings, "preprocessing", None)
        if preprocessing is None:
            raise ValueError(f"not an image bundle: {ctx.settings.task}")
        options = ctx.options
        self.signature = ctx.signature
        self.session = ctx.session
        self.cost = declared_cost(ctx.signature.inputs[0])  # tokens (sequence), pixels (height x width)
        self.input = ctx.signature.inputs[0].name
        self.output = ctx.signature.outputs[0].name
        self.crop = int(getattr(preprocessing, "crop_size", 224))
        self.decoder, self.decode = choose_decoder(
            preprocessing, ctx.variant, options.decode, options.max_image_pixels, ctx.name, log.warning
        )
        self.max_batch_cost = float(options.max_batch_pixels or math.inf)
        self.max_batch_size = options.max_batch_images
        if options.max_batch_images == 1:
            self.batching = f"images decoded {self.decode}, one per model call"
        else:
            limit = f", at most {options.max_batch_pixels / 1e6:g} MP per batch" if options.max_batch_pixels else ""
            self.batching = f"images decoded {self.decode}, batched by size{limit}"

    def feeds(self, payloads: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        images = np.ascontiguousarray(payloads[0])[None] if len(payloads) == 1 else np.stack(payloads)
        return {self.input: images}

    def run(self, payloads: Sequence[np.ndarray]) -> list[Item]:
        return as_items(self.output, self.session.run(None, self.feeds(payloads))[0])

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        """The crop size, VGA both ways and 1080p at batch 1, and a batch of 8 VGA images."""

        def image(height: int, width: int) -> np.ndarray:
            return np.full((height, width, 3), 128, dtype=np.uint8)

        shapes = [(1, self.crop, self.crop), (1, 480, 640), (1, 640, 480), (1, 1080, 1920)]
        shapes.append((min(8, max_batch_size), 480, 640))
        batches = [[image(h, w)] * n for n, h, w in shapes]
        return sorted(batches, key=lambda batch: -len(batch) * batch[0].size)

    def probe_payloads(self, inputs: Sequence[Any]) -> list[Any]:
        return [self.decoder.decode(bytes(f), "probe image") for f in inputs]

    def on(self, session: Any) -> ImageEngine:
        other = copy.copy(self)
        other.session = session
        return other
