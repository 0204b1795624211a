"""KFP component: what the model URI holds now, so the export's cache key sees content."""

from kfp import dsl

from components.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def resolve_source(model_uri: str, weights: str, labels: str) -> str:
    """Ask the store what the model (and a weights or labels file) is now, cheaply: the commit of
    an hf:// revision, the ETags under an s3:// prefix, an https ETag or sha256, a local tree's
    sha256. Never cached, so a changed checkpoint at the same URI changes the export's inputs.

    Args:
        model_uri: The pipeline's model_uri.
        weights: The pipeline's weights (a path or URI; empty for none).
        labels: The pipeline's labels (a path or URI; empty for none).

    Returns:
        `model=...;weights=...;labels=...`, the export step's pins.
    """
    from components.core.logs import log_to_stdout
    from components.core.sources import resolve_source_versions

    log_to_stdout()
    versions = resolve_source_versions(model_uri, weights, labels)
    print(f"source: {versions}")
    return versions
