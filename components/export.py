"""KFP component: export a model to ONNX with its PyTorch reference outputs."""

from kfp import dsl
from kfp.dsl import Metrics, Model, Output

from ortpack.components.container_images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def export_model(
    model_uri: str,
    source_versions: str,
    task: str,
    name: str,
    task_options: dict,
    exported: Output[Model],
    metrics: Output[Metrics],
    allow_degenerate_reference: bool = False,
) -> None:
    """Fetch the model, export it to ONNX with pre/post-processing inside the graph, and compute
    the PyTorch reference outputs on the shipped validation set (later steps need only ONNX Runtime).

    Args:
        model_uri: s3://, minio://, gs://, http(s):// (a tar), hf://ORG/NAME@REVISION, a path in
            the image or on a mounted volume, or a bundled model name (all-MiniLM-L6-v2).
        source_versions: The resolve step's pins (the content each source held when the run started).
        task: The task, e.g. text-embedding or image-classification (each is kernel/contracts/<task>.py).
        name: The bundle name; empty for the model's own name.
        task_options: The task's options ({} for its defaults; each task's are its contract's,
            kernel/contracts/<task>.py): text tasks max_length; image models weights and labels
            (a path or URI), resize_size, crop_size, mean, std, validation_images and
            calibration_images (directories of photos, as the step sees them).
        exported: Directory with model.onnx, reference.npz, export.json and the tokenizer.
        metrics: export.nodes, export.mb, export.seconds, torch.p50_ms.<shape>.
        allow_degenerate_reference: Build even when the PyTorch outputs barely vary (random
            weights): parity is then vacuous, and the report says so.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_export_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    params = {
        "task": task,
        "name": name,
        "task_options": task_options,
        "allow_degenerate_reference": allow_degenerate_reference,
    }
    out = run_export_step(Path(exported.path), model_uri=model_uri, source_versions=source_versions, params=params)
    for key, value in out.metrics.items():
        metrics.log_metric(key, value)
    exported.metadata.update(out.metadata)
