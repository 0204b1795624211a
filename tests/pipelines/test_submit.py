"""`ortpack submit` against a local HTTP endpoint speaking the KFP v2beta1 routes kfp.Client calls:
healthz, experiments, pipelines (upload, upload_version, versions), runs (create, get, terminate);
the run's states are scripted. The artifact store behind `--wait` is moto's S3 server."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import ortpack
from tests.kfp_api import SUCCEEDING, FakeKFP, submit, task_state


def _posts() -> list[dict[str, Any]]:
    return [r for r in FakeKFP.requests if r["method"] == "POST"]


def test_submit_uploads_what_compile_writes_and_runs_that_version(fake_kfp: str, tmp_path: Path) -> None:
    graph = ["--targets", "cpu,cuda", "--component-image", "example.org/ortpack-component:7"]
    result = submit(
        "--host",
        fake_kfp,
        *graph,
        "--precisions",
        "fp32,int8,fp16",
        "--run-name",
        "nightly",
        "--experiment",
        "embeddings",
        "--threshold",
        "int8.min_cosine=0.9",
        "--service-account",
        "pipeline-runner",
        "--pipeline-root",
        "s3://artifacts/ortpack",
        "--model",
        "s3://models/ckpt/",
        "--secret",
        "team-credentials",
        "--sign",
        env={"KFP_TOKEN": "s3cret"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("submitted run run-42 (experiment exp-1, pipeline version v-1)")
    compiled = tmp_path / "compiled.yaml"
    assert ortpack("compile", *graph, "--out", str(compiled)).returncode == 0
    assert FakeKFP.uploads == [compiled.read_bytes()]  # exactly what `compile` writes
    assert [p["path"].split("?")[0] for p in _posts()] == [
        "/apis/v2beta1/pipelines/upload",
        "/apis/v2beta1/experiments",
        "/apis/v2beta1/runs",
    ]
    run = _posts()[-1]["body"]
    assert run["display_name"] == "nightly" and run["experiment_id"] == "exp-1"
    assert run["pipeline_version_reference"] == {"pipeline_id": "p-1", "pipeline_version_id": "v-1"}
    assert "pipeline_spec" not in run or run["pipeline_spec"] is None  # the run is of the uploaded version
    assert run["service_account"] == "pipeline-runner"
    assert run["runtime_config"]["pipeline_root"] == "s3://artifacts/ortpack"
    params = run["runtime_config"]["parameters"]
    assert params["cpu_precisions"] == ["fp32", "int8"] and params["cuda_precisions"] == ["fp32", "fp16"]
    assert params["model_uri"] == "s3://models/ckpt/" and params["name"] == "ckpt"
    assert params["thresholds"] == {"int8": {"min_cosine": 0.9}}
    assert params["credentials_secret"] == "team-credentials"
    assert params["sign_key"] == "/var/run/secrets/ortpack/signing/key.pem"
    assert params["version"] and params["version"] != "1"  # unique per run unless given
    assert all(r["auth"] == "Bearer s3cret" for r in FakeKFP.requests)


def test_the_same_yaml_is_one_version_and_a_changed_yaml_another(fake_kfp: str) -> None:
    assert submit("--host", fake_kfp).returncode == 0
    assert submit("--host", fake_kfp, "--version", "2").returncode == 0  # same YAML, other parameters
    assert submit("--host", fake_kfp, "--no-cache").returncode == 0  # another YAML
    paths = [p["path"].split("?")[0] for p in _posts() if "pipelines" in p["path"]]
    assert paths == [
        "/apis/v2beta1/pipelines/upload",
        "/apis/v2beta1/pipelines/upload_version",
        "/apis/v2beta1/pipelines/upload_version",
    ]
    first, second, third = (
        r["body"]["pipeline_version_reference"] for r in _posts() if r["path"] == "/apis/v2beta1/runs"
    )
    assert first["pipeline_version_id"] != second["pipeline_version_id"] == "v-2"  # named by the YAML's hash
    assert third["pipeline_version_id"] == "v-3"
    assert b"enableCache: true" not in FakeKFP.uploads[-1] and b"enableCache: true" in FakeKFP.uploads[0]
    runs = [r["body"]["runtime_config"]["parameters"]["version"] for r in _posts() if r["path"] == "/apis/v2beta1/runs"]
    assert runs[1] == "2" and len(set(runs)) == 3


def test_params_file(fake_kfp: str, tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"export_memory": "16Gi", "thresholds": {"*": {"max_abs_diff": 1e-3}}}))
    ok = submit("--host", fake_kfp, "--params", str(params))
    assert ok.returncode == 0, ok.stderr
    sent = _posts()[-1]["body"]["runtime_config"]["parameters"]
    assert sent["export_memory"] == "16Gi" and sent["thresholds"] == {"*": {"max_abs_diff": 0.001}}
    params.write_text(yaml.safe_dump({"gpu_node_selector": {"a": "b"}}))  # a cpu-only pipeline has no GPU parameters
    bad = submit("--host", fake_kfp, "--params", str(params))
    assert bad.returncode == 2 and "unknown pipeline parameter 'gpu_node_selector'" in bad.stderr
    params.write_text(yaml.safe_dump({"thresholds": {"*": {"min_cosine": 5}}}))
    worse = submit("--host", fake_kfp, "--params", str(params))
    assert worse.returncode == 2 and "min_cosine must be in [-1, 1]" in worse.stderr


def test_wait_follows_the_run_and_prints_the_bundle_uri(fake_kfp: str, moto_endpoint: str) -> None:
    import boto3

    aws = {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")  # fmt: skip
    s3.create_bucket(Bucket="mlpipeline")
    key = "v2/artifacts/package-model/run-42/package-bundle/3f1c/bundle"
    s3.put_object(Bucket="mlpipeline", Key=f"{key}/manifest.json", Body=b'{"name": "x"}')
    s3.put_object(Bucket="mlpipeline", Key="v2/artifacts/package-model/run-7/package-bundle/aa/bundle/manifest.json")
    result = submit(
        "--host", fake_kfp, "--wait", "--poll", "0.01", "--publish-to", "s3://published/bundles/", "--version", "9",
        env=aws,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    digest = hashlib.sha256(b'{"name": "x"}').hexdigest()
    assert lines[1] == f"bundle: minio://mlpipeline/{key} (manifest sha256 {digest})"
    assert lines[2] == "published: s3://published/bundles/all-MiniLM-L6-v2-9.tar"
    assert lines[3] == "run run-42 succeeded: version 9"
    # progress per step on stderr, once per state change, drivers left out
    progress = [line.split("]", 1)[1].strip() for line in result.stderr.splitlines() if ": " in line and "]" in line]
    assert progress == [
        "export: running",
        "export: succeeded",
        "package: running",
        "package: succeeded",
        "gate: succeeded",
    ]


def test_wait_without_store_access_prints_the_run_folder(fake_kfp: str) -> None:
    result = submit(
        "--host", fake_kfp, "--wait", "--poll", "0.01", "--pipeline-root", "minio://mlpipeline/v2/artifacts"
    )
    assert result.returncode == 0, result.stderr
    assert "bundle: minio://mlpipeline/v2/artifacts/package-model/run-42/package-bundle/ (cannot list" in result.stdout


def test_a_failed_run_exits_1_with_its_error(fake_kfp: str) -> None:
    FakeKFP.script = [*SUCCEEDING[:2], ("FAILED", [task_state("gate", "FAILED")])]
    result = submit("--host", fake_kfp, "--wait", "--poll", "0.01")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ortpack: error: run run-42 failed: gate: no variant passed its parity gate"
    )
    assert "bundle:" not in result.stdout


def test_timeout_terminates_the_run(fake_kfp: str) -> None:
    FakeKFP.script = [("RUNNING", [task_state("export", "RUNNING")])]
    result = submit("--host", fake_kfp, "--wait", "--poll", "0.05", "--timeout", "0.2")
    assert result.returncode == 1
    assert "run run-42 timed_out: terminated after 0.2 s" in result.stderr
    assert any(p["path"] == "/apis/v2beta1/runs/run-42:terminate" for p in _posts())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_host_is_one_line() -> None:
    result = submit("--host", f"http://127.0.0.1:{_free_port()}")
    assert result.returncode == 3
    assert result.stderr.strip().startswith("ortpack: error: cannot reach Kubeflow Pipelines at http://127.0.0.1:")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--precisions", "fp8"], "unknown precision 'fp8'"),
        (["--model", "hf://org/name"], "needs @REVISION"),
        (["--publish-to", "ftp://x/y"], "--publish-to takes oci://"),
        (["--publish-to", "oci://registry.example.com/b", "--version", "1+x"], "bad OCI reference"),
        (["--secret", ""], "credentials_secret name is empty"),
    ],
)
def test_bad_options_fail_before_contacting_the_host(fake_kfp: str, args: list[str], fragment: str) -> None:
    result = submit("--host", fake_kfp, *args)
    assert result.returncode == 2 and fragment in result.stderr, result.stderr
    assert FakeKFP.requests == []
