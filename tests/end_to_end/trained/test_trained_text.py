"""Text classification and reranking on a trained trunk (slow): all-MiniLM-L6-v2's encoder with a
seeded random head (no trained classifier or cross-encoder ships on the package index), so the
int8 error the gate judges comes from real weights; both variants pass and serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import make_trunk_classifier, minilm_dir

pytestmark = pytest.mark.slow


def _build(checkpoint: Path, out: Path) -> Path:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid

    spec = BuildSpec(
        export=ExportSpec(source=str(checkpoint), task="text-classification", name=checkpoint.name),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    build_bundle(spec, out)
    return out


@pytest.mark.parametrize(("num_labels", "metric"), [(3, "top1_agreement"), (1, "rank_agreement")])
def test_minilm_trunk_classifier_and_reranker(num_labels: int, metric: str, tmp_path: Path) -> None:
    from ortpack.kernel.bundle import verify_bundle

    checkpoint = make_trunk_classifier(tmp_path / f"minilm-head{num_labels}", minilm_dir(), num_labels=num_labels)
    manifest = verify_bundle(_build(checkpoint, tmp_path / "dist"))
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]
    fp32, int8 = (manifest.variant(v).parity for v in ("cpu-fp32", "cpu-int8"))
    assert fp32.values["max_abs_diff"] < 1e-4 and fp32.values[metric] > 0.999
    assert int8.passed and int8.probe is not None and int8.probe.passed
    assert int8.values[metric] >= 0.8 and int8.values["max_abs_diff"] > 1e-4  # real weights: int8 is lossy
    print(f"\nMiniLM trunk, {num_labels} label(s): int8 {metric} {int8.values[metric]:.3f}, "
          f"max |diff| {int8.values['max_abs_diff']:.3f}")  # fmt: skip
