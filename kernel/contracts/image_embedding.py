"""The image-embedding contract: raw images in (the preprocessing of kernel/contracts/images.py,
shared with the image classifier), one vector per image out, pooled (and optionally L2
normalised) in the graph, in an embedding space an index can rely on; gated on vector distance,
cosine, neighbour agreement and a retrieval check."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from ortpack.kernel.contracts.base import SpaceDeclaration, TaskContract, TaskSettings, fixed
from ortpack.kernel.contracts.images import IMAGES, ImageModelOptions, ImagePreprocessing
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import ceiling, floor, gate_table

OUTPUT = "image_embedding"
SIGNATURE = Signature(inputs=(IMAGES,), outputs=(Tensor(OUTPUT, "float32", (BATCH, "dim")),))


class ImageEmbeddingOptions(ImageModelOptions):
    """An image embedder's export options: an image model's (weights, preprocessing, photos),
    `head`: "drop" replaces the network's last linear layer (a classifier's head) by the identity,
    so its pooled features leave the graph, "keep" takes its output as it is (default: drop for
    torchvision's and timm's classifiers, keep for your own module or a .pt2), and `normalize`:
    L2-normalise the vectors in the graph (default true)."""

    head: Literal["drop", "keep"] | None = None
    normalize: bool = True


class ImageEmbeddingSettings(TaskSettings):
    task: Literal["image-embedding"] = "image-embedding"
    preprocessing: ImagePreprocessing
    # "features": the network's pooled features (its head dropped), "output": its own output;
    # a Hugging Face encoder's as its model card says: "cls" (the CLS token), "mean" (ConvNeXt's
    # pooled last stage), "projection" (CLIP's image_embeds), "attention" (SigLIP's pooling head)
    pooling: Literal["features", "output", "cls", "mean", "projection", "attention"]
    normalize: bool


def preprocessing_digest(preprocessing: ImagePreprocessing) -> str:
    """What decides the pixels the network sees (not how JPEGs are decoded: the gate validates that
    per variant): sha256 of the canonical JSON of the resize, crop, interpolation and normalisation."""
    facts = preprocessing.model_dump(mode="json", exclude={"decode", "decode_min_side"})
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def space_facts(settings: ImageEmbeddingSettings, files: Mapping[str, Any]) -> dict[str, Any]:
    """What decides an image's vector beyond the model: the preprocessing, the pooling, the
    normalisation."""
    return {
        "preprocessing_sha256": preprocessing_digest(settings.preprocessing),
        "pooling": settings.pooling,
        "normalize": settings.normalize,
    }


CONTRACT = TaskContract(
    name="image-embedding",
    options=ImageEmbeddingOptions,
    settings=ImageEmbeddingSettings,
    signature=fixed(SIGNATURE),
    space=SpaceDeclaration(output=OUTPUT, facts=space_facts),
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("min_cosine", "min_cosine"),
        floor("mean_cosine", "mean_cosine"),
        floor("neighbour_agreement"),
        floor("retrieval_recall_ratio"),
    ),
    engine="ortpack.kernel.engines.image_embedding",
    plugin="ortpack.serving.tasks.image_embedding",
)
