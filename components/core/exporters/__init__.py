"""Exporters, one module per task (text_embedding, text_classification, image_classification).
A task's family in `ortpack.components.core.tasks` names its exporter; nothing is registered on import."""
