"""What each entry point must not import: the serving image has no torch, transformers or kfp."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHECK = """
import sys, importlib
for module in {modules!r}:
    importlib.import_module(module)
loaded = sorted(m for m in {forbidden!r} if m in sys.modules)
print(",".join(loaded))
"""


def _loaded(modules: list[str], forbidden: list[str]) -> list[str]:
    code = _CHECK.format(modules=modules, forbidden=forbidden)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def test_serving_imports_no_heavy_or_pipeline_code() -> None:
    modules = ["serving", "serving.bundle", "serving.runtime"]
    assert _loaded(modules, ["torch", "transformers", "kfp", "components", "onnx", "torchvision"]) == []


@pytest.mark.parametrize("module", ["pipelines.cli", "components.core.specs", "components.core.artifacts"])
def test_cli_and_specs_import_nothing_heavy(module: str) -> None:
    assert _loaded([module], ["torch", "transformers", "onnxruntime", "onnx", "kfp"]) == []
