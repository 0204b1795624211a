"""The text-embedding exporter: graph signature, pooling in the graph, tokenizer, references."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError
from ortpack.components.core.exporters.text_embedding import Pooling, read_pooling_config
from ortpack.components.core.validation_data import validation_sentences


def test_validation_set_is_varied() -> None:
    texts = validation_sentences()
    assert len(texts) >= 500
    assert len(set(texts)) == len(texts)
    assert {"", " ", "."} <= set(texts)
    assert any(len(t.split()) > 200 for t in texts)  # past 256 tokens: truncation is exercised
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in texts)  # CJK
    assert any(any("\u0400" <= ch <= "\u04ff" for ch in t) for t in texts)  # Cyrillic


def test_graph_signature(tiny_export: Path) -> None:
    model = onnx.load(str(tiny_export / "model.onnx"))
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert inputs == {
        "input_ids": ["batch", "sequence"],
        "attention_mask": ["batch", "sequence"],
        "token_type_ids": ["batch", "sequence"],
    }
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT64 for i in model.graph.input)
    (output,) = model.graph.output
    assert output.name == "sentence_embedding"
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 64]


def test_export_record(tiny_export: Path) -> None:
    export = ExportResult.load(tiny_export)
    assert (
        export.task_settings["tokenizer"] is not None and export.task_settings["tokenizer"]["max_length"] == 128
    )  # capped by positions
    assert export.task_settings["pooling"] == {"mode": "mean", "normalize": True}
    assert export.model_info["num_heads"] == 4 and export.model_info["hidden_size"] == 64
    assert len(export.source["weights_sha256"]) == 64
    assert set(export.torch_latency) == {"b1_s16", "b16_s128"}
    assert (tiny_export / "tokenizer.json").is_file()


def test_reference_outputs_vary_and_are_normalised(tiny_export: Path) -> None:
    ref = np.load(tiny_export / "reference.npz")
    out = ref["outputs"]
    assert out.shape == (len(validation_sentences()), 64)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    sims = out @ out.T
    off_diagonal = sims[np.triu_indices(len(out), 1)]
    assert off_diagonal.min() < 0.9, "random-weight model collapsed: every sentence embeds alike"
    distinct_inputs = len(np.unique(ref["input_ids"], axis=0))
    assert len(np.unique(out.round(4), axis=0)) >= 0.99 * distinct_inputs  # distinct inputs, distinct outputs
    assert ref["lengths"].max() == 128 and ref["lengths"].min() == 2  # truncated, and [CLS] [SEP] only


def test_shipped_tokenizer_matches_reference_inputs(tiny_export: Path) -> None:
    from tokenizers import Tokenizer

    ref = np.load(tiny_export / "reference.npz")
    tok = Tokenizer.from_file(str(tiny_export / "tokenizer.json"))
    tok.enable_truncation(128)
    texts = [str(t) for t in ref["texts"][:50]]
    for i, enc in enumerate(tok.encode_batch(texts)):
        n = int(ref["lengths"][i])
        assert enc.ids == ref["input_ids"][i, :n].tolist()


def test_pooling_module_matches_manual_computation() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    mean = Pooling("mean", normalize=False)(hidden, mask)
    torch.testing.assert_close(mean[0], hidden[0, :3].mean(0))
    torch.testing.assert_close(mean[1], hidden[1].mean(0))
    cls = Pooling("cls", normalize=True)(hidden, mask)
    torch.testing.assert_close(cls[0], hidden[0, 0] / hidden[0, 0].norm())
    mx = Pooling("max", normalize=False)(hidden, mask)
    torch.testing.assert_close(mx[0], hidden[0, :3].amax(0))


def test_pooling_config_from_sentence_transformers(tmp_path: Path) -> None:
    from tests.models import make_tiny_bert

    assert read_pooling_config(tmp_path) == {"mode": "mean", "normalize": True, "max_seq_length": None}
    cls_dir = make_tiny_bert(tmp_path / "cls", pooling="cls", normalize=False)
    assert read_pooling_config(cls_dir) == {"mode": "cls", "normalize": False, "max_seq_length": None}
    (cls_dir / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ExportError, match="unsupported sentence-transformers module"):
        read_pooling_config(cls_dir)


def test_cls_pooling_without_normalisation_is_exported(tmp_path: Path) -> None:
    import onnxruntime as ort

    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec
    from tests.models import make_tiny_bert

    src = make_tiny_bert(tmp_path / "cls", pooling="cls", normalize=False, seed=1)
    result = export_model(
        ExportSpec(source=str(src), task="text-embedding", name="cls", options={"max_length": 32}), tmp_path / "out"
    )
    assert result.task_settings["pooling"] == {"mode": "cls", "normalize": False}
    ref = np.load(tmp_path / "out" / "reference.npz")
    norms = np.linalg.norm(ref["outputs"], axis=1)
    # Normalisation is off: the CLS vector keeps the final LayerNorm's scale (sqrt(64) = 8), not 1.
    assert np.abs(norms - 1.0).min() > 1.0
    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {
        name: ref[name][:4, : int(ref["lengths"][:4].max())]
        for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    np.testing.assert_allclose(session.run(None, feeds)[0], ref["outputs"][:4], atol=1e-5)
