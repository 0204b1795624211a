"""The compiled pipeline: deterministic, guarded by golden files, loadable, light to build, and
shaped for the Kubeflow backends it claims to run on (2.14 and later)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ortpack.pipelines.golden import COMPILED, COMPONENT_IO, GraphOptions, compile_pipeline, component_io

REGENERATE = "regenerate with `make golden` and review the diff"
DIGEST = "sha256:" + "ab" * 32


def _docs(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(path.read_text()))


def _compiled(tmp_path: Path, **options: Any) -> list[dict[str, Any]]:
    path = tmp_path / "p.yaml"
    compile_pipeline(path, GraphOptions(**options))
    return _docs(path)


@pytest.fixture(scope="module")
def gpu_docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _compiled(tmp_path_factory.mktemp("gpu"), targets=("cpu", "cuda"), model_pvc="checkpoints")


def _executors(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return doc["deploymentSpec"]["executors"]


def _platform(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}


def _dags(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every DAG (the root and each sub-DAG: loops, conditions) by component name."""
    dags = {"root": doc["root"]["dag"]}
    dags.update({name: c["dag"] for name, c in doc["components"].items() if "dag" in c})
    return dags


def _all_tasks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: task for dag in _dags(doc).values() for name, task in dag["tasks"].items()}


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
    inputs = set(loaded.component_spec.inputs)
    assert {"model_uri", "task", "version", "thresholds", "cpu_precisions", "publish_to", "sign_key"} <= inputs
    assert {"credentials_secret", "signing_secret"} <= inputs
    for step in ("export", "optimize", "validate", "benchmark", "package"):
        assert {f"{step}_cpu", f"{step}_memory"} <= inputs
    # cuda is off by default: the committed YAML has no GPU branch and no GPU parameters
    assert "cuda_precisions" not in inputs and "gpu_node_selector" not in inputs
    assert loaded.component_spec.inputs["version"].default == ""  # unique per run unless given


@pytest.mark.parametrize("targets", [("cpu",), ("cpu", "cuda")])
def test_every_producer_task_exists_in_its_dag(targets: tuple[str, ...], tmp_path: Path) -> None:
    """Backends up to 2.15 fail with "cannot find producer task" when a loop's task name differs
    from its key (a ParallelFor display name, kubeflow/pipelines#13239)."""
    (doc, *_) = _compiled(tmp_path, targets=targets)
    checked = 0
    for dag in _dags(doc).values():
        names = set(dag["tasks"])
        for task in dag["tasks"].values():
            assert set(task.get("dependentTasks", [])) <= names
            for kind in ("artifacts", "parameters"):
                for spec in task.get("inputs", {}).get(kind, {}).values():
                    for ref in ("taskOutputArtifact", "taskOutputParameter"):
                        if ref in spec:
                            assert spec[ref]["producerTask"] in names, spec
                            checked += 1
        for output in dag.get("outputs", {}).get("artifacts", {}).values():
            for selector in output.get("artifactSelectors", []):
                assert selector["producerSubtask"] in names
                checked += 1
    assert checked >= 10


@pytest.mark.parametrize("targets", [("cpu",), ("cpu", "cuda")])
def test_loops_and_conditions_have_no_display_names(targets: tuple[str, ...], tmp_path: Path) -> None:
    (doc, *_) = _compiled(tmp_path, targets=targets)
    groups = {k: t for k, t in _all_tasks(doc).items() if k.startswith(("for-loop-", "condition-"))}
    assert len(groups) == len(targets) + 1
    assert all(task["taskInfo"]["name"] == key for key, task in groups.items())


def test_only_resolve_and_export_run_on_the_torch_image_and_nothing_installs() -> None:
    from ortpack.components.container_images import COMPONENT_IMAGE, STEPS_IMAGE

    (doc, *_) = _docs(COMPILED)
    by_image: dict[str, set[str]] = {}
    for name, e in _executors(doc).items():
        by_image.setdefault(e["container"]["image"], set()).add(name)
    assert by_image == {
        COMPONENT_IMAGE: {"exec-resolve-source", "exec-export-model"},
        STEPS_IMAGE: {
            "exec-optimize-variant", "exec-validate-variant", "exec-benchmark-variant", "exec-package-bundle",
            "exec-check-gate", "exec-publish-bundle",
        },
    }  # fmt: skip
    # install_kfp_package=False: the image carries kfp, no step reaches a package index at run time
    assert "pip install" not in COMPILED.read_text()
    golden = json.loads(COMPONENT_IO.read_text())
    assert all(c["image"] == COMPONENT_IMAGE for c in golden.values())  # the components' own default


@pytest.mark.parametrize(
    ("component", "steps"),
    [
        ("example.org/ml/ortpack-component:7", "example.org/ml/ortpack-steps:7"),
        ("localhost:5000/ortpack-component:1.2-rc1", "localhost:5000/ortpack-steps:1.2-rc1"),
        (f"example.org/ml/ortpack-component@{DIGEST}", f"example.org/ml/ortpack-component@{DIGEST}"),
        ("example.org/ml/my-component:7", "example.org/ml/my-component:7"),
    ],
)
def test_steps_image_beside_a_component_image(component: str, steps: str) -> None:
    from ortpack.components.container_images import steps_image_for

    assert steps_image_for(component) == steps


def test_image_override_by_digest(tmp_path: Path) -> None:
    image, gpu_image = f"registry.example.com/ml/ortpack-component@{DIGEST}", f"registry.example.com/ml/gpu@{DIGEST}"
    (doc, *_) = _compiled(tmp_path, targets=("cpu", "cuda"), image=image, gpu_image=gpu_image)
    by_image: dict[str, set[str]] = {}
    for name, e in _executors(doc).items():
        by_image.setdefault(e["container"]["image"], set()).add(name)
    assert set(by_image) == {image, gpu_image}  # a digest pins one build: it runs the torch-free steps too
    assert by_image[gpu_image] == {"exec-optimize-variant-2", "exec-validate-variant-2", "exec-benchmark-variant-2"}


def test_cli_image_options(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    env_image = f"example.org/c@{DIGEST}"
    ok = _cli("compile", "--out", str(out), env={"ORTPACK_COMPONENT_IMAGE": env_image})
    assert ok.returncode == 0, ok.stderr
    assert f"image: {env_image}" in out.read_text() and "ghcr.io/ortpack" not in out.read_text()
    tagged = _cli("compile", "--out", str(out), "--targets", "cpu,cuda", "--component-image", "example.org/c:1.2")
    assert tagged.returncode == 0, tagged.stderr
    assert "image: example.org/c:1.2-gpu" in out.read_text()
    steps = _cli(
        "compile", "--out", str(out), "--component-image", "example.org/ortpack-component:3",
        "--steps-image", f"example.org/s@{DIGEST}",
    )  # fmt: skip
    assert steps.returncode == 0, steps.stderr
    images = {e["container"]["image"] for e in _executors(_docs(out)[0]).values()}
    assert images == {"example.org/ortpack-component:3", f"example.org/s@{DIGEST}"}
    bad_steps = _cli("compile", "--out", str(out), "--steps-image", "no tag here")
    assert bad_steps.returncode == 2 and "bad image reference" in bad_steps.stderr
    pinned = _cli("compile", "--out", str(out), "--targets", "cpu,cuda", "--component-image", env_image)
    assert pinned.returncode == 2 and "give the GPU image explicitly" in pinned.stderr
    bad = _cli("compile", "--out", str(out), "--component-image", "no tag here")
    assert bad.returncode == 2 and "bad image reference" in bad.stderr


def _resources(executor: dict[str, Any]) -> dict[str, Any]:
    return executor["container"].get("resources", {})


def test_every_heavy_step_has_requests_and_limits_from_parameters() -> None:
    (doc, *_) = _docs(COMPILED)
    defaults = {k: v.get("defaultValue") for k, v in doc["root"]["inputDefinitions"]["parameters"].items()}
    for step in ("export-model", "optimize-variant", "validate-variant", "benchmark-variant", "package-bundle"):
        res = _resources(_executors(doc)[f"exec-{step}"])
        param = step.split("-")[0]
        for field, kind in (
            ("resourceCpuRequest", "cpu"),
            ("resourceCpuLimit", "cpu"),
            ("resourceMemoryLimit", "memory"),
        ):
            assert res[field] == f"{{{{$.inputs.parameters['pipelinechannel--{param}_{kind}']}}}}", (step, res)
        assert defaults[f"{param}_cpu"] and defaults[f"{param}_memory"].endswith("Gi")
    for step in ("resolve-source", "check-gate", "publish-bundle"):  # small fixed budgets
        res = _resources(_executors(doc)[f"exec-{step}"])
        assert res["cpuLimit"] > 0 and res["memoryLimit"] > 0


def test_retries_and_cache_policy() -> None:
    (doc, *_) = _docs(COMPILED)
    tasks = _all_tasks(doc)
    for name in ("resolve-source", "publish-bundle"):  # stores: transient faults are retried
        assert tasks[name]["retryPolicy"]["maxRetryCount"] == 2, name
    for name in ("export-model", "optimize-variant", "validate-variant", "benchmark-variant", "package-bundle"):
        assert "retryPolicy" not in tasks[name], f"{name} is deterministic: a refusal must not wait for retries"
    for name in ("benchmark-variant", "resolve-source", "package-bundle", "publish-bundle"):
        assert not tasks[name]["cachingOptions"].get("enableCache"), f"{name} must never be served from cache"
    for name in ("export-model", "optimize-variant", "validate-variant"):
        assert tasks[name]["cachingOptions"]["enableCache"] is True
    # the export's cache key sees the source's content, through the resolve step's output
    pins = tasks["export-model"]["inputs"]["parameters"]["source_versions"]
    assert pins["taskOutputParameter"]["producerTask"] == "resolve-source"


def test_cache_key_includes_the_onnxruntime_version() -> None:
    import onnxruntime

    from ortpack.components.container_images import ORT_VERSION

    assert ORT_VERSION == onnxruntime.__version__, "components/container_images.py must name the pinned onnxruntime"
    golden = json.loads(COMPONENT_IO.read_text())
    for step in ("optimize-variant", "validate-variant", "benchmark-variant"):
        assert golden[step]["inputs"]["ort_version"]["optional"] is False
    assert f"constant: {ORT_VERSION}" in COMPILED.read_text() or f"'{ORT_VERSION}'" in COMPILED.read_text()


def test_secrets_are_optional_volumes_named_by_parameters() -> None:
    """Optional secret volumes work from backend 2.14 (optional secret env vars only from 2.15)."""
    from ortpack.pipelines.package_model import CREDENTIALS_DIR, SIGNING_DIR

    platform = _platform(_docs(COMPILED))
    wired = {}
    for name, spec in platform.items():
        assert "secretAsEnv" not in spec
        for volume in spec.get("secretAsVolume", []):
            assert volume["optional"] is True
            wired[(name, volume["mountPath"])] = volume["secretNameParameter"]["componentInputParameter"]
    assert wired == {
        ("exec-resolve-source", CREDENTIALS_DIR): "credentials_secret",
        ("exec-export-model", CREDENTIALS_DIR): "credentials_secret",
        ("exec-publish-bundle", CREDENTIALS_DIR): "pipelinechannel--credentials_secret",
        ("exec-package-bundle", SIGNING_DIR): "signing_secret",
        ("exec-package-bundle", CREDENTIALS_DIR): "credentials_secret",  # it fetches the baseline bundle
    }
    from ortpack.components.core.sources import CREDENTIALS_DIR as LIBRARY_DIR

    assert CREDENTIALS_DIR == LIBRARY_DIR


def test_publish_runs_only_after_the_gate_and_only_when_asked() -> None:
    (doc, *_) = _docs(COMPILED)
    root = doc["root"]["dag"]["tasks"]
    (condition,) = [t for k, t in root.items() if k.startswith("condition-")]
    assert condition["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--publish_to'] != ''"
    assert "check-gate" in condition["dependentTasks"]
    assert (
        root["check-gate"]["inputs"]["artifacts"]["verdict"]["taskOutputArtifact"]["producerTask"] == "package-bundle"
    )


def test_cuda_is_off_by_default_and_gpu_steps_are_parameterized(gpu_docs: list[dict[str, Any]]) -> None:
    from ortpack.components.container_images import GPU_COMPONENT_IMAGE, GPU_ORT_VERSION

    text = COMPILED.read_text()
    assert "nvidia.com/gpu" not in text and "accelerator" not in text and "for-loop-2" not in text
    doc = gpu_docs[0]
    gpu = {name for name, e in _executors(doc).items() if "accelerator" in _resources(e)}
    # validate and benchmark of the cuda branch run on a GPU; optimize only builds the graph
    assert gpu == {"exec-validate-variant-2", "exec-benchmark-variant-2"}
    for name in gpu:
        accelerator = _resources(_executors(doc)[name])["accelerator"]
        assert accelerator["resourceType"] == "{{$.inputs.parameters['pipelinechannel--gpu_accelerator']}}"
        assert _executors(doc)[name]["container"]["image"] == GPU_COMPONENT_IMAGE
        spec = _platform(gpu_docs)[name]
        assert (
            spec["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"] == "pipelinechannel--gpu_node_selector"
        )
        assert int(spec["activeDeadlineSeconds"]) > 0
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    params = doc["root"]["inputDefinitions"]["parameters"]
    assert params["gpu_node_selector"]["defaultValue"] == {} and params["gpu_accelerator"]["defaultValue"]
    assert params["cuda_precisions"]["defaultValue"] == ["fp16"]
    loop = doc["components"]["comp-for-loop-2"]["dag"]["tasks"]
    assert loop["optimize-variant-2"]["inputs"]["parameters"]["ort_version"]["runtimeValue"]["constant"] == (
        GPU_ORT_VERSION
    )


def test_model_pvc_is_mounted_where_the_model_is_read(gpu_docs: list[dict[str, Any]]) -> None:
    from ortpack.pipelines.package_model import MODEL_MOUNT

    mounted = {
        n for n, s in _platform(gpu_docs).items() for p in s.get("pvcMount", []) if p["mountPath"] == MODEL_MOUNT
    }
    assert mounted == {"exec-resolve-source", "exec-export-model"}
    assert "pvcMount" not in COMPILED.read_text()


def test_compiling_imports_neither_torch_nor_onnxruntime(tmp_path: Path) -> None:
    code = (
        "import sys; from ortpack.pipelines.golden import compile_pipeline; from pathlib import Path;"
        f"compile_pipeline(Path({str(tmp_path / 'p.yaml')!r}));"
        "print(sorted(m for m in ('torch', 'onnxruntime', 'transformers', 'onnx', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_cli_compile(tmp_path: Path) -> None:
    out = tmp_path / "cpu.yaml"
    result = _cli("compile", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == COMPILED.read_bytes()  # the default compile is the committed YAML
    both = _cli("compile", "--targets", "cpu,cuda", "--out", str(out))
    assert both.returncode == 0, both.stderr
    assert "for-loop-2" in out.read_text() and "nvidia.com/gpu" in out.read_text()
