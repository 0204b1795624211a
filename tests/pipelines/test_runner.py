"""`ortpack run --runner docker` without an engine: its refusals, and the staging of local inputs
under the pipeline root (the only directory kfp.local mounts into a step's container). The runs
themselves are in tests/end_to_end/test_containers.py (marker `images`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ortpack.pipelines.local import stage_local_inputs
from tests import ROOT


def test_local_inputs_are_copied_under_the_pipeline_root(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    root = tmp_path / "runs"
    arguments = {"model_uri": str(model), "weights": str(weights), "labels": "", "name": "m"}
    staged = stage_local_inputs(arguments, ("model_uri", "weights", "labels"), root)
    assert arguments["model_uri"] == str(model)  # the caller's mapping is left alone
    for key, source in (("model_uri", model), ("weights", weights)):
        copy = Path(staged[key])
        assert copy.is_relative_to(root.resolve() / "inputs") and copy.name == source.name
    assert (Path(staged["model_uri"]) / "config.json").read_text() == "{}"
    assert staged["labels"] == "" and staged["name"] == "m"
    # a rerun reuses the copy; a changed source gets a new one
    assert stage_local_inputs(arguments, ("model_uri", "weights"), root) == staged
    os.utime(weights, ns=(1, 1))
    assert stage_local_inputs(arguments, ("weights",), root)["weights"] != staged["weights"]


def test_uris_and_bundled_names_are_not_staged(tmp_path: Path) -> None:
    arguments = {"model_uri": "all-MiniLM-L6-v2", "weights": "s3://bucket/w.safetensors"}
    assert stage_local_inputs(arguments, ("model_uri", "weights"), tmp_path) == arguments
    assert not (tmp_path / "inputs").exists()


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_docker_runner_without_an_engine_is_one_line(tmp_path: Path) -> None:
    done = _run(
        "--runner", "docker", "--out", str(tmp_path / "x"), "--pipeline-root", str(tmp_path / "runs"),
        env={"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "no Docker-API engine answers at unix://" in done.stderr, done.stderr


def test_docker_runner_refuses_a_bad_image_reference(tmp_path: Path) -> None:
    done = _run("--runner", "docker", "--component-image", "Not An Image", "--out", str(tmp_path / "x"), env={})
    assert done.returncode == 2 and "bad image reference" in done.stderr, done.stderr
