"""The retrieval check of image embeddings: copies of each encoded file that a photo search should
still find (`retrieval_copies`), and the share of copies that find their file (`retrieval_recall`).
The export step measures PyTorch on them, the gate each variant, `bundle diff` two bundles.
Pillow and numpy only: the torch-free steps import it."""

from __future__ import annotations

import io

import numpy as np

RECALL_AT = (1, 10)
# A centre crop of 85 % of each side re-encoded as JPEG quality 80, and the whole image at half its
# size as JPEG quality 90
CROP, HALF = 0.85, 0.5


def retrieval_copies(files: list[bytes]) -> tuple[list[bytes], list[int]]:
    """Two copies of each encoded file (`CROP`, `HALF`) and, per copy, the index of its file."""
    from PIL import Image, ImageOps

    copies, targets = [], []
    for index, data in enumerate(files):
        with Image.open(io.BytesIO(data)) as opened:
            image = ImageOps.exif_transpose(opened).convert("RGB")
        w, h = image.size
        cw, ch = max(1, round(w * CROP)), max(1, round(h * CROP))
        left, top = (w - cw) // 2, (h - ch) // 2
        variants = (
            (image.crop((left, top, left + cw, top + ch)), 80),
            (image.resize((max(1, round(w * HALF)), max(1, round(h * HALF))), Image.Resampling.BILINEAR), 90),
        )
        for copy, quality in variants:
            buffer = io.BytesIO()
            copy.save(buffer, "JPEG", quality=quality)
            copies.append(buffer.getvalue())
            targets.append(index)
    return copies, targets


def retrieval_recall(queries: np.ndarray, documents: np.ndarray, targets: list[int] | np.ndarray, k: int) -> float:
    """The share of queries whose own document is among their `k` nearest documents (cosine)."""
    q = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    d = documents / np.maximum(np.linalg.norm(documents, axis=1, keepdims=True), 1e-12)
    nearest = np.argsort(-(q @ d.T), axis=1, kind="stable")[:, :k]
    return float(np.mean([int(t) in row for t, row in zip(targets, nearest, strict=True)]))
