"""The `ortpack` CLI: bad input gets one line naming the problem and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import assert_one_line_error, ortpack


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "/no/such/model"], "model path not found: /no/such/model"),
        (["--model", "{tmp}"], "not a Hugging Face checkpoint"),
        (["--model", "{tiny}", "--task", "translation"], "unknown task 'translation'"),
        (["--model", "{tiny}", "--targets", "tpu"], "unknown target 'tpu' (known: cpu, cuda)"),
        (["--model", "{tiny}", "--precisions", "fp8"], "unknown precision 'fp8'"),
        (["--model", "{tiny}", "--precisions", "fp16"], "'fp16' is not supported by any of the targets"),
        (["--model", "{tiny}", "--targets", ""], "no targets given"),
        (["--model", "{tiny}", "--threshold", "int8.min_cosine=2"], "min_cosine must be in [-1, 1]"),
        (["--model", "{tiny}", "--name", "../x"], "invalid bundle name"),
        (["--model", "{tiny}", "--int8-recipe", "per-chanel"], "unknown int8 recipe 'per-chanel'"),
        (["--model", "{tiny}", "--int8-recipe", "per-chanel"], "did you mean 'per-channel'?"),
        (["--model", "{tiny}", "--int8-recipe", "s7"], "(known: per-channel, per-channel+int8-embeddings,"),
        (["--model", "{tiny}", "--int8-recipe", "per-tensor", "--precisions", "fp32"], "only when int8 is among"),
    ],
)
def test_build_rejects_bad_options_before_work(args: list[str], fragment: str, tiny_bert: Path, tmp_path: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path)).replace("{tiny}", str(tiny_bert)) for a in args]
    result = ortpack("build", *args, "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_corrupt_weights(tiny_bert: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_bert, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    result = ortpack("export", "--model", str(broken), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, "cannot load weights from")


@pytest.mark.slow
def test_model_that_cannot_export(tmp_path: Path) -> None:
    from tests.models import make_tiny_bert

    t5 = make_tiny_bert(tmp_path / "t5", model_type="t5")
    result = ortpack("export", "--model", str(t5), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, "t5 is an encoder-decoder model")


def test_existing_output_needs_force(tiny_bert: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    result = ortpack("build", "--model", str(tiny_bert), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, "output directory exists")


def test_bundle_verify(tiny_bundle: Path, tmp_path: Path) -> None:
    ok = ortpack("bundle", "verify", str(tiny_bundle))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: tiny-bert 1 (text-embedding), variants cpu-fp32, cpu-int8")
    tampered = tmp_path / "tampered"
    shutil.copytree(tiny_bundle, tampered)
    with open(tampered / "tokenizer.json", "ab") as fh:
        fh.write(b" ")
    assert_one_line_error(ortpack("bundle", "verify", str(tampered)), 2, "size mismatch for tokenizer.json")
    assert_one_line_error(ortpack("bundle", "verify", str(tmp_path / "none")), 2, "bundle directory not found")


def test_validate_exits_1_on_a_miss(tiny_export: Path, tiny_variants: dict[str, Path], tmp_path: Path) -> None:
    # validate rewrites parity.json in the variant directory: work on copies of the shared fixtures
    fp32, int8 = tmp_path / "fp32", tmp_path / "int8"
    shutil.copytree(tiny_variants["cpu-fp32"], fp32)
    shutil.copytree(tiny_variants["cpu-int8"], int8)
    passed = ortpack("validate", "--export", str(tiny_export), "--variant", str(fp32))
    assert passed.returncode == 0, passed.stderr
    assert "neighbour_agreement" in passed.stdout
    missed = ortpack(
        "validate", "--export", str(tiny_export), "--variant", str(int8), "--threshold", "max_abs_diff=1e-9"
    )
    assert_one_line_error(missed, 1, "parity gate missed by cpu-int8: max_abs_diff")


@pytest.mark.slow
def test_single_steps_chain_into_a_bundle(tiny_bert: Path, tmp_path: Path) -> None:
    assert (
        ortpack("export", "--model", str(tiny_bert), "--out", str(tmp_path / "e"), "--max-length", "64").returncode == 0
    )
    step = ortpack(
        "optimize",
        "--export",
        str(tmp_path / "e"),
        "--target",
        "cpu",
        "--precision",
        "fp32",
        "--out",
        str(tmp_path / "v"),
    )
    assert step.returncode == 0, step.stderr
    assert ortpack("validate", "--export", str(tmp_path / "e"), "--variant", str(tmp_path / "v")).returncode == 0
    assert ortpack("benchmark", "--export", str(tmp_path / "e"), "--variant", str(tmp_path / "v")).returncode == 0
    packaged = ortpack(
        "package", "--export", str(tmp_path / "e"), "--variant", str(tmp_path / "v"), "--out", str(tmp_path / "b")
    )
    assert packaged.returncode == 0, packaged.stderr
    assert ortpack("bundle", "verify", str(tmp_path / "b")).returncode == 0


def _walk(parser: argparse.ArgumentParser, path: str = "ortpack") -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _walk(sub, f"{path} {name}")
        else:
            found.append((path, action))
    return found


def test_help_documents_every_option() -> None:
    from ortpack.pipelines.cli import build_parser

    actions = _walk(build_parser())
    assert len({path for path, _ in actions}) >= 8  # every command was walked
    undocumented = [f"{path} {a.option_strings or a.dest}" for path, a in actions if not a.help]
    assert undocumented == []
    result = ortpack("build", "--help")
    assert result.returncode == 0 and "--precisions" in result.stdout and "--threshold" in result.stdout


def test_version_and_one_line_usage_errors() -> None:
    from ortpack import __version__

    version = ortpack("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"ortpack {__version__}"
    for args in (["run", "--bogus"], [], ["compile", "--gpu-timeout", "soon"], ["bundle"]):
        result = ortpack(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("ortpack"), result.stderr
        assert "error:" in result.stderr and "usage:" not in result.stderr


def test_debug_keeps_the_exit_code(tmp_path: Path) -> None:
    result = ortpack("build", "--debug", "--model", "/no/such/model", "--out", str(tmp_path / "out"))
    assert result.returncode == 2  # bad input, as without --debug
    assert "Traceback" in result.stderr and result.stderr.strip().endswith("ortpack: error: model path not found: "
                                                                           "/no/such/model (or use a bundled model: "
                                                                           "all-MiniLM-L6-v2)")  # fmt: skip


def test_threshold_help_lists_every_threshold() -> None:
    from ortpack.kernel.contracts import contract_names, get_contract

    text = "".join(ortpack("validate", "--help").stdout.split())  # argparse wraps at hyphens too
    for task in contract_names():
        assert f"{task}:{''.join(get_contract(task).gates)}" in text


def test_package_writes_the_report(tiny_export: Path, tiny_variants: dict[str, Path], tmp_path: Path) -> None:
    result = ortpack(
        "package",
        "--export",
        str(tiny_export),
        "--variant",
        str(tiny_variants["cpu-fp32"]),
        "--out",
        str(tmp_path / "b"),
    )
    assert result.returncode == 0, result.stderr
    report = tmp_path / "b" / "report.html"
    assert report.is_file() and "data:image/png;base64," in report.read_text()
    assert f"report: {report}" in result.stdout
    assert ortpack("bundle", "verify", str(tmp_path / "b")).returncode == 0  # the report is a listed file


def test_sigterm_cleans_up_like_sigint(tiny_bert: Path, tmp_path: Path) -> None:
    """SIGTERM during `build` unwinds like Ctrl-C: the temporary work directory is removed, one
    line, exit 143 (128 + SIGTERM)."""
    import os
    import signal
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ortpack.pipelines.cli",
            "build",
            "--model",
            str(tiny_bert),
            "--out",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    deadline = time.monotonic() + 120
    while not list(scratch.glob("ortpack-build-*/export/*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(scratch.glob("ortpack-build-*")), "the build never started"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "ortpack: interrupted" and "Traceback" not in stderr
    assert list(scratch.glob("ortpack-build-*")) == []
    assert not (tmp_path / "out").exists()


def test_modelcar_base_needs_modelcar(tiny_bundle: Path) -> None:
    result = ortpack(
        "bundle", "push", "--modelcar-base", "oci://r.example/busybox:1", str(tiny_bundle), "oci://r.example/x:1"
    )
    assert_one_line_error(result, 2, "--modelcar-base applies only with --modelcar")


def test_options_a_task_does_not_read_are_named_in_plain_english(tiny_bert: Path, tmp_path: Path) -> None:
    weights, labels = tmp_path / "w.safetensors", tmp_path / "labels.txt"
    weights.write_bytes(b"")
    labels.write_text("a\n")
    common = ("build", "--model", str(tiny_bert), "--out", str(tmp_path / "out"), "--weights", str(weights))
    one = ortpack(*common)
    assert_one_line_error(one, 2, "--weights does not apply to task 'text-embedding'")
    two = ortpack(*common, "--labels", str(labels))
    assert_one_line_error(two, 2, "--weights and --labels do not apply to task 'text-embedding'")
    assert "do(es)" not in one.stderr + two.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "ALL-minilm-l6-v2"], "model path not found: ALL-minilm-l6-v2 (or use a bundled model: "),
        (["--task", "Text-Embedding"], "unknown task 'Text-Embedding' (known: "),
        (["--task", "embeding"], "unknown task 'embeding' (known: "),
        (["--targets", "CPU"], "unknown target 'CPU' (known: cpu, cuda)"),
        (["--precisions", "INT8"], "unknown precision 'INT8' (known: fp32, fp16, int8, int4)"),
        (["--threshold", "min_cosin=0.9"], "unknown threshold 'min_cosin' (known: "),
    ],
)
def test_a_near_miss_name_gets_a_suggestion(args: list[str], fragment: str, tiny_bert: Path, tmp_path: Path) -> None:
    """Wrong case or a typo in a name from a fixed list: the refusal names the closest known one."""
    suggestions = {"--model": "all-MiniLM-L6-v2", "--task": "text-embedding", "--targets": "cpu"}
    suggestions |= {"--precisions": "int8", "--threshold": "min_cosine"}
    model = [] if "--model" in args else ["--model", str(tiny_bert)]
    result = ortpack("build", *model, *args, "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, fragment)
    assert result.stderr.strip().endswith(f"did you mean {suggestions[args[0]]!r}?"), result.stderr


def test_a_far_miss_gets_no_suggestion(tiny_bert: Path, tmp_path: Path) -> None:
    result = ortpack("build", "--model", str(tiny_bert), "--targets", "tpu", "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, "unknown target 'tpu' (known: cpu, cuda)")
    assert "did you mean" not in result.stderr


def test_a_hub_id_is_refused_with_the_hf_scheme_and_a_local_folder(tmp_path: Path) -> None:
    """No download behind the user's back: the refusal says how to give the model instead."""
    hub_id = "sentence-transformers/all-MiniLM-L6-v2"
    run = ortpack("run", "--model", hub_id, "--out", str(tmp_path / "run"))
    assert_one_line_error(run, 2, f"model path not found: {hub_id}")
    line = run.stderr.strip().splitlines()[-1]
    assert f"--model hf://{hub_id}@main" in line  # run and submit fetch hf:// URIs in their export step
    assert f"hf download {hub_id} --local-dir DIR" in line and "pass --model DIR" in line
    assert "did you mean 'all-MiniLM-L6-v2'?" in line  # the bundled copy of this very model
    build = ortpack("build", "--model", "org/name", "--out", str(tmp_path / "out"))
    assert_one_line_error(build, 2, "'org/name' looks like a Hugging Face Hub id")
    assert "--model hf://org/name@main" in build.stderr and "did you mean" not in build.stderr
    uri = ortpack("build", "--model", "hf://org/name@main", "--out", str(tmp_path / "out"))
    assert_one_line_error(uri, 2, "hf://org/name@main is a model URI: `ortpack build` and `export` read a checkpoint")
    assert "`ortpack run` and `submit` take a URI" in uri.stderr


def test_bundle_commands_take_the_manifest_path(tiny_bundle: Path, tmp_path: Path) -> None:
    manifest = tiny_bundle / "manifest.json"
    verified = ortpack("bundle", "verify", str(manifest))
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("ok: tiny-bert 1 (text-embedding)")
    checked = ortpack("bundle", "check", str(manifest), "--variant", "cpu-fp32")
    assert checked.returncode == 0, checked.stderr
    assert "a server here would serve cpu-fp32" in checked.stdout
    missing = ortpack("bundle", "verify", str(tmp_path / "gone" / "manifest.json"))
    assert_one_line_error(missing, 2, f"bundle directory not found: {tmp_path / 'gone'}")
    other = tmp_path / "bundle.tar"
    other.write_bytes(b"")
    refused = ortpack("bundle", "verify", str(other))
    assert_one_line_error(
        refused, 2, f"{other} is a file: give the bundle directory (the folder holding manifest.json)"
    )


def test_bundle_check_variant_is_explained_and_an_unknown_one_lists_the_bundles(tiny_bundle: Path) -> None:
    help_text = " ".join(ortpack("bundle", "check", "--help").stdout.split())
    assert "--variant ID|auto the variant to replay the probe set through: one of the bundle's variant ids" in help_text
    assert "or auto (the default): the one a server on this machine would pick" in help_text
    unknown = ortpack("bundle", "check", str(tiny_bundle), "--variant", "CPU-INT8")
    assert_one_line_error(
        unknown, 2, "--variant 'CPU-INT8' is not in this bundle: give one of cpu-fp32, cpu-int8, or auto; did you "
        "mean 'cpu-int8'?"
    )  # fmt: skip


def test_bundle_help_lists_every_action() -> None:
    from ortpack.pipelines.cli import build_parser

    bundle = next(a.choices["bundle"] for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = next(a for a in bundle._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(actions) == {"verify", "check", "diff", "sign", "push", "pull"}
    description = ortpack("bundle", "--help").stdout.split("positional arguments:")[0]
    top = next(line for line in ortpack("--help").stdout.splitlines() if line.strip().startswith("bundle "))
    for name in actions:
        assert name in description, name
        assert name in top, name


def test_optimize_step_refuses_a_recipe_for_another_precision_or_task(tiny_export: Path, tmp_path: Path) -> None:
    common = ["optimize", "--export", str(tiny_export), "--target", "cpu", "--out", str(tmp_path / "v")]
    assert_one_line_error(
        ortpack(*common, "--precision", "fp32", "--int8-recipe", "per-tensor"), 2, "applies only to --precision int8"
    )
    assert_one_line_error(
        ortpack(*common, "--precision", "int8", "--int8-recipe", "u8-pointwise"),
        2,
        "unknown int8 recipe 'u8-pointwise' for task 'text-embedding'",
    )
    assert not (tmp_path / "v").exists()


def test_run_refuses_an_unknown_int8_recipe_before_any_step(tiny_bert: Path, tmp_path: Path) -> None:
    result = ortpack("run", "--model", str(tiny_bert), "--int8-recipe", "fastest", "--out", str(tmp_path / "b"))
    assert_one_line_error(result, 2, "unknown int8 recipe 'fastest'")
    assert "step 1" not in result.stdout + result.stderr
