"""Export a Hugging Face sequence classifier (`AutoModelForSequenceClassification`) with its
activation in the graph: softmax for single-label classifiers, sigmoid for multi-label ones and
for single-output cross-encoders (rerankers, the sentence-transformers CrossEncoder default).

Input: a checkpoint directory (config.json with `id2label`, safetensors or weights-only torch
weights, a fast tokenizer). Output graph: `input_ids`, `attention_mask` (and `token_type_ids`
when the model takes them), int64 `[batch, sequence]`, to `probabilities` float32
`[batch, labels]` (classifiers) or `scores` float32 `[batch, 1]` (cross-encoders).

The reference: classifiers on the shipped validation sentences; cross-encoders on (query,
document) pairs built from them, 8 documents per query, tokenized as pairs (segment ids
included) exactly as the server tokenizes `/v1/rerank` requests.

What this does not do: token classification, regression heads with more than one output, or
models whose config asks for remote code.
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
    reference_outputs,
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
from ortpack.kernel.contracts.text_classification import LABEL_SIGNATURE, PAIR_SIGNATURE

log = logging.getLogger("ortpack.export")

PAIRS_PER_QUERY = 8
_IDENTITY = ("torch.nn.modules.linear.Identity", "Identity")


class Classifier(nn.Module):
    """The sequence classifier followed by its activation: what leaves the graph is what clients
    get (probabilities or relevance scores), not logits."""

    def __init__(self, model: nn.Module, activation: str, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.activation = activation
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        logits = self.model(**dict(zip(self.input_names, inputs, strict=True))).logits
        if self.activation == "softmax":
            return torch.softmax(logits, dim=-1)
        if self.activation == "sigmoid":
            return torch.sigmoid(logits)
        return logits


def activation_of(config: Any) -> str:
    """softmax, sigmoid or none, from the config: multi-label and single-output models use sigmoid
    unless a CrossEncoder config says Identity."""
    labels = int(getattr(config, "num_labels", 2))
    if labels == 1:
        default = str(getattr(config, "sbert_ce_default_activation_function", "") or "")
        return "none" if default.endswith(_IDENTITY) else "sigmoid"
    if getattr(config, "problem_type", None) == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def validation_pairs(texts: tuple[str, ...]) -> tuple[list[str], list[str], np.ndarray]:
    """(queries, documents, group per pair): every 8th non-blank sentence is a query, paired with
    the 8 sentences after it (the set is written in small topical runs, so some are relevant)."""
    usable = [t for t in texts if t.strip()]
    queries, documents, groups = [], [], []
    for group, start in enumerate(range(0, len(usable) - PAIRS_PER_QUERY, PAIRS_PER_QUERY + 1)):
        query = usable[start]
        for doc in usable[start + 1 : start + 1 + PAIRS_PER_QUERY]:
            queries.append(query)
            documents.append(doc)
            groups.append(group)
    return queries, documents, np.array(groups, dtype=np.int64)


def _load(model_dir: Path, weights: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForSequenceClassification

    return load_checkpoint(model_dir, weights, AutoModelForSequenceClassification, "text-classification")


def export_text_classifier(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a checkpoint directory) into `out_dir`; return what was written."""
    import onnx

    model_dir = Path(spec.source)
    weights = weights_file(model_dir)
    t0 = time.perf_counter()
    tokenizer, model = _load(model_dir, weights)
    config = model.config
    names = classifier_input_names(tokenizer, model, "a text classifier")
    activation = activation_of(config)
    classes = int(config.num_labels)
    pairs = classes == 1  # a cross-encoder: scores (query, document) pairs
    output = (PAIR_SIGNATURE if pairs else LABEL_SIGNATURE).outputs[0]
    max_length = max_length_for(tokenizer, config, spec)
    module = Classifier(model, activation, names).eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "model.onnx"
    log.info(
        "export: tracing %s to ONNX (opset %d), %s over %d labels", model_dir.name, spec.opset, activation, classes
    )
    # a (query, document) pair in the first row
    dummy = dummy_text_inputs(names, int(config.vocab_size), segments=((0, 0, 1, 1), (0, 0, 0, 0)))
    try:
        export_torchscript(module, dummy, model_path, names, output, spec.opset)
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"cannot export {model_dir} to ONNX: {one_line(exc, 300)}") from None
    graph = onnx.load(str(model_path))
    out_dims = graph.graph.output[0].type.tensor_type.shape.dim
    out_dims[0].dim_param = "batch"
    out_dims[1].dim_value = classes
    onnx.save(graph, str(model_path))
    seconds = time.perf_counter() - t0

    tokenizer_path = out_dir / "tokenizer.json"
    save_tokenizer_json(tokenizer, tokenizer_path)
    texts = validation_sentences()
    arrays: dict[str, Any] = {"task": np.array("text-classification"), "input_names": np.array(names)}
    if pairs:
        queries, documents, groups = validation_pairs(texts)
        inputs = tokenize_reference(tokenizer_path, tokenizer, queries, max_length, names, pairs_with=documents)
        arrays.update(texts=np.array(queries), texts_pair=np.array(documents), groups=groups)
    else:
        usable = [t for t in texts if t.strip()]
        inputs = tokenize_reference(tokenizer_path, tokenizer, usable, max_length, names)
        arrays.update(texts=np.array(usable))
    log.info("export: PyTorch reference outputs on %d %s", len(inputs["lengths"]), "pairs" if pairs else "texts")
    outputs = reference_outputs(module, inputs, names)
    if not np.isfinite(outputs).all():
        raise ExportError("the PyTorch model produces non-finite outputs on the validation set")
    arrays.update(outputs=outputs, **inputs)
    Reference.write(out_dir / REFERENCE_FILE, arrays)

    torch_latency = torch_text_latency(module, names, max_length, int(config.vocab_size))

    # the family's fuser (ORT's BERT fusions or onnxscript's both fuse a TorchScript graph);
    # an architecture outside the families table is not fused
    family = FAMILIES.get(str(config.model_type))
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task="text-classification",
        name=spec.name,
        source=huggingface_source(config, model_dir, weights),
        inputs=token_id_inputs(names),
        outputs=[output.spec({"labels": classes})],
        opset=spec.opset,
        model_info=encoder_info(config, "torchscript", family.fuser if family else "none"),
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": model_path.stat().st_size / 1e6,
            "seconds": seconds,
            "validation_samples": float(len(outputs)),
        },
        torch_latency=torch_latency,
        versions=text_versions(),
        task_settings={
            "tokenizer": tokenizer_settings(tokenizer, max_length, names),
            "classification": {"activation": activation, "pairs": pairs},
            "labels": config_labels(config, classes),
        },
        extra_files=["tokenizer.json"],
    )
