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
    modules = ["ortpack.serving", "ortpack.kernel.bundle", "ortpack.kernel.runtime"]
    assert _loaded(modules, ["torch", "transformers", "kfp", "components", "onnx", "torchvision"]) == []


@pytest.mark.parametrize(
    "module", ["ortpack.pipelines.cli", "ortpack.components.core.specs", "ortpack.components.core.artifacts"]
)
def test_cli_and_specs_import_nothing_heavy(module: str) -> None:
    assert _loaded([module], ["torch", "transformers", "onnxruntime", "onnx", "kfp"]) == []


_COMMAND = """
import contextlib, sys
from ortpack.pipelines.cli import main
with contextlib.suppress(SystemExit):
    print("exit", main({argv!r}), file=sys.stderr)
print("loaded:" + ",".join(sorted(m for m in {forbidden!r} if m in sys.modules)))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["run", "--model", "/no/such/model"],
        ["submit", "--model", "s3://bucket/model", "--precisions", "int3", "--host", "http://127.0.0.1:9"],
        ["build", "--model", "/no/such/model", "--out", "/no/such/out"],
    ],
)
def test_cli_refuses_before_importing_kfp_or_an_engine(argv: list[str]) -> None:
    """A refusal (and --version, --help) answers in well under a second: kfp alone takes ~0.7 s."""
    code = _COMMAND.format(argv=argv, forbidden=["kfp", "torch", "transformers", "onnxruntime"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "loaded:", done.stdout
    assert "Traceback" not in done.stderr
    assert argv == ["--version"] or "exit 2" in done.stderr, done.stderr  # refused: bad input


def _import_graph(package: str) -> dict[str, set[str]]:
    """{module: modules of the same package it imports}, counting every import statement in the
    module: at the top, inside functions and under TYPE_CHECKING."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    modules = {}
    for path in (root / package).rglob("*.py"):
        name = "ortpack." + ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", ["kernel", "components", "serving", "pipelines"])
def test_no_import_circle(package: str) -> None:
    """Each package's import map is a tree of layers: a task plugin imports the contract, never
    the registry that imports it back; a leaf never consults a registry."""
    assert _circles(_import_graph(package)) == []
