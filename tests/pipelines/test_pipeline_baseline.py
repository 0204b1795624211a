"""The pipeline's comparison with a baseline bundle (`baseline_bundle`, `require_compatible`,
`compatibility_budget`; `ortpack run/submit --baseline-bundle`): the package step compares the
bundle it builds with the one an index was built with, as `ortpack bundle diff` does, records the
verdict in its metrics, verdict.json and the report inside the bundle, and with
`require_compatible` ships nothing unless the new bundle is a drop-in.

The new bundle is the session's tiny BERT (`tiny_export`, `tiny_variants`); baselines: the same
build (`tiny_bundle`, a drop-in), a checkpoint with other random weights (a re-index), and a tiny
text classifier (not comparable)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest

from ortpack.components.core.build import StepOutput, run_gate_step, run_package_step
from ortpack.components.core.errors import InvalidSpecError, NoVariantPassedError
from ortpack.components.core.package import Verdict
from ortpack.kernel.bundle import verify_bundle
from tests.cli import error_line, ortpack
from tests.kfp_api import FakeKFP, submit

pytestmark = pytest.mark.slow  # runs the pipeline's package step on built bundles

SECTION = "Compatibility with the baseline"


@pytest.fixture(scope="module")
def reseeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-bert bundle (fp32) of another random checkpoint: the same shape, another space."""
    from tests.models import build_tiny_bundle, make_tiny_bert

    root = tmp_path_factory.mktemp("reseeded")
    return build_tiny_bundle(make_tiny_bert(root / "model", seed=1), root / "tiny-bert", ("fp32",))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny text classifier: its export, its cpu-fp32 variant, and their bundle."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.package import package_dirs
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for
    from tests.models import make_tiny_classifier

    root = tmp_path_factory.mktemp("classifier")
    checkpoint = make_tiny_classifier(root / "tiny-sentiment")
    export = root / "export"
    export_model(ExportSpec(source=str(checkpoint), task="text-classification", name="tiny-sentiment"), export)
    variant = root / "cpu-fp32"
    optimize_model(export, VariantSpec(target="cpu", precision="fp32"), variant)
    validate_variant(variant, export, thresholds_for("text-classification", "fp32"))
    package_dirs(export, [variant], root / "bundle")
    return {"export": export, "variant": variant, "bundle": root / "bundle"}


def package(export: Path, variants: list[Path], out: Path, **options: Any) -> StepOutput:
    """The package step, its outputs under `out` as KFP would lay them out."""
    out.mkdir(parents=True, exist_ok=True)
    return run_package_step(
        export,
        variants,
        bundle_dir=out / "bundle",
        report_html=out / "report.html",
        summary_md=out / "summary.md",
        verdict_dir=out / "verdict",
        version="7",
        run_id="run-1",
        **options,
    )


def new_bundle(tiny_export: Path, tiny_variants: dict[str, Path], out: Path, **options: Any) -> StepOutput:
    return package(tiny_export, list(tiny_variants.values()), out, **options)


# ---------------------------------------------------------------------------- the package step


def test_the_same_build_as_baseline_is_a_drop_in_recorded_everywhere(
    tiny_export: Path, tiny_variants: dict[str, Path], tiny_bundle: Path, tmp_path: Path
) -> None:
    out = new_bundle(tiny_export, tiny_variants, tmp_path, baseline_bundle=str(tiny_bundle), require_compatible=True)
    assert out.passed and out.metadata["compatibility"] == "drop-in"
    m = out.metrics
    assert (m["compat.drop_in"], m["compat.verdict_code"], m["compat.required"], m["compat.budget"]) == (1, 0, 1, 0.95)
    # the same checkpoint: the same spaces, so the numbers are exact
    assert m["compat.recall_ratio"] == m["compat.neighbour_agreement"] == 1.0 and m["compat.min_cosine"] > 0.9999
    assert m["compat.cpu-int8.cpu-int8.recall_ratio"] == m["compat.cpu-fp32.cpu-fp32.recall_ratio"] == 1.0
    assert all(isinstance(v, float) for v in m.values())  # KFP metrics are numbers only

    verdict = Verdict.load(tmp_path / "verdict")
    assert verdict.passed and verdict.reason == "" and verdict.compatibility is not None
    compat = verdict.compatibility
    assert (compat["verdict"], compat["exit_code"], compat["required"]) == ("drop-in", 0, True)
    assert compat["baseline"] == str(tiny_bundle) and compat["new"]["uri"] == "this build"
    assert [(p["old"], p["new"], p["same_space"]) for p in compat["pairs"]] == [
        ("cpu-fp32", "cpu-fp32", True),
        ("cpu-int8", "cpu-int8", True),
    ]
    assert compat["summary"].startswith(f"drop-in against the baseline {tiny_bundle}: cpu-")
    assert run_gate_step(tmp_path / "verdict") == "7"

    # the report inside the bundle carries the section (and is the checksummed one)
    manifest = verify_bundle(tmp_path / "bundle")
    assert "report.html" in manifest.files and manifest.version == "7"
    shipped = (tmp_path / "bundle" / "report.html").read_text()
    assert shipped == (tmp_path / "report.html").read_text()
    assert f"<h2 id='compatibility'>{SECTION}</h2>" in shipped and "Nothing ships" not in shipped
    assert "can search an index built with the baseline" in shipped
    assert "cpu-int8 -&gt; cpu-int8  same" in shipped  # bundle diff's table
    assert f"**{SECTION}:** drop-in against the baseline" in (tmp_path / "summary.md").read_text()


def test_a_required_drop_in_that_is_not_one_ships_nothing(
    tiny_export: Path, tiny_variants: dict[str, Path], reseeded: Path, tmp_path: Path
) -> None:
    out = new_bundle(tiny_export, tiny_variants, tmp_path, baseline_bundle=str(reseeded), require_compatible=True)
    assert not out.passed and not (tmp_path / "bundle").exists()
    assert out.metrics["compat.drop_in"] == 0.0 and out.metrics["compat.verdict_code"] == 3.0
    assert out.metrics["compat.recall_ratio"] < 0.95 and out.metrics["variants.passed"] == 2.0

    verdict = Verdict.load(tmp_path / "verdict")
    assert not verdict.passed and "\n" not in verdict.reason
    ratio = out.metrics["compat.recall_ratio"]
    assert verdict.reason == (
        f"re-index against the baseline {reseeded}: cpu-fp32 -> cpu-fp32: new queries find {ratio:.1%} of the old "
        "bundle's own top-10 documents in the old index (below the 0.95 budget); nothing ships (require_compatible)"
    )
    assert verdict.compatibility is not None and verdict.compatibility["verdict"] == "re-index"
    with pytest.raises(NoVariantPassedError) as failed:
        run_gate_step(tmp_path / "verdict")
    assert str(failed.value) == verdict.reason
    # the step's report (not shipped) says why
    report = (tmp_path / "report.html").read_text()
    assert f"<p class='miss'>{html.escape(verdict.reason)}.</p>" in report  # at the top
    assert SECTION in report and "Nothing ships: the pipeline required a drop-in" in report


def test_without_require_compatible_the_verdict_is_only_recorded(
    tiny_export: Path, tiny_variants: dict[str, Path], reseeded: Path, tmp_path: Path
) -> None:
    out = new_bundle(tiny_export, tiny_variants, tmp_path, baseline_bundle=str(reseeded))
    assert out.passed and out.metadata["compatibility"] == "re-index"
    assert out.metrics["compat.verdict_code"] == 3.0 and out.metrics["compat.required"] == 0.0
    verdict = Verdict.load(tmp_path / "verdict")
    assert verdict.passed and verdict.compatibility is not None and verdict.compatibility["verdict"] == "re-index"
    verify_bundle(tmp_path / "bundle")
    shipped = (tmp_path / "bundle" / "report.html").read_text()
    assert "Re-index before serving this bundle" in shipped and "Nothing ships" not in shipped
    run_gate_step(tmp_path / "verdict")


def test_no_baseline_no_comparison(tiny_export: Path, tiny_variants: dict[str, Path], tmp_path: Path) -> None:
    out = new_bundle(tiny_export, tiny_variants, tmp_path)
    assert out.passed and not any(k.startswith("compat.") for k in out.metrics)
    assert Verdict.load(tmp_path / "verdict").compatibility is None
    assert SECTION not in (tmp_path / "bundle" / "report.html").read_text()
    with pytest.raises(InvalidSpecError, match="^require_compatible needs a baseline_bundle"):
        new_bundle(tiny_export, tiny_variants, tmp_path / "again", require_compatible=True)


@pytest.mark.parametrize(
    ("baseline", "fragment"),
    [
        ("{tmp}/none", "cannot compare with the baseline bundle: bundle not found: {tmp}/none"),
        ("{classifier}", "compares embedding bundles"),
        ("{classifier}", "; {classifier} is a text-classification bundle"),
        ("ftp://example.com/b.tar", "unsupported bundle URI scheme 'ftp'"),
    ],
    ids=["missing", "classifier", "classifier-task", "unknown-scheme"],
)
def test_a_baseline_that_cannot_be_compared_fails_in_one_line(
    baseline: str,
    fragment: str,
    tiny_export: Path,
    tiny_variants: dict[str, Path],
    classifier: dict[str, Path],
    tmp_path: Path,
) -> None:
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{classifier}", str(classifier["bundle"]))

    with pytest.raises(InvalidSpecError) as refused:
        new_bundle(tiny_export, tiny_variants, tmp_path / "out", baseline_bundle=fill(baseline))
    assert fill(fragment) in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "out" / "bundle").exists() and not (tmp_path / "out" / "verdict").exists()


def test_a_non_embedding_build_with_a_baseline_is_refused_before_any_work(
    classifier: dict[str, Path], tiny_bundle: Path, tmp_path: Path
) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        package(classifier["export"], [classifier["variant"]], tmp_path, baseline_bundle=str(tiny_bundle))
    message = str(refused.value)  # the tasks with an embedding space are listed between the two
    assert message.startswith("a baseline bundle is compared as `ortpack bundle diff` does, for embedding bundles only")
    assert message.endswith("; this run packages a text-classification model")
    assert list(tmp_path.iterdir()) == []  # no report, no verdict, no bundle


def test_the_pipeline_passes_the_parameters_to_the_package_step() -> None:
    from ortpack.components.core.compat import DEFAULT_BUDGET
    from ortpack.pipelines.golden import COMPILED, build_pipeline

    inputs = build_pipeline().component_spec.inputs
    assert inputs["baseline_bundle"].default == "" and inputs["require_compatible"].default is False
    assert inputs["compatibility_budget"].default == DEFAULT_BUDGET
    text = COMPILED.read_text()
    for name in ("baseline_bundle", "require_compatible", "compatibility_budget"):
        assert f"{name}:\n              componentInputParameter: {name}" in text  # wired into package-bundle


# ---------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--require-compatible"], "--require-compatible applies only with --baseline-bundle"),
        (["--baseline-bundle", "{tmp}/none"], "--baseline-bundle: no bundle at {tmp}/none"),
        (["--baseline-bundle", "{classifier}"], "is a text-classification bundle; only embedding bundles"),
        (["--baseline-bundle", "{bundle}", "--compatibility-budget", "1.5"], "must be in (0, 1], got 1.5"),
        (["--baseline-bundle", "ftp://x/b.tar"], "--baseline-bundle takes a bundle directory or URI"),
        (
            ["--baseline-bundle", "{bundle}", "--task", "image-classification", "--model", "mobilenet_v3_small"],
            "as `ortpack bundle diff` does; this run packages a image-classification model",
        ),
    ],
    ids=["require-alone", "missing", "classifier", "budget", "unknown-scheme", "image-task"],
)
def test_run_refuses_a_baseline_it_cannot_compare_before_any_step(
    args: list[str], fragment: str, tiny_bundle: Path, classifier: dict[str, Path], tmp_path: Path
) -> None:
    def fill(text: str) -> str:
        filled = text.replace("{tmp}", str(tmp_path)).replace("{bundle}", str(tiny_bundle))
        return filled.replace("{classifier}", str(classifier["bundle"]))

    result = ortpack("run", "--pipeline-root", str(tmp_path / "runs"), *map(fill, args), cwd=tmp_path)
    assert result.returncode == 2
    assert fill(fragment) in error_line(result)
    assert not (tmp_path / "runs").exists()


def test_run_prints_the_compatibility_verdict(
    tiny_export: Path, tiny_variants: dict[str, Path], tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The summary line `ortpack run` prints from a run's verdict (here one the package step wrote
    where kfp.local puts it)."""
    from ortpack.pipelines.cli import _print_compatibility

    run = tmp_path / "run"
    new_bundle(tiny_export, tiny_variants, run / "package-bundle", baseline_bundle=str(tiny_bundle))
    _print_compatibility(run)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"compatibility: drop-in against the baseline {tiny_bundle}: ")


def test_submit_passes_the_baseline_options(fake_kfp: str) -> None:
    def sent() -> tuple[Any, ...]:
        params = [r for r in FakeKFP.requests if r["method"] == "POST"][-1]["body"]["runtime_config"]["parameters"]
        return params["baseline_bundle"], params["require_compatible"], params["compatibility_budget"]

    pinned = "oci://registry.example.com/ml/encoder@sha256:" + "ab" * 32
    options = ["--baseline-bundle", pinned, "--require-compatible", "--compatibility-budget", "0.9"]
    result = submit("--host", fake_kfp, *options)
    assert result.returncode == 0, result.stderr
    assert sent() == (pinned, True, 0.9)
    unset = submit("--host", fake_kfp)
    assert unset.returncode == 0, unset.stderr
    assert sent() == ("", False, 0.95)


# ---------------------------------------------------------------------------- a real kfp.local run


@pytest.mark.slow
def test_a_required_compatibility_miss_fails_the_run_and_ships_nothing(
    tiny_bert: Path, reseeded: Path, tmp_path: Path
) -> None:
    """`ortpack run --baseline-bundle ... --require-compatible` on kfp.local: every variant passes its
    gate, the package step finds a re-index, the gate step fails the run with that reason, and
    neither the copy to dist/ nor the publish step happens."""
    args = ["--model", str(tiny_bert), "--name", "tiny", "--precisions", "fp32", "--version", "2"]
    args += ["--baseline-bundle", str(reseeded), "--require-compatible", "--publish-to", "s3://published/bundles/"]
    result = ortpack("run", "--pipeline-root", str(tmp_path / "runs"), *args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    line = error_line(result)
    assert line.startswith(f"ortpack: error: re-index against the baseline {reseeded}: cpu-fp32 -> cpu-fp32: ")
    assert line.endswith("; nothing ships (require_compatible)")
    assert ": check-gate" in result.stderr and "publish" not in result.stderr.split(": check-gate")[-1]
    assert not (tmp_path / "dist").exists() and "bundle:" not in result.stdout

    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not list(run_dir.glob("**/publish-bundle"))
    assert not list(run_dir.glob("**/package-bundle/bundle"))
    verdict = json.loads(next(run_dir.glob("**/package-bundle/verdict/verdict.json")).read_text())
    assert verdict["passed"] is False and verdict["variants"] == {"cpu-fp32": []}
    assert verdict["compatibility"]["verdict"] == "re-index" and verdict["compatibility"]["required"] is True
    (executor,) = run_dir.glob("**/package-bundle/executor_output.json")
    metrics = json.loads(executor.read_text())["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["compat.drop_in"] == 0.0 and metrics["compat.verdict_code"] == 3.0
    assert SECTION in next(run_dir.glob("**/package-bundle/report")).read_text()
