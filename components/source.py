"""KFP component: what the model URI holds now, so the export's cache key sees content."""

from kfp import dsl

from ortpack.components.container_images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def resolve_source(model_uri: str, task: str, task_options: dict) -> str:
    """Ask the store what the model (and the files the task's options name: an image model's
    weights and labels) is now, cheaply: the commit of
    an hf:// revision, the ETags under an s3:// prefix, an https ETag or sha256, a local tree's
    sha256. Never cached, so a changed checkpoint at the same URI changes the export's inputs.

    Args:
        model_uri: The pipeline's model_uri.
        task: The pipeline's task.
        task_options: The pipeline's task_options (the files among them are pinned).

    Returns:
        `model=...;weights=...;labels=...`, the export step's pins.
    """
    from ortpack.components.core.logs import log_to_stdout
    from ortpack.components.core.sources import resolve_source_versions
    from ortpack.kernel.contracts import get_contract

    log_to_stdout()
    files = {key: str(task_options.get(key) or "") for key in get_contract(task).options.FILES}
    versions = resolve_source_versions(model_uri, **files)
    print(f"source: {versions}")
    return versions
