"""Serving-side task plugins: one module per task contributes its routes, request/response
schemas, backend, warm-up shapes, probe check and Open Inference Protocol tensors.

A task module defines a `ServingTask` (the contract: serving/tasks/contract.py) and is registered
in `_registry` below (explicitly: no import side effects). Everything outside `serving/tasks/`
asks the task of the bundle through this interface and never compares task names.
"""

from __future__ import annotations

from serving.tasks.contract import LoadContext, Prepare, ServingTask, TaskRuntime

__all__ = ["LoadContext", "Prepare", "ServingTask", "TaskRuntime", "get_task", "task_names"]


def _registry() -> dict[str, ServingTask]:
    from serving.tasks import image_classification, text_classification, text_embedding

    tasks = (text_embedding.TASK, image_classification.TASK, text_classification.TASK)
    return {t.name: t for t in tasks}


def get_task(name: str) -> ServingTask:
    tasks = _registry()
    try:
        return tasks[name]
    except KeyError:
        raise ValueError(f"this server cannot serve task {name!r} (it serves: {', '.join(sorted(tasks))})") from None


def task_names() -> list[str]:
    return sorted(_registry())
