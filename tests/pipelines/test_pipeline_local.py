"""Real kfp.local runs of the package_model pipeline through `ortpack run` (tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ortpack.kernel.bundle import verify_bundle
from tests.cli import ortpack

pytestmark = pytest.mark.slow


def ortpack_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return ortpack("run", "--pipeline-root", str(cwd / "runs"), *args, cwd=cwd)


def _metrics(run_dir: Path, step: str) -> list[dict[str, float]]:
    found = []
    for path in sorted(run_dir.glob(f"**/{step}/executor_output.json")):
        artifacts = json.loads(path.read_text())["artifacts"]
        found.append(artifacts["metrics"]["artifacts"][0]["metadata"])
    return found


def test_full_local_run(tiny_bert: Path, tmp_path: Path) -> None:
    result = ortpack_run("--model", str(tiny_bert), "--name", "tiny", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    bundle = tmp_path / "dist" / "tiny"
    manifest = verify_bundle(bundle)
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]
    report = (bundle / "report.html").read_text()
    assert report.count("data:image/png;base64,") == 4 and "<script" not in report and "http" not in report
    # what fused, per variant, in the manifest and the report
    assert all(v.optimize.fuser == "ort-bert" and v.optimize.fusions.get("Attention") for v in manifest.variants)
    assert "<td>ort-bert</td>" in report and "Attention " in report
    # the summary table and progress per step
    assert "cpu-int8  pass" in result.stdout and "report: dist/tiny/report.html" in result.stdout
    assert "step 4 of 10: validate-variant" in result.stderr and "step 10 of 10: check-gate" in result.stderr
    assert "validate cpu-fp32: the parity gate" in result.stderr  # each variant's steps say which it is

    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "ortpack-run.log").is_file()
    parity = _metrics(run_dir, "validate-variant")
    assert len(parity) == 2 and all(m["parity.passed"] == 1.0 for m in parity)
    assert all({"parity.min_cosine", "parity.neighbour_agreement", "parity.max_abs_diff"} <= set(m) for m in parity)
    bench = _metrics(run_dir, "benchmark-variant")
    assert all(m["bench.speedup_vs_torch.b1_s16"] > 0 and m["bench.p95_ms.b1_s16"] > 0 for m in bench)
    (optimize,) = _metrics(run_dir, "optimize-variant")[:1]
    assert optimize["optimize.nodes_after"] < optimize["optimize.nodes_before"]
    (package,) = _metrics(run_dir, "package-bundle")
    assert package["variants.passed"] == 2.0 and package["cpu-int8.parity.min_cosine"] > 0.9
    summary = next(run_dir.glob("**/package-bundle/summary")).read_text()
    assert summary.startswith("# tiny: 2 of 2 variants passed")

    # a second run does not clobber the first unless asked
    again = ortpack_run("--model", str(tiny_bert), "--name", "tiny", cwd=tmp_path)
    assert again.returncode == 2 and "output directory exists" in again.stderr and "Traceback" not in again.stderr
    assert len(list((tmp_path / "runs").iterdir())) == 1  # refused before any step ran


def test_a_missed_variant_does_not_stop_the_others(tiny_bert: Path, tmp_path: Path) -> None:
    result = ortpack_run(
        "--model", str(tiny_bert), "--name", "tiny", "--threshold", "int8.min_cosine=0.99999", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = verify_bundle(tmp_path / "dist" / "tiny")
    assert [v.id for v in manifest.variants] == ["cpu-fp32"]
    assert "cpu-int8  MISS" in result.stdout and "missed: cpu-int8: min_cosine" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    verdicts = {m["parity.passed"] for m in _metrics(run_dir, "validate-variant")}
    assert verdicts == {0.0, 1.0}  # the missed variant's numbers are logged too
    assert "min_cosine" in (tmp_path / "dist" / "tiny" / "report.html").read_text()


def test_every_variant_missing_fails_the_run_and_ships_nothing(tiny_bert: Path, tmp_path: Path) -> None:
    result = ortpack_run(
        "--model",
        str(tiny_bert),
        "--name",
        "tiny",
        "--threshold",
        "max_abs_diff=0",
        "--threshold",
        "min_cosine=1",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("ortpack: error:")]
    assert len(errors) == 1 and "no variant passed its parity gate" in errors[0]
    assert "cpu-fp32: max_abs_diff" in errors[0] and "cpu-int8: max_abs_diff" in errors[0]
    assert "Traceback" not in result.stderr.split("ortpack: error:")[-1]
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--model", "/no/such/model"], 2, "model path not found"),
        (["--task", "translation"], 2, "unknown task 'translation'"),
        (["--targets", "tpu"], 2, "unknown target 'tpu'"),
        (["--targets", ","], 2, "no targets given"),
        (["--precisions", "fp8"], 2, "unknown precision 'fp8'"),
        (["--threshold", "min_cosine=7"], 2, "min_cosine must be in [-1, 1]"),
    ],
)
def test_bad_input_fails_before_any_step(args: list[str], code: int, fragment: str, tmp_path: Path) -> None:
    result = ortpack_run(*args, cwd=tmp_path)
    assert result.returncode == code
    errors = [line for line in result.stderr.splitlines() if line.startswith("ortpack: error:")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # no step ran


def test_image_pipeline_run(tmp_path: Path) -> None:
    """One pipeline for both tasks: the task picks the exporter (MobileNetV3-small, local weights)."""
    from tests.models import make_image_weights

    weights = make_image_weights("mobilenet_v3_small", tmp_path / "mnv3s.safetensors")
    result = ortpack_run(
        "--model",
        "mobilenet_v3_small",
        "--task",
        "image-classification",
        "--weights",
        str(weights),
        "--precisions",
        "fp32",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = verify_bundle(tmp_path / "dist" / "mobilenet_v3_small")
    assert manifest.task == "image-classification" and [v.id for v in manifest.variants] == ["cpu-fp32"]
    assert (
        manifest.task_settings.preprocessing is not None
        and manifest.task_settings.labels is not None
        and len(manifest.task_settings.labels) == 1000
    )
    assert "top-1" in result.stdout and "cpu-fp32  pass" in result.stdout


def test_a_decoder_pipeline_run(tmp_path: Path) -> None:
    """A causal LM through the same pipeline: its export, fp32 and int4 (the int4 search in the
    optimize step), their gates and speed, packaged with its tokenizer and chat template. The int4
    gate's top-1 floor is lowered for the tiny random model (its next-token distribution is nearly
    flat: tests/causal_lms.py), not for what the pipeline does."""
    from tests.causal_lms import make_tiny_causal_lm

    checkpoint = make_tiny_causal_lm("qwen2", tmp_path / "tiny-qwen2")
    result = ortpack_run(
        "--model",
        str(checkpoint),
        "--task",
        "text-generation",
        "--precisions",
        "fp32,int4",
        "--threshold",
        "int4.min_top1_agreement=0.3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = verify_bundle(tmp_path / "dist" / "tiny-qwen2")
    assert manifest.task == "text-generation" and [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int4"]
    assert set(manifest.files) >= {"tokenizer.json", "chat_template.jinja", "report.html"}
    int4 = manifest.variant("cpu-int4")
    assert int4.optimize.int4 is not None and int4.optimize.ops_after.get("MatMulNBits", 0) > 0
    assert manifest.variant("cpu-fp32").parity.values["greedy_match"] == 1.0
    assert "greedy" in result.stdout and "cpu-int4  pass" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    bench = _metrics(run_dir, "benchmark-variant")
    assert all(m["bench.p50_ms.decode_b1_p128"] > 0 for m in bench)
    report = (tmp_path / "dist" / "tiny-qwen2" / "report.html").read_text()
    assert "decode tokens/s, 8 sequences" in report and "int4 recipe search" in report


def test_image_run_checks_its_files_first(tmp_path: Path) -> None:
    result = ortpack_run(
        "--model",
        "mobilenet_v3_small",
        "--task",
        "image-classification",
        "--weights",
        str(tmp_path / "missing.safetensors"),
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "weights file not found" in result.stderr
    unknown = ortpack_run("--model", "mobilenetv2", "--task", "image-classification", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "unknown image model 'mobilenetv2'; did you mean 'mobilenet_v2'?: give a torchvision" in unknown.stderr
    assert not (tmp_path / "runs").exists()


def test_checkpoint_from_s3_signed_and_published(tiny_bert: Path, tmp_path: Path) -> None:
    """The cluster flow on this machine: the model from an s3:// prefix (moto's S3 server), the
    bundle signed with --sign-key, then published as a tar to S3 by the publish step."""
    import os

    import boto3
    from moto.server import ThreadedMotoServer

    from ortpack.kernel.signing import verify_signature
    from tests.signed import make_key_pair

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        aws = {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        s3 = boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        s3.create_bucket(Bucket="models")
        s3.create_bucket(Bucket="published")
        for path in tiny_bert.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "models", f"team/tiny-bert/{path.relative_to(tiny_bert).as_posix()}")
        private, public = make_key_pair(tmp_path)
        args = ["--model", "s3://models/team/tiny-bert/", "--precisions", "fp32", "--version", "3"]
        args += ["--sign-key", str(private), "--publish-to", "s3://published/bundles/"]
        result = subprocess.run(
            [sys.executable, "-m", "ortpack.pipelines.cli", "run", "--pipeline-root", str(tmp_path / "runs"), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=900,
            env={**os.environ, **aws},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        bundle = tmp_path / "dist" / "tiny-bert"
        manifest = verify_bundle(bundle)
        assert manifest.version == "3" and manifest.source.id == "s3://models/team/tiny-bert/"
        from ortpack.components.core.sources import tree_digest

        assert manifest.source.revision == tree_digest(tiny_bert)  # the content, not the name
        assert verify_signature(bundle, public).files
        assert "published: s3://published/bundles/tiny-bert-3.tar" in result.stdout
        head = s3.head_object(Bucket="published", Key="bundles/tiny-bert-3.tar")
        assert len(head["Metadata"]["sha256"]) == 64
        (run_dir,) = (tmp_path / "runs").iterdir()
        verdict = json.loads(next(run_dir.glob("**/package-bundle/verdict/verdict.json")).read_text())
        assert verdict["passed"] and verdict["signed"] and verdict["version"] == "3"
    finally:
        server.stop()


def test_a_failed_gate_leaves_the_verdict_report_and_metrics(tiny_bert: Path, tmp_path: Path) -> None:
    """The package step succeeds even when nothing passed (its outputs survive on a backend); the
    gate step fails the run, and `ortpack run` reads the verdict, not a message."""
    result = ortpack_run(
        "--model", str(tiny_bert), "--precisions", "fp32", "--threshold", "max_abs_diff=0", cwd=tmp_path
    )
    assert result.returncode == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    verdict = json.loads(next(run_dir.glob("**/package-bundle/verdict/verdict.json")).read_text())
    assert verdict["passed"] is False and verdict["variants"]["cpu-fp32"][0].startswith("max_abs_diff")
    assert next(run_dir.glob("**/package-bundle/report")).is_file()
    (package,) = _metrics(run_dir, "package-bundle")
    assert package["variants.passed"] == 0.0
    assert ": check-gate" in result.stderr  # the progress line of the step that failed the run


def test_a_refused_export_runs_once_and_ends_the_run(tmp_path: Path) -> None:
    """A refusal (here: a directory that is no checkpoint) cannot change on retry: the export
    step runs once, and the run ends with its reason (no back-off between tries)."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    result = ortpack_run("--model", str(empty), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("ortpack: error: ")
    (run_dir,) = (tmp_path / "runs").iterdir()
    log = (run_dir / "ortpack-run.log").read_text()
    assert log.count("Executing task 'export-model'") == 1
    assert "optimize-variant" not in log
