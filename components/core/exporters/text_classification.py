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
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from components.core.artifacts import ExportResult
from components.core.errors import ExportError, ModelLoadError, one_line
from components.core.exporters.families import FAMILIES
from components.core.exporters.text_embedding import (
    save_tokenizer_json,
    tokenize_reference,
    tokenizer_settings,
    torch_text_latency,
)
from components.core.specs import ExportSpec
from components.core.validation_data import validation_sentences
from serving.contracts import TextOptions

log = logging.getLogger("ortpack.export")

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
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


def weights_file(model_dir: Path) -> Path:
    """The checkpoint's weights file, or a one-line ModelLoadError naming what is missing."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"model path is not a checkpoint directory: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"not a Hugging Face checkpoint: {model_dir} has no config.json")
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (model_dir / name).is_file():
            return model_dir / name
    raise ModelLoadError(f"no weights in {model_dir} (expected model.safetensors or pytorch_model.bin)")


def config_labels(config: Any, classes: int) -> list[str]:
    """The config's `id2label` names for `classes` outputs (`LABEL_i` where it names none)."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(classes)]


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


def load_checkpoint(model_dir: Path, weights: Path, auto_class: Any, task: str) -> tuple[Any, Any]:
    """(fast tokenizer, model in eval mode) of a local checkpoint through `auto_class` (a
    transformers AutoModelFor... class); each refusal is one ModelLoadError line."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    if getattr(config, "auto_map", None):
        raise ModelLoadError(f"{model_dir} asks for remote code (auto_map in config.json); ortpack never runs it")
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{model_dir} is an encoder-decoder ({config.model_type}); {task} needs an encoder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure is a bad checkpoint
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {one_line(exc, 300)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{model_dir} has no fast tokenizer (tokenizer.json); ortpack ships one")
    try:
        model = auto_class.from_pretrained(
            model_dir, attn_implementation="eager", local_files_only=True, use_safetensors=weights.suffix != ".bin"
        )
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(f"{model_dir} is not a {task} model: {one_line(exc, 300)}") from None
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load weights from {weights}: {one_line(exc, 300)}") from None
    return tokenizer, model.eval()


def max_length_for(tokenizer: Any, config: Any, spec: ExportSpec) -> int:
    """`max_length` within the model's positions, else the tokenizer's own limit."""
    max_length = spec.options_as(TextOptions).max_length
    # the encoder family's position handling (RoBERTa's ids start after the padding index);
    # an architecture outside the table: a plain table of max_position_embeddings
    family = FAMILIES.get(str(config.model_type))
    limit = family.max_positions(config) if family else int(getattr(config, "max_position_embeddings", 512) or 512)
    if max_length is not None:
        if max_length > limit:
            raise ExportError(f"max_length {max_length} exceeds the model's {limit} positions")
        return max_length
    return min(int(getattr(tokenizer, "model_max_length", limit) or limit), limit)


@torch.inference_mode()
def reference_outputs(module: Classifier, inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    lengths = inputs["lengths"]
    order = np.argsort(lengths, kind="stable")
    rows: dict[int, np.ndarray] = {}
    for start in range(0, len(order), 32):
        idx = order[start : start + 32]
        width = int(lengths[idx].max())
        out = module(*[torch.from_numpy(inputs[n][idx, :width]) for n in names]).float().numpy()
        for row, i in enumerate(idx):
            rows[int(i)] = out[row]
    return np.stack([rows[i] for i in range(len(lengths))]).astype(np.float32)


def export_text_classifier(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a checkpoint directory) into `out_dir`; return what was written."""
    import inspect

    import onnx
    import transformers

    from serving.bundle import sha256_file

    model_dir = Path(spec.source)
    weights = weights_file(model_dir)
    t0 = time.perf_counter()
    tokenizer, model = _load(model_dir, weights)
    config = model.config
    accepted = inspect.signature(model.forward).parameters
    names = tuple(n for n in INPUT_NAMES if n in tokenizer.model_input_names and n in accepted)
    if names[:2] != ("input_ids", "attention_mask"):
        raise ExportError(f"model takes {names}; a text classifier needs input_ids and attention_mask")
    activation = activation_of(config)
    classes = int(config.num_labels)
    pairs = classes == 1  # a cross-encoder: scores (query, document) pairs
    output_name = "scores" if pairs else "probabilities"
    max_length = max_length_for(tokenizer, config, spec)
    module = Classifier(model, activation, names).eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "model.onnx"
    dummy = {
        "input_ids": torch.tensor([[101, 2023, 2003, 102], [101, 2182, 102, 0]], dtype=torch.long)
        % int(config.vocab_size),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.long),
        "token_type_ids": torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.long),
    }
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[output_name] = {0: "batch"}
    log.info(
        "export: tracing %s to ONNX (opset %d), %s over %d labels", model_dir.name, spec.opset, activation, classes
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                tuple(dummy[n] for n in names),
                str(model_path),
                input_names=list(names),
                output_names=[output_name],
                dynamic_axes=axes,
                opset_version=spec.opset,
                dynamo=False,  # the legacy exporter gives the graph ORT's BERT fusions recognise
                do_constant_folding=True,
            )
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
    np.savez_compressed(out_dir / "reference.npz", **arrays)

    torch_latency = torch_text_latency(module, names, max_length, int(config.vocab_size))

    labels = config_labels(config, classes)
    result = ExportResult(
        task="text-classification",
        name=spec.name,
        source={
            "kind": "huggingface",
            "id": str(getattr(config, "_name_or_path", "") or model_dir.name),
            "revision": None,
            "weights_sha256": sha256_file(weights),
        },
        inputs=[{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in names],
        outputs=[{"name": output_name, "dtype": "float32", "shape": ["batch", classes]}],
        opset=spec.opset,
        model_info={
            "model_type": str(config.model_type),
            "exporter": "torchscript",
            # the family's fuser (ORT's BERT fusions or onnxscript's both fuse a TorchScript graph);
            # an architecture outside the families table is not fused
            "fuser": family.fuser if (family := FAMILIES.get(str(config.model_type))) else "none",
            "num_heads": int(getattr(config, "num_attention_heads", 0)),
            "hidden_size": int(getattr(config, "hidden_size", 0)),
            "vocab_size": int(config.vocab_size),
            "num_layers": int(getattr(config, "num_hidden_layers", 0)),
        },
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": model_path.stat().st_size / 1e6,
            "seconds": seconds,
            "validation_samples": float(len(outputs)),
        },
        torch_latency=torch_latency,
        versions={"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__},
        task_settings={
            "tokenizer": tokenizer_settings(tokenizer, max_length, names),
            "classification": {"activation": activation, "pairs": pairs},
            "labels": labels,
        },
        extra_files=["tokenizer.json"],
    )
    return result  # written once, by components.core.export.export_model
