"""Export a Hugging Face token classifier (`AutoModelForTokenClassification`: named-entity
recognition, part-of-speech tagging) with softmax in the graph.

Input: a checkpoint directory (config.json with `id2label`, safetensors or weights-only torch
weights, a fast tokenizer). Output graph: `input_ids`, `attention_mask` (and `token_type_ids`
when the model takes them), int64 `[batch, sequence]`, to `probabilities` float32
`[batch, sequence, labels]`: one distribution per token. Grouping tokens into words and entities
is the server's (serving/tasks/token_classification.py), from the tokenizer's offsets.

The reference: every validation sentence, its per-token probabilities padded to the tokenizer's
max length with -1 (the server pads its rows the same way, so probe rows line up).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, one_line
from ortpack.components.core.exporters.families import FAMILIES
from ortpack.components.core.exporters.text_common import (
    classifier_input_names,
    config_labels,
    dummy_text_inputs,
    encoder_info,
    export_torchscript,
    huggingface_source,
    load_checkpoint,
    max_length_for,
    save_tokenizer_json,
    text_versions,
    token_id_inputs,
    tokenize_reference,
    tokenizer_settings,
    torch_text_latency,
    weights_file,
)
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.validation_data import validation_sentences
from ortpack.kernel.contracts.token_classification import OUTPUT, SIGNATURE, TokenOptions

log = logging.getLogger("ortpack.export")

PAD = -1.0  # the value of every position past a text's tokens, in references and served rows


class TokenTagger(nn.Module):
    """The token classifier followed by softmax over its labels, per token."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.model(**dict(zip(self.input_names, inputs, strict=True))).logits, dim=-1)


def pad_rows(rows: list[np.ndarray], width: int, labels: int) -> np.ndarray:
    """Per-text `[tokens, labels]` arrays as one `[n, width, labels]` array, PAD past each text."""
    out = np.full((len(rows), width, labels), PAD, dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@torch.inference_mode()
def reference_outputs(module: TokenTagger, inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> list[np.ndarray]:
    """Each text's `[tokens, labels]` probabilities, run in length-sorted batches of 32."""
    lengths = inputs["lengths"]
    order = np.argsort(lengths, kind="stable")
    rows: dict[int, np.ndarray] = {}
    for start in range(0, len(order), 32):
        idx = order[start : start + 32]
        width = int(lengths[idx].max())
        out = module(*[torch.from_numpy(inputs[n][idx, :width]) for n in names]).float().numpy()
        for row, i in enumerate(idx):
            rows[int(i)] = out[row, : int(lengths[i])]
    return [rows[i] for i in range(len(lengths))]


def export_token_classifier(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a checkpoint directory) into `out_dir`; return what was written."""
    import onnx
    from transformers import AutoModelForTokenClassification

    model_dir = Path(spec.source)
    weights = weights_file(model_dir)
    t0 = time.perf_counter()
    tokenizer, model = load_checkpoint(model_dir, weights, AutoModelForTokenClassification, spec.task)
    config = model.config
    names = classifier_input_names(tokenizer, model, "a token classifier")
    classes = int(config.num_labels)
    max_length = max_length_for(tokenizer, config, spec)
    module = TokenTagger(model, names).eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "model.onnx"
    log.info("export: tracing %s to ONNX (opset %d), %d labels per token", model_dir.name, spec.opset, classes)
    dummy = dummy_text_inputs(names, int(config.vocab_size))
    try:
        export_torchscript(module, dummy, model_path, names, SIGNATURE.output(OUTPUT), spec.opset)
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"cannot export {model_dir} to ONNX: {one_line(exc, 300)}") from None
    graph = onnx.load(str(model_path))
    out_dims = graph.graph.output[0].type.tensor_type.shape.dim
    out_dims[0].dim_param, out_dims[1].dim_param = "batch", "sequence"
    out_dims[2].dim_value = classes
    onnx.save(graph, str(model_path))
    seconds = time.perf_counter() - t0

    tokenizer_path = out_dir / "tokenizer.json"
    save_tokenizer_json(tokenizer, tokenizer_path)
    texts = [t for t in validation_sentences() if t.strip()]
    inputs = tokenize_reference(tokenizer_path, tokenizer, texts, max_length, names)
    log.info("export: PyTorch reference outputs on %d texts", len(texts))
    rows = reference_outputs(module, inputs, names)
    if not all(np.isfinite(r).all() for r in rows):
        raise ExportError("the PyTorch model produces non-finite outputs on the validation set")
    outputs = pad_rows(rows, max_length, classes)
    arrays: dict[str, Any] = {"task": np.array(spec.task), "input_names": np.array(names), "texts": np.array(texts)}
    Reference.write(out_dir / REFERENCE_FILE, {**arrays, **inputs, "outputs": outputs})

    torch_latency = torch_text_latency(module, names, max_length, int(config.vocab_size))

    family = FAMILIES.get(str(config.model_type))
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task=spec.task,
        name=spec.name,
        source=huggingface_source(config, model_dir, weights),
        inputs=token_id_inputs(names),
        outputs=[t.spec({"labels": classes}) for t in SIGNATURE.outputs],
        opset=spec.opset,
        model_info=encoder_info(config, "torchscript", family.fuser if family else "none"),
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": model_path.stat().st_size / 1e6,
            "seconds": seconds,
            "validation_samples": float(len(texts)),
            "validation_tokens": float(inputs["lengths"].sum()),
        },
        torch_latency=torch_latency,
        versions=text_versions(),
        task_settings={
            "tokenizer": tokenizer_settings(tokenizer, max_length, names),
            "labels": config_labels(config, classes),
            "aggregation": spec.options_as(TokenOptions).aggregation or "first",
        },
        extra_files=["tokenizer.json"],
    )
