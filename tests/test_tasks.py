"""The task seam: one registered contract, family and serving plugin per task, each tested end to
end, and no task named anywhere but in its own modules."""

from __future__ import annotations

import ast
from pathlib import Path

from ortpack.components.core.tasks import get_family, task_names
from ortpack.kernel.contracts import contract_names, get_contract
from ortpack.serving.tasks import get_task
from ortpack.serving.tasks import task_names as serving_task_names

ROOT = Path(__file__).resolve().parent.parent
# Where a task's own modules live: each holds <task>.py (`text-embedding` -> text_embedding.py)
TASK_DIRS = (
    "kernel/contracts",
    "kernel/engines",
    "serving/tasks",
    "components/core/tasks",
    "components/core/exporters",
)
# The registries may name the default task
REGISTRIES = ("kernel/contracts/__init__.py",)


def test_every_task_has_a_contract_a_family_and_a_plugin() -> None:
    assert set(task_names()) == set(serving_task_names()) == set(contract_names())
    for name in contract_names():
        assert get_contract(name).name == get_family(name).name == get_task(name).name == name


def test_every_task_is_built_and_served_by_a_test() -> None:
    """A registered task that no test builds and serves would ship untested."""
    tests = {p: p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.name != "test_tasks.py"}
    for name in task_names():
        covering = [p.name for p, text in tests.items() if f'"{name}"' in text and "running_server(" in text]
        assert covering, f"no test builds and serves a {name} bundle"


def _own_module(path: Path, task: str) -> bool:
    rel = path.relative_to(ROOT)
    return str(rel.parent) in TASK_DIRS and rel.stem == task.replace("-", "_")


def test_tasks_are_named_only_in_their_own_modules() -> None:
    """Any string that is exactly a task's name (a comparison, a dict key, a match case, a
    default) outside that task's own modules fails: adding a task must not mean editing shared
    code, and shared code must not branch on a task."""
    names = set(contract_names())
    offenders = []
    for package in ("kernel", "components", "serving", "pipelines"):
        for path in (ROOT / package).rglob("*.py"):
            if str(path.relative_to(ROOT)) in REGISTRIES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names and not _own_module(path, node.value):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not offenders, "task names outside their own modules:\n" + "\n".join(offenders)


def test_the_seam_check_catches_each_form(tmp_path: Path) -> None:
    """The check above sees a comparison, a dict key, a match case and a default."""
    names = set(contract_names())
    source = """
if task == "text-embedding": pass
x = {"image-classification": 1}
match task:
    case "text-classification": pass
def f(task="text-embedding"): pass
"""
    found = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and n.value in names}
    assert found == {"text-embedding", "image-classification", "text-classification"}
