"""The image-classification engine: decoded images in, `probabilities` per class out (resizing,
cropping, normalising and softmax are in the graph). Probes compare probabilities and top-k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortpack.kernel.contracts.image_classification import OUTPUT
from ortpack.kernel.engine import EngineSpec, Item, stack
from ortpack.kernel.engines.images import ImageEngine
from ortpack.kernel.gates import probability_metrics


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    return probability_metrics(stack(reference, OUTPUT), stack(candidate, OUTPUT))


ENGINE = EngineSpec(name="image-classification", open=ImageEngine, probe_metrics=probe_metrics)
