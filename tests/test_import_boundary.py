"""What each entry point must not import: the serving image has no torch, transformers or kfp."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

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
    assert _loaded(modules, ["torch", "transformers", "kfp", "ortpack.components", "onnx", "torchvision"]) == []


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


# ---------------------------------------------------------------------------- the floors

FLOORS = ("kernel", "components", "serving", "pipelines")
# Which floors each floor may import: the kernel stands alone, the build and the serving side stand
# beside each other on it, the pipeline and the CLI on top of all three
MAY_IMPORT = {
    "kernel": {"kernel"},
    "components": {"kernel", "components"},
    "serving": {"kernel", "serving"},
    "pipelines": set(FLOORS),
}


def _imports(path: Any) -> list[tuple[int, str, bool]]:
    """(line, module, inside a function) of every absolute import statement of `path`, those under
    TYPE_CHECKING included (they say what a module depends on too)."""
    import ast

    found: list[tuple[int, str, bool]] = []

    def visit(node: Any, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, True)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.lineno, child.module, in_function))
            elif isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name, in_function) for alias in child.names)
            else:
                visit(child, in_function)

    visit(ast.parse(path.read_text()), False)
    return found


def _modules(floor: str) -> dict[str, Any]:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return {str(p.relative_to(root)): p for p in (root / floor).rglob("*.py")}


@pytest.mark.parametrize("floor", FLOORS)
def test_each_floor_imports_only_the_floors_under_it(floor: str) -> None:
    """kernel -> nothing of ortpack's but itself; components and serving -> the kernel (never each
    other); pipelines -> all three."""
    offenders = []
    for rel, path in _modules(floor).items():
        for line, module, _ in _imports(path):
            parts = module.split(".")
            if parts[0] == "ortpack" and len(parts) > 1 and parts[1] in FLOORS and parts[1] not in MAY_IMPORT[floor]:
                offenders.append(f"{rel}:{line}: {module}")
            if parts[0] in FLOORS:  # the floors are only ever imported as ortpack.<floor>
                offenders.append(f"{rel}:{line}: {module} (import it as ortpack.{module})")
    assert not offenders, f"{floor} imports what it must not:\n" + "\n".join(offenders)


# Libraries worth importing only when a function needs them: heavy to import (torch, onnxruntime,
# kfp...) or optional extras (boto3, oras, model-signing, Pillow...).
HEAVY = {
    "torch", "torchvision", "transformers", "onnxruntime", "onnx", "onnxscript", "kfp", "kfp_kubernetes",
    "matplotlib", "PIL", "simplejpeg", "tokenizers", "safetensors", "boto3", "botocore", "google", "oras",
    "requests", "model_signing", "docker", "psutil", "uvicorn", "starlette", "prometheus_client", "yaml",
}  # fmt: skip
# Where the project's own modules are imported inside functions, and why
INNER_IMPORTS = {
    # a KFP component's body is its source code, run alone in the component's container
    **{
        f"components/{name}.py": "KFP component"
        for name in ("export", "optimize", "validate", "benchmark", "package", "source")
    },
    # the start-up timeline measures the imports as phases and overlaps them with verification
    "serving/__main__.py": "start-up timeline",
    # the task registry imports the contracts on first use: compiling the pipeline never loads numpy
    "kernel/contracts/__init__.py": "task registry, on first use",
}  # fmt: skip


def _heavy(module: str, tops: dict[str, set[str]], seen: set[str]) -> bool:
    """Whether importing `module` (one of the project's) imports a heavy library at its top level,
    itself or through the project's modules it imports there."""
    if module in seen:
        return False
    seen.add(module)
    for target in tops.get(module, set()):
        if target.split(".")[0] in HEAVY:
            return True
        if target in tops and _heavy(target, tops, seen):
            return True
    return False


def test_function_level_imports_are_of_heavy_modules_only() -> None:
    """Imports sit at the top of a module; one inside a function is of a heavy or optional library
    (HEAVY), or of a project module that imports one at its top (an exporter imports torch), or in
    a module listed in INNER_IMPORTS with its reason."""
    modules: dict[str, Any] = {}
    for floor in FLOORS:
        for rel, path in _modules(floor).items():
            name = "ortpack." + rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
            modules[name] = (rel, path)
    imports = {name: _imports(path) for name, (_, path) in modules.items()}

    def known(target: str) -> str:
        return target if target in modules else target.rsplit(".", 1)[0]

    tops = {name: {known(t) for _, t, inner in found if not inner} for name, found in imports.items()}
    offenders = []
    for name, found in imports.items():
        rel = modules[name][0]
        for line, target, inner in found:
            if not inner or rel in INNER_IMPORTS or target.split(".")[0] != "ortpack":
                continue
            if not _heavy(known(target), tops, set()):
                offenders.append(f"{rel}:{line}: {target}")
    assert not offenders, "light project modules imported inside functions:\n" + "\n".join(offenders)


@pytest.mark.slow
def test_pip_install_leaves_one_top_level_package(tmp_path: Any) -> None:
    """The wheel `pip install .` installs holds one top-level import package, ortpack, with its
    four floors (and the data the build side reads)."""
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    subprocess.run([*build, str(root)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("ortpack-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"ortpack"}
    floors = {n.split("/")[1] for n in names if n.count("/") >= 2}
    assert set(FLOORS) <= floors
    assert "ortpack/components/core/data/validation_sentences.jsonl" in names


def test_every_module_has_one_import_name() -> None:
    """A floor imported under its folder's name (`import kernel`, with the repository root on
    sys.path, as pytest and the editable install put it) is refused with the name to use: one file,
    one module object. Nothing in this process was loaded under a second name."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for floor in FLOORS:
        done = subprocess.run(
            [sys.executable, "-c", f"import {floor}"], cwd=root, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, done.stderr
        refusal = f"ImportError: import ortpack.{floor}, not {floor}: {floor}/ is the package ortpack.{floor}"
        assert refusal in done.stderr
    assert [m for m in sys.modules if m.split(".")[0] in FLOORS] == []


def test_a_build_without_the_links_fails_and_says_why(tmp_path: Any) -> None:
    """A checkout without symbolic links (ortpack/kernel a text file, as Windows checks links out)
    does not build a wheel that silently lacks the kernel."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tree = tmp_path / "checkout"
    (tree / "ortpack").mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md", "ortpack/__init__.py"):
        shutil.copy(root / name, tree / name)
    shutil.copytree(root / "kernel", tree / "kernel", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "ortpack" / "kernel").write_text("../kernel")  # what git writes for a link without symlinks
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w")]
    done = subprocess.run([*build, str(tree)], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and not list((tmp_path / "w").glob("*.whl"))
    assert "ortpack/kernel must be a symbolic link to kernel/" in done.stdout + done.stderr
