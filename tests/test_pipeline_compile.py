"""The compiled pipeline: deterministic, guarded by golden files, loadable, and light to build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from pipelines.golden import COMPILED, COMPONENT_IO, compile_pipeline, component_io

REGENERATE = "regenerate with `make golden` and review the diff"


def test_compile_is_byte_identical_and_matches_golden(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    compile_pipeline(first)
    compile_pipeline(second)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == COMPILED.read_bytes(), f"pipelines/package_model.yaml is stale: {REGENERATE}"


def test_component_interfaces_match_golden() -> None:
    assert component_io() == json.loads(COMPONENT_IO.read_text()), f"component I/O changed: {REGENERATE}"


def test_compiled_yaml_loads_back_with_the_sdk() -> None:
    from kfp import components

    loaded = components.load_component_from_file(str(COMPILED))
    assert loaded.name == "package-model"
    assert set(loaded.component_spec.inputs) == {
        "model",
        "task",
        "name",
        "max_length",
        "weights",
        "labels",
        "preprocessing",
        "cpu_precisions",
        "cuda_precisions",
        "thresholds",
        "version",
    }


def _executors(doc: dict) -> dict[str, dict]:
    return doc["deploymentSpec"]["executors"]


def test_every_step_runs_on_the_component_image() -> None:
    from components.images import COMPONENT_IMAGE

    docs = list(yaml.safe_load_all(COMPILED.read_text()))
    images = {e["container"]["image"] for e in _executors(docs[0]).values()}
    assert images == {COMPONENT_IMAGE}
    # each step bootstraps only the kfp SDK (--no-deps); packages_to_install stays empty
    text = COMPILED.read_text()
    assert text.count("pip install") == text.count("pip install --quiet --no-warn-script-location 'kfp==") > 0


def test_cuda_steps_request_a_gpu_and_cpu_steps_do_not() -> None:
    docs = list(yaml.safe_load_all(COMPILED.read_text()))
    executors = _executors(docs[0])
    gpu = {name for name, e in executors.items() if "accelerator" in e["container"].get("resources", {})}
    # validate and benchmark of the cuda branch run on a GPU; optimize only builds the graph
    assert len(gpu) == 2 and all(("validate" in n or "benchmark" in n) for n in gpu)
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(platform) == gpu
    for spec in platform.values():
        assert spec["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_cache_key_includes_the_onnxruntime_version() -> None:
    import onnxruntime

    from components.images import ORT_VERSION

    assert ORT_VERSION == onnxruntime.__version__, "components/images.py must name the pinned onnxruntime"
    golden = json.loads(COMPONENT_IO.read_text())
    for step in ("optimize-variant", "validate-variant", "benchmark-variant"):
        assert golden[step]["inputs"]["ort_version"]["optional"] is False
    assert f"constant: {ORT_VERSION}" in COMPILED.read_text() or f"'{ORT_VERSION}'" in COMPILED.read_text()


def test_compiling_imports_neither_torch_nor_onnxruntime(tmp_path: Path) -> None:
    code = (
        "import sys; from pipelines.golden import compile_pipeline; from pathlib import Path;"
        f"compile_pipeline(Path({str(tmp_path / 'p.yaml')!r}));"
        "print(sorted(m for m in ('torch', 'onnxruntime', 'transformers', 'onnx', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_compile(tmp_path: Path) -> None:
    out = tmp_path / "cpu.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "compile", "--targets", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "nvidia.com/gpu" not in out.read_text()
    assert "cuda-variants" not in out.read_text() and "cpu-variants" in out.read_text()
