"""Exporters, one module per model family. Each module registers itself by task key; the imports
below are the complete, explicit list of families."""

from components.core.exporters import (
    image_classification,  # noqa: F401  registers "image-classification"
    text_embedding,  # noqa: F401  registers "text-embedding"
)
from components.core.exporters.registry import get_exporter, register_exporter, registered_tasks

__all__ = ["get_exporter", "register_exporter", "registered_tasks"]
