"""Serving-side task plugins: one module per task contributes its routes, request/response
schemas and how Open Inference Protocol tensors become its engine's payloads.

A task module defines a `ServingTask` named `TASK` (the contract: serving/tasks/contract.py); its
task contract (kernel/contracts/<task>.py) names the module, so the registry of tasks is the
contracts' (no import side effects: a plugin is imported when its task is served). Everything
outside `serving/tasks/` asks the task of the bundle through this interface and never compares
task names.
"""

from __future__ import annotations

from importlib import import_module

from ortpack.kernel.contracts import UnknownTaskError, contract_names, get_contract
from ortpack.serving.tasks.contract import LoadContext, ServingTask, TaskRuntime

__all__ = ["LoadContext", "ServingTask", "TaskRuntime", "get_task", "task_names"]


def get_task(name: str) -> ServingTask:
    try:
        plugin = get_contract(name).plugin
    except UnknownTaskError:
        raise ValueError(f"this server cannot serve task {name!r} (it serves: {', '.join(task_names())})") from None
    task = import_module(plugin).TASK
    if not isinstance(task, ServingTask) or task.name != name:
        raise TypeError(f"{plugin}.TASK must be the ServingTask of {name!r}")
    return task


def task_names() -> list[str]:
    return sorted(contract_names())
