"""The image-embedding engine: decoded images in (the graph resizes, crops, normalises, pools and
normalises the vector), one `image_embedding` per image out. Probes compare vectors: distance,
cosine, neighbours (the retrieval check needs copies of the photos: the build's gate runs it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortpack.kernel.contracts.image_embedding import OUTPUT
from ortpack.kernel.engine import EngineSpec, Item, stack
from ortpack.kernel.engines.images import ImageEngine
from ortpack.kernel.gates import embedding_metrics


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    return embedding_metrics(stack(reference, OUTPUT), stack(candidate, OUTPUT))


ENGINE = EngineSpec(name="image-embedding", open=ImageEngine, probe_metrics=probe_metrics)
