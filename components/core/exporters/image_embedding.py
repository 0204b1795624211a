"""Export an image embedder: the image classifier's preprocessing (image_common.py), the network's
pooled features, and optionally L2 normalisation, in one graph.

Input: a Hugging Face vision checkpoint directory (hf_vision.py), a torchvision classifier builder
by name with its head dropped (its last linear layer
replaced by the identity: MobileNetV3's 1024 hidden features, ResNet-50's 2048 pooled ones,
EfficientNet's 1280), your own module (`PACKAGE.MODULE:FACTORY`) or a `torch.export` program
(`FILE.pt2`) whose output is the vector (or, with `head=drop`, a classifier whose head to drop),
weights as for image classification, and optionally your photos (`validation_images`,
`calibration_images`).

Output graph: `images` uint8 `[batch, height, width, 3]` to `image_embedding` float32 `[batch,
dim]`. The reference (reference.npz) holds PyTorch's vectors of the raw-pixel images (torchvision's
transforms), of the encoded files (Pillow's full decode), and of retrieval copies of those files
(cropped, rescaled, re-encoded: components/core/tasks/image_embedding.py) with PyTorch's own
Recall@k on them, which the gate compares each variant's with.

Decoding is exact only: reduced JPEG decoding is not measured for embeddings yet.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, InvalidSpecError, ModelLoadError
from ortpack.components.core.exporters.hf_vision import hf_preprocessing, hf_vision_type, load_hf_vision
from ortpack.components.core.exporters.image_common import (
    INPUT_NAME,
    MIN_OPSET,
    export_graphs,
    generated_validation_set,
    photo_validation_set,
    preprocessing_settings,
    preprocessing_spec,
    reference_decode,
    reference_transform,
    torch_latency,
)
from ortpack.components.core.exporters.image_models import load_image_network, parse_image_source
from ortpack.components.core.exporters.image_retrieval import RECALL_AT, retrieval_copies, retrieval_recall
from ortpack.components.core.exporters.timm_models import drop_timm_head
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.validation_data import (
    CALIBRATION_FILE,
    pack_files,
    read_image_files,
)
from ortpack.kernel.bundle import sha256_file
from ortpack.kernel.contracts.image_embedding import OUTPUT, SIGNATURE, ImageEmbeddingOptions
from ortpack.kernel.errors import one_line

log = logging.getLogger("ortpack.export")


class Embedder(nn.Module):
    """The network's output as one vector per image, L2-normalised when `normalize`."""

    def __init__(self, network: nn.Module, normalize: bool) -> None:
        super().__init__()
        self.network, self.normalize = network, normalize

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        vectors = self.network(pixels).flatten(1)
        return nn.functional.normalize(vectors, dim=1) if self.normalize else vectors


def drop_head(network: nn.Module, model: str) -> str:
    """Replace the network's last linear layer (a classifier's head) by the identity; returns its
    name. What reached that layer leaves the network instead: its pooled features."""
    linears = [name for name, m in network.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ModelLoadError(f"{model} has no linear layer to drop (head=drop); give head=keep if it returns vectors")
    path = linears[-1].split(".")
    parent = network.get_submodule(".".join(path[:-1])) if len(path) > 1 else network
    setattr(parent, path[-1], nn.Identity())
    return linears[-1]


@torch.inference_mode()
def embed_images(embedder: Embedder, pre: dict[str, Any], images: list[np.ndarray]) -> np.ndarray:
    """PyTorch's vectors for decoded images: torchvision's transforms, then the embedder, one
    image at a time (the images differ in size)."""
    transform = reference_transform(pre)
    mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
    rows = []
    for image in images:
        pixels = transform(torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1))[None].float() / 255.0
        rows.append(embedder((pixels - mean) / std)[0].numpy())
    return np.stack(rows).astype(np.float32)


def export_image_embedder(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` into `out_dir`; return what was written."""
    import onnx
    import torchvision

    opts = spec.options_as(ImageEmbeddingOptions)
    if spec.opset < MIN_OPSET:
        raise InvalidSpecError(f"image models export at opset {MIN_OPSET} or later, not {spec.opset}")
    photos = read_image_files(opts.validation_images, "validation images") if opts.validation_images else None
    calibration = read_image_files(opts.calibration_images, "calibration images") if opts.calibration_images else None
    model_type = hf_vision_type(spec.source)
    if model_type is not None:
        network, pre, pooling, record = _hf_encoder(spec.source, model_type, opts)
        dropped = None
    else:
        pre = preprocessing_spec(spec)
        source = parse_image_source(spec.source)
        network, record = load_image_network(source, opts.weights, pre["crop_size"])
        head = opts.head or ("drop" if source.kind in ("torchvision", "timm") else "keep")
        if head == "drop" and source.kind == "timm":
            dropped = drop_timm_head(network)
        else:
            dropped = drop_head(network, spec.source) if head == "drop" else None
        pooling, model_type = ("features" if head == "drop" else "output"), source.default_name
    embedder = Embedder(network, opts.normalize).eval()
    with torch.inference_mode():
        dim = int(embedder(torch.zeros(1, 3, pre["crop_size"], pre["crop_size"])).shape[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log.info(
        "export: %s to ONNX (opset %d), %d-d vectors%s",
        spec.source,
        spec.opset,
        dim,
        f", {dropped} dropped" if dropped else "",
    )
    try:
        export_graphs(pre, embedder, SIGNATURE.output(OUTPUT), {"dim": dim}, out_dir, spec.opset)
    except Exception as exc:  # noqa: BLE001 - any exporter failure: one line
        raise ExportError(f"cannot export {spec.source} to ONNX: {one_line(exc, 300)}") from None
    seconds = time.perf_counter() - t0

    validation = (
        photo_validation_set(photos, pre["crop_size"], str(opts.validation_images))
        if photos is not None
        else generated_validation_set()
    )
    outputs = embed_images(embedder, pre, validation.images)
    served = embed_images(embedder, pre, [reference_decode(f) for f in validation.files])
    copies, targets = retrieval_copies(validation.files)
    queries = embed_images(embedder, pre, [reference_decode(c) for c in copies])
    recall = {k: retrieval_recall(queries, served, targets, k) for k in RECALL_AT}
    if not (np.isfinite(outputs).all() and np.isfinite(served).all()):
        raise ExportError("the PyTorch model produces non-finite vectors on the validation images")
    log.info(
        "export: PyTorch retrieval on %d copies of %d files: %s",
        len(copies),
        len(validation.files),
        ", ".join(f"Recall@{k} {v:.3f}" for k, v in recall.items()),
    )
    offsets, data = pack_files(validation.files)
    copy_offsets, copy_data = pack_files(copies)
    arrays: dict[str, np.ndarray] = {
        "task": np.array(spec.task),
        **validation.raw,
        "outputs": outputs,
        "input_names": np.array([INPUT_NAME]),
        "served_names": np.array(validation.names),
        "served_offsets": offsets,
        "served_data": data,
        "served_outputs": served,
        "retrieval_offsets": copy_offsets,
        "retrieval_data": copy_data,
        "retrieval_targets": np.array(targets, dtype=np.int64),
        "retrieval_outputs": queries,
        **{f"retrieval_recall_at_{k}": np.array(v) for k, v in recall.items()},
    }
    Reference.write(out_dir / REFERENCE_FILE, arrays)
    if calibration is not None:
        calibration_offsets, calibration_data = pack_files([d for _, d in calibration])
        np.savez(out_dir / CALIBRATION_FILE, offsets=calibration_offsets, data=calibration_data)
    graph = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task=spec.task,
        name=spec.name,
        source=record,
        inputs=[t.spec() for t in SIGNATURE.inputs],
        outputs=[t.spec({"dim": dim}) for t in SIGNATURE.outputs],
        opset=spec.opset,
        model_info={"model_type": model_type, "dim": dim, "crop_size": pre["crop_size"], "pooling": pooling},
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": (out_dir / "model.onnx").stat().st_size / 1e6,
            "seconds": seconds,
            "validation_samples": float(len(validation.images)),
            "validation_files": float(len(validation.files)),
            "retrieval_copies": float(len(copies)),
            **{f"reference.retrieval_recall_at_{k}": v for k, v in recall.items()},
        },
        torch_latency=torch_latency(embedder, pre),
        versions={"torch": torch.__version__, "torchvision": torchvision.__version__, "onnx": onnx.__version__},
        task_settings={
            "preprocessing": preprocessing_settings(pre, {"decode": "exact", "decode_min_side": 0}),
            "pooling": pooling,
            "normalize": opts.normalize,
        },
        extra_files=[],
    )


def _hf_encoder(
    value: str, model_type: str, opts: ImageEmbeddingOptions
) -> tuple[nn.Module, dict[str, Any], str, dict[str, Any]]:
    """A Hugging Face vision checkpoint: the pooled encoder, its preprocessing (flags override
    the processor's), its pooling and the source record."""
    if opts.weights:
        raise InvalidSpecError(f"--weights does not apply to a Hugging Face checkpoint ({value} holds its own)")
    if opts.head == "drop":
        raise InvalidSpecError(f"head=drop does not apply to {value}: its pooling is {model_type}'s own")
    path = Path(value).expanduser().resolve()
    pre = hf_preprocessing(path, opts.resize_size, opts.crop_size)
    if opts.mean:
        pre["mean"] = tuple(opts.mean)
    if opts.std:
        pre["std"] = tuple(opts.std)
    network, pooling = load_hf_vision(path, model_type)
    weights = next((f for f in ("model.safetensors", "pytorch_model.bin") if (path / f).is_file()), None)
    record = {
        "kind": "huggingface",
        "id": path.name,
        "revision": "",
        "weights_sha256": sha256_file(path / weights) if weights else None,
    }
    return network, pre, pooling, record
