"""The real all-MiniLM-L6-v2 end to end (slow): the bundle matches sentence-transformers itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_minilm_build_matches_sentence_transformers(tmp_path: Path) -> None:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from ortpack.components.core.tasks import resolve_model_source
    from ortpack.kernel.bundle import verify_bundle

    source, name = resolve_model_source("all-MiniLM-L6-v2", "text-embedding")
    spec = BuildSpec(
        export=ExportSpec(source=source, task="text-embedding", name=name),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    result = build_bundle(spec, tmp_path / "dist" / name, work_dir=tmp_path / "work")
    manifest = verify_bundle(tmp_path / "dist" / name)
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]
    assert manifest.task_settings.tokenizer is not None and manifest.task_settings.tokenizer.max_length == 256
    assert (
        manifest.task_settings.pooling is not None
        and manifest.task_settings.pooling.mode == "mean"
        and manifest.task_settings.pooling.normalize
    )
    assert result.export.model_info["num_heads"] == 12 and result.export.model_info["hidden_size"] == 384
    fused = manifest.variant("cpu-fp32").optimize.fusions
    assert fused == {"Attention": 6, "BiasGelu": 6, "EmbedLayerNormalization": 1, "SkipLayerNormalization": 12}

    # Our PyTorch reference (which the gate compares with) is what sentence-transformers computes.
    from sentence_transformers import SentenceTransformer

    ref = np.load(tmp_path / "work" / "export" / "reference.npz")
    texts = [str(t) for t in ref["texts"]]
    st = SentenceTransformer(source, device="cpu").encode(texts, batch_size=32, convert_to_numpy=True)
    np.testing.assert_allclose(ref["outputs"], st, atol=2e-5)

    fp32 = manifest.variant("cpu-fp32").parity.values
    int8 = manifest.variant("cpu-int8").parity.values
    assert fp32["max_abs_diff"] < 1e-5 and fp32["neighbour_agreement"] > 0.99
    assert 0.9 < int8["min_cosine"] < 0.9999 and int8["neighbour_agreement"] > 0.85
