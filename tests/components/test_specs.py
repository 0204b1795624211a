"""Specs fail fast, with messages that name the problem and the allowed values."""

from __future__ import annotations

import pytest

from ortpack.components.core.errors import InvalidSpecError
from ortpack.components.core.specs import (
    BuildSpec,
    ExportSpec,
    ParityThresholds,
    VariantSpec,
    parse_threshold_overrides,
    variant_grid,
)
from ortpack.components.core.tasks import check_build_spec, check_export_spec, thresholds_for
from ortpack.kernel.contracts.text_embedding import CONTRACT


def test_variant_grid_keeps_only_supported_pairs() -> None:
    grid = variant_grid(["cpu", "cuda"], ["fp32", "int8", "fp16"])
    assert [v.id for v in grid] == ["cpu-fp32", "cpu-int8", "cuda-fp32", "cuda-fp16"]


@pytest.mark.parametrize(
    ("targets", "precisions", "message"),
    [
        ([], ["fp32"], "no targets"),
        (["tpu"], ["fp32"], "unknown target 'tpu' (known: cpu, cuda)"),
        (["cpu"], ["fp8"], "unknown precision 'fp8'"),
        (["cpu"], ["fp16"], "'fp16' is not supported by any of the targets"),
        (["cpu"], [], "no precisions"),
    ],
)
def test_variant_grid_rejects(targets: list[str], precisions: list[str], message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        variant_grid(targets, precisions)


def test_variant_spec_rejects_precision_the_target_lacks() -> None:
    with pytest.raises(InvalidSpecError, match="not supported on target 'cpu'"):
        VariantSpec(target="cpu", precision="fp16")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "translation"}, "unknown task 'translation'"),
        ({"name": "../evil"}, "invalid bundle name"),
        ({"options": {"max_length": 1}}, "max_length: Input should be greater than 1"),
        ({"options": {"labels": "x", "weights": "w"}}, "--labels and --weights do not apply to task 'text-embedding'"),
        ({"task": "image-classification", "options": {"resize_size": 4}}, "resize_size: Input should be greater than"),
        ({"task": "image-classification", "options": {"mean": [1, 2]}}, "mean"),
        ({"opset": 9}, "opset must be in"),
    ],
)
def test_export_spec_rejects(kwargs: dict[str, object], message: str) -> None:
    """Its own values and the task's options (against the task's contract) at construction."""
    fields = {"source": "x", "task": "text-embedding", "name": "ok"} | kwargs
    with pytest.raises(InvalidSpecError, match=message):
        check_export_spec(ExportSpec(**fields))  # type: ignore[arg-type]


def test_thresholds_overrides_apply_per_precision_and_globally() -> None:
    overrides = parse_threshold_overrides(["int8.min_cosine=0.5", "max_abs_diff=0.25"])
    int8 = thresholds_for("text-embedding", "int8", overrides).as_dict()
    fp32 = thresholds_for("text-embedding", "fp32", overrides).as_dict()
    assert int8["min_cosine"] == 0.5 and int8["max_abs_diff"] == 0.25
    assert fp32["max_abs_diff"] == 0.25
    assert fp32["min_cosine"] == thresholds_for("text-embedding", "fp32").as_dict()["min_cosine"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("min_cosine", "must look like"),
        ("int8.min_cosine=abc", "is not a number"),
        ("int9.min_cosine=0.5", "unknown precision 'int9'"),
    ],
)
def test_threshold_override_syntax_errors(item: str, message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message):
        parse_threshold_overrides([item])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"*": {"min_cosine": 1.5}}, r"min_cosine must be in \[-1, 1\]"),
        ({"*": {"max_abs_diff": -1.0}}, "max_abs_diff must be >= 0"),
        ({"int8": {"min_cosnie": 0.5}}, "unknown threshold 'min_cosnie'"),
    ],
)
def test_build_spec_checks_overrides_before_any_work(overrides: dict[str, dict[str, float]], message: str) -> None:
    with pytest.raises(InvalidSpecError, match=message):
        check_build_spec(
            BuildSpec(
                export=ExportSpec(source="x", task="text-embedding", name="ok"),
                variants=(VariantSpec(target="cpu", precision="int8"),),
                threshold_overrides=overrides,
            )
        )


def test_threshold_rejects_nan() -> None:
    with pytest.raises(InvalidSpecError, match="must be a number"):
        ParityThresholds.of(CONTRACT.gates, max_abs_diff=float("nan"))


def test_pipeline_parameters_carry_the_checked_spec_unchanged() -> None:
    """The CLI checks one BuildSpec and passes it to the pipeline as parameters; the export step
    reads the same export spec back, and each target's precisions and the gates travel as given."""
    from ortpack.components.core.build import export_spec_from_parameters, pipeline_parameters

    spec = BuildSpec(
        export=ExportSpec(source="/models/minilm", task="text-embedding", name="minilm", options={"max_length": 64}),
        variants=tuple(variant_grid(["cpu", "cuda"], ["fp32", "int8"])),
        threshold_overrides={"int8": {"min_cosine": 0.98}},
        version="7",
        int8_recipe="dynamic-per-channel",
    )
    params = pipeline_parameters(spec)
    assert export_spec_from_parameters(params, source="/models/minilm", default_name="other") == spec.export
    assert params["task_options"] == {"max_length": 64}
    assert params["cpu_precisions"] == ["fp32", "int8"]
    assert params["cuda_precisions"] == [v.precision for v in spec.variants if v.target == "cuda"]
    assert params["thresholds"] == {"int8": {"min_cosine": 0.98}}
    assert (params["version"], params["int8_recipe"]) == ("7", "dynamic-per-channel")
