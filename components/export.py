"""KFP component: export a model to ONNX with its PyTorch reference outputs."""

from kfp import dsl
from kfp.dsl import Metrics, Model, Output

from components.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE)
def export_model(
    model: str,
    task: str,
    name: str,
    max_length: int,
    weights: str,
    labels: str,
    preprocessing: dict,
    exported: Output[Model],
    metrics: Output[Metrics],
    allow_degenerate_reference: bool = False,
) -> None:
    """Export a PyTorch model to ONNX with pre/post-processing inside the graph.

    Also computes the PyTorch reference outputs on the shipped validation set, so that later
    steps need only ONNX Runtime.

    Args:
        model: A Hugging Face checkpoint directory, or a bundled model name (all-MiniLM-L6-v2).
        task: text-embedding or image-classification.
        name: The bundle name; empty for the model's own name.
        max_length: Token limit of text models; 0 for the model's own.
        weights: Image models: a state-dict file in the image (or a mounted volume); empty for
            random weights.
        labels: Image models: a labels file, one per line; empty for the weights' categories.
        preprocessing: Image models: overrides of resize_size, crop_size, mean and std.
        exported: Directory with model.onnx, reference.npz, export.json and the tokenizer.
        metrics: export.nodes, export.mb, export.seconds, torch.p50_ms.<shape>.
        allow_degenerate_reference: Build even when the PyTorch outputs barely vary (random
            weights): parity is then vacuous, and the report says so.
    """
    from pathlib import Path

    from components.core.export import export_model as run_export
    from components.core.logs import log_to_stdout
    from components.core.sources import resolve_model_source
    from components.core.specs import ExportSpec

    log_to_stdout()
    source, default_name = resolve_model_source(model, task)
    spec = ExportSpec(
        source=source,
        task=task,
        name=name or default_name,
        max_length=max_length or None,
        weights=weights or None,
        labels=labels or None,
        resize_size=preprocessing.get("resize_size"),
        crop_size=preprocessing.get("crop_size"),
        mean=tuple(preprocessing["mean"]) if preprocessing.get("mean") else None,
        std=tuple(preprocessing["std"]) if preprocessing.get("std") else None,
        allow_degenerate_reference=allow_degenerate_reference,
    )
    result = run_export(spec, Path(exported.path))
    for key, value in result.metrics.items():
        metrics.log_metric(f"export.{key}", value)
    for shape, stats in result.torch_latency.items():
        metrics.log_metric(f"torch.p50_ms.{shape}", stats["p50_ms"])
    exported.metadata.update({"task": result.task, "name": result.name, "opset": result.opset})
