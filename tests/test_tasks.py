"""The task seam: one registered family per task on each side, each tested end to end, and no
task-name comparison anywhere else."""

from __future__ import annotations

import re
from pathlib import Path

from components.core.tasks import get_family, task_names
from serving.bundle import TASK_SECTIONS
from serving.tasks import get_task
from serving.tasks import task_names as serving_task_names

ROOT = Path(__file__).resolve().parent.parent
# A comparison with a task name: `== "text-embedding"`, `!= "image-classification"`, `in ("...")`.
_NAMES = "|".join(map(re.escape, TASK_SECTIONS))
_COMPARISON = re.compile(r"""(==|!=|\bin\b)\s*[(\[{]?\s*["'](""" + _NAMES + r""")["']""")


def test_every_task_has_a_module_on_each_side() -> None:
    assert set(task_names()) == set(serving_task_names()) == set(TASK_SECTIONS)
    for name in task_names():
        assert get_family(name).name == name and get_task(name).name == name


def test_every_task_is_built_and_served_by_a_test() -> None:
    """A registered task that no test builds and serves would ship untested."""
    tests = {p: p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_tasks.py"}
    for name in task_names():
        covering = [p.name for p, text in tests.items() if f'"{name}"' in text and "running_server(" in text]
        assert covering, f"no test builds and serves a {name} bundle"


def test_no_task_name_comparison_outside_the_registries() -> None:
    allowed = {ROOT / "components/core/tasks", ROOT / "serving/tasks"}
    offenders = []
    for package in ("components", "serving", "pipelines"):
        for path in (ROOT / package).rglob("*.py"):
            if any(path.is_relative_to(a) for a in allowed):
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if _COMPARISON.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "task names compared outside the registries:\n" + "\n".join(offenders)
