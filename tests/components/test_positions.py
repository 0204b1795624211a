"""Position limits of the padding-offset families (RoBERTa style: position ids start after a
padding index): the longest input the exporter allows must be what each implementation really
indexes, not only what the config says. MPNet hard-codes padding index 1 whatever its
`pad_token_id`; RoBERTa, XLM-R, CamemBERT, data2vec-text and the rest use `pad_token_id`. An input
past the table is refused in one line at export and truncated at serving, never an internal error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from ortpack.components.core.exporters.families import FAMILIES
from tests.servers import running_server

TABLE = 64  # max_position_embeddings of the tiny checkpoints here
PADDING_OFFSET = sorted(t for t, f in FAMILIES.items() if f.positions == "padding-offset")
PAD_IDS = (0, 1, 5)  # the usual RoBERTa/MPNet padding id is 1


def _tiny_module(model_type: str, pad_token_id: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoConfig, AutoModel

    from tests.models import _TINY_COMMON, _TINY_OVERRIDES

    torch.manual_seed(0)
    kwargs = {**_TINY_COMMON, **_TINY_OVERRIDES.get(model_type, {})}
    kwargs.update(max_position_embeddings=TABLE, pad_token_id=pad_token_id)
    return AutoModel.from_config(AutoConfig.for_model(model_type, **kwargs), attn_implementation="eager").eval()


def _runs(module, length: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether the module takes `length` real tokens (ids chosen away from every padding id)."""
    import torch

    ids = torch.full((1, length), 1000, dtype=torch.long)
    try:
        with torch.inference_mode():
            module(input_ids=ids, attention_mask=torch.ones_like(ids))
    except (IndexError, RuntimeError) as exc:  # the position table, or the token-type buffer that
        # RoBERTa-style models index with the position ids when no token types are given
        assert "out of" in str(exc), exc
        return False
    return True


def test_every_padding_offset_family_is_covered() -> None:
    assert {"roberta", "xlm-roberta", "camembert", "data2vec-text", "mpnet"} <= set(PADDING_OFFSET)
    assert FAMILIES["mpnet"].padding_idx == 1
    assert all(FAMILIES[t].padding_idx is None for t in PADDING_OFFSET if t != "mpnet")


@pytest.mark.parametrize("pad_token_id", PAD_IDS)
@pytest.mark.parametrize("model_type", PADDING_OFFSET)
def test_max_positions_is_what_the_implementation_indexes(model_type: str, pad_token_id: int) -> None:
    """The family's limit runs, one token more does not: measured on the module itself."""
    from ortpack.components.core.exporters.text_embedding import _position_limit

    module = _tiny_module(model_type, pad_token_id)
    family = FAMILIES[model_type]
    limit = family.max_positions(module.config)
    padding_idx = 1 if model_type == "mpnet" else pad_token_id
    assert limit == TABLE - padding_idx - 1
    assert module.embeddings.padding_idx == padding_idx  # what transformers really does
    assert _runs(module, limit)
    assert not _runs(module, limit + 1)
    assert _position_limit(module, family) == limit  # the exporter's cross-check agrees


def test_a_padding_offset_config_without_a_padding_id_is_refused() -> None:
    from transformers import AutoConfig

    from ortpack.components.core.errors import ExportError

    config = AutoConfig.for_model("roberta", pad_token_id=None, max_position_embeddings=TABLE)
    with pytest.raises(ExportError, match="pad_token_id None"):
        FAMILIES["roberta"].max_positions(config)
    # MPNet ignores its pad_token_id
    assert (
        FAMILIES["mpnet"].max_positions(AutoConfig.for_model("mpnet", pad_token_id=None, max_position_embeddings=TABLE))
        == TABLE - 2
    )
    with pytest.raises(ExportError, match="no room"):
        FAMILIES["roberta"].max_positions(
            AutoConfig.for_model("roberta", pad_token_id=TABLE, max_position_embeddings=TABLE)
        )


def _checkpoint(model_type: str, pad_token_id: int, out: Path) -> Path:
    """A tiny checkpoint (MiniLM's tokenizer, which pads with 0) whose config says `pad_token_id`."""
    from tests.models import make_tiny_encoder

    checkpoint = make_tiny_encoder(model_type, out, max_position=TABLE)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "pad_token_id": pad_token_id}))
    return checkpoint


@pytest.mark.slow
def test_a_max_length_past_the_table_is_refused_in_one_line(tmp_path: Path) -> None:
    """MPNet whose config says pad_token_id 0 still starts positions at 2: --max-length 63 (what
    the config alone would allow) is refused before anything is exported."""
    checkpoint = _checkpoint("mpnet", 0, tmp_path / "tiny-mpnet")
    args = ["export", "--model", str(checkpoint), "--max-length", str(TABLE - 1), "--out", str(tmp_path / "out")]
    result = subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ortpack: error:")]
    assert len(errors) == 1, result.stderr
    assert f"max_length {TABLE - 1} is too long" in errors[0] and f"at most {TABLE - 2} tokens" in errors[0]
    assert not (tmp_path / "out" / "model.onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "pad_token_id"), [("mpnet", 0), ("roberta", 5)])
def test_export_and_server_stay_inside_the_table(model_type: str, pad_token_id: int, tmp_path: Path) -> None:
    """The derived max length follows the implementation; the graph runs at it; the server
    truncates a far longer text there and answers PyTorch's embedding of the truncated input."""
    import onnxruntime as ort

    from ortpack.components.core.benchmark import benchmark_variant
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.package import package_dirs
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    checkpoint = _checkpoint(model_type, pad_token_id, tmp_path / f"tiny-{model_type}")
    export = export_model(ExportSpec(source=str(checkpoint), task="text-embedding", name="tiny"), tmp_path / "export")
    padding_idx = 1 if model_type == "mpnet" else pad_token_id
    limit = TABLE - padding_idx - 1
    assert export.task_settings["tokenizer"] is not None and export.task_settings["tokenizer"]["max_length"] == limit
    ref = np.load(tmp_path / "export" / "reference.npz")
    longest = int(np.argmax(ref["lengths"]))
    assert int(ref["lengths"][longest]) == limit  # the long validation paragraphs are cut at the limit

    session = ort.InferenceSession(str(tmp_path / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.full((2, limit), 1000, dtype=np.int64)
    feed = {i.name: ids if i.name == "input_ids" else np.ones_like(ids) for i in session.get_inputs()}
    feed.update({name: np.zeros_like(ids) for name in feed if name == "token_type_ids"})
    session.run(None, feed)  # the full table, no error

    variant = VariantSpec(target="cpu", precision="fp32")
    optimize_model(tmp_path / "export", variant, tmp_path / variant.id)
    report = validate_variant(tmp_path / variant.id, tmp_path / "export", thresholds_for("text-embedding", "fp32"))
    assert report.misses == []
    benchmark_variant(tmp_path / variant.id, tmp_path / "export", budget_s=0.05)
    bundle = tmp_path / "bundle"
    package_dirs(tmp_path / "export", [tmp_path / variant.id], bundle)
    text = str(ref["texts"][longest])
    with running_server(bundle, "--variant", "cpu-fp32", "--warmup", "false", log_dir=tmp_path) as server:
        responses = [
            httpx.post(f"{server.url}/v1/embeddings", json={"model": "tiny", "input": t}, timeout=30)
            for t in (text, text + " " + text)  # both cut at the limit: the same first `limit` tokens
        ]
    for response in responses:
        assert response.status_code == 200, response.text
        embedding = np.array(response.json()["data"][0]["embedding"], dtype=np.float32)
        np.testing.assert_allclose(embedding, ref["outputs"][longest], atol=1e-4)
