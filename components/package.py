"""KFP components: the bundle of every variant that passed and the report; the gate that fails
the run when none passed; publishing the bundle."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from ortpack.components.container_images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def package_bundle(
    exported: Input[Model],
    version: str,
    run_id: str,
    sign_key: str,
    bundle: Output[Model],
    report: Output[HTML],
    summary: Output[Markdown],
    verdict: Output[Dataset],
    metrics: Output[Metrics],
    baseline_bundle: str = "",
    require_compatible: bool = False,
    compatibility_budget: float = 0.95,
    cpu_variants: Input[list[Model]] = None,
    cuda_variants: Input[list[Model]] = None,
) -> str:
    """Write the report, the bundle (model.onnx per passing variant, tokenizer, manifest.json,
    report.html; signed when given a key) and the verdict; with a baseline bundle, compare the new
    bundle with it first (`ortpack bundle diff`) and record the verdict in all of them.

    This step does not fail when nothing ships (no variant passed, or the baseline comparison was
    required and is not a drop-in): a failed step's outputs are not kept on a Kubeflow backend, so
    the verdict, report, summary and metrics are written and the gate step after it fails the run.

    Args:
        exported: The export step's directory.
        version: The bundle version; empty for one unique per run (UTC time and run id).
        run_id: The run's id (the bundle version when none is given).
        sign_key: Path of an EC private key (PEM) to sign the bundle with; empty: unsigned.
        bundle: The bundle directory (absent when no variant passed).
        report: report.html: latency, agreement and size plots, the numbers, the versions.
        summary: A Markdown table of every variant.
        verdict: verdict.json: passed, every variant's misses, the version, manifest sha256.
        metrics: variants.built, variants.passed, bundle.mb, <variant>.<metric> per variant, and
            compat.* with a baseline (drop_in, verdict_code, recall_ratio, min_cosine, ...).
        baseline_bundle: A text-embedding bundle to compare with (a path as the step sees it, or
            any URI the server accepts); empty: no comparison.
        require_compatible: Ship nothing unless the new bundle is a drop-in for the baseline.
        compatibility_budget: The cross-space recall ratio a drop-in must reach.
        cpu_variants: Every cpu branch's measured variant.
        cuda_variants: Every cuda branch's measured variant.

    Returns:
        The bundle artifact's URI.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_package_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    out = run_package_step(
        Path(exported.path),
        [Path(v.path) for v in [*(cpu_variants or []), *(cuda_variants or [])]],
        bundle_dir=Path(bundle.path),
        report_html=Path(report.path),
        summary_md=Path(summary.path),
        verdict_dir=Path(verdict.path),
        version=version,
        run_id=run_id,
        sign_key=sign_key,
        baseline_bundle=baseline_bundle,
        require_compatible=require_compatible,
        compatibility_budget=compatibility_budget,
    )
    for key, value in out.metrics.items():
        metrics.log_metric(key, value)
    bundle.metadata.update(out.metadata)
    verdict.metadata.update({"passed": out.passed})
    print(f"bundle: {bundle.uri}")
    return bundle.uri


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def check_gate(verdict: Input[Dataset]) -> str:
    """Fail the run, with the one-line reason, when the package step's verdict says that nothing
    ships (no variant passed its parity gate, or the required baseline comparison failed).

    Args:
        verdict: The package step's verdict.

    Returns:
        The bundle's version.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_gate_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    return run_gate_step(Path(verdict.path))


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def publish_bundle(bundle: Input[Model], publish_to: str) -> str:
    """Publish the bundle: push it to an OCI registry (oci://HOST/REPO[:TAG], the tag defaulting to
    the version) or upload it as a tar to S3 (s3://BUCKET/PREFIX/ or minio://).

    Args:
        bundle: The package step's bundle.
        publish_to: Where to publish.

    Returns:
        The pinned URI: oci://HOST/REPO@sha256:..., or s3://BUCKET/PREFIX/NAME-VERSION.tar.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_publish_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    pinned = run_publish_step(Path(bundle.path), publish_to)
    print(f"published: {pinned}")
    return pinned
