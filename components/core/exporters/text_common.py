"""What the text exporters (text_embedding.py, text_classification.py, token_classification.py)
share: loading a classifier checkpoint and its length limit, the TorchScript export of a module
that takes token ids, the shipped tokenizer.json and the manifest's tokenizer section, the
reference tokenization, PyTorch's timing, and the manifest's source and model records.
"""

from __future__ import annotations

import inspect
import os
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.errors import ExportError, ModelLoadError, one_line
from ortpack.components.core.exporters.families import FAMILIES
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.timing import measure_latency, synthetic_text_batch, text_bench_shapes
from ortpack.kernel.bundle import sha256_file
from ortpack.kernel.contracts import TextOptions
from ortpack.kernel.contracts.base import ATTENTION_MASK, INPUT_IDS, TOKEN_INPUTS
from ortpack.kernel.contracts.tensors import Tensor

INPUT_NAMES = tuple(t.name for t in TOKEN_INPUTS)  # as the text contracts declare them
REQUIRED_INPUTS = (INPUT_IDS.name, ATTENTION_MASK.name)
REFERENCE_BATCH = 32  # texts per PyTorch call for the reference outputs
_NO_SEGMENTS = ((0, 0, 0, 0), (0, 0, 0, 0))


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


def load_checkpoint(model_dir: Path, weights: Path, auto_class: Any, task: str) -> tuple[Any, Any]:
    """(fast tokenizer, model in eval mode) of a local checkpoint through `auto_class` (a
    transformers AutoModelFor... class); each refusal is one ModelLoadError line."""
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


def classifier_input_names(tokenizer: Any, model: nn.Module, what: str) -> tuple[str, ...]:
    """The inputs a classifier's graph takes: what the tokenizer produces and the model's forward
    accepts, which must start with input_ids and attention_mask (`what` names the model)."""
    accepted = inspect.signature(model.forward).parameters
    names = tuple(n for n in INPUT_NAMES if n in tokenizer.model_input_names and n in accepted)
    if names[:2] != REQUIRED_INPUTS:
        raise ExportError(f"model takes {names}; {what} needs input_ids and attention_mask")
    return names


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


def config_labels(config: Any, classes: int) -> list[str]:
    """The config's `id2label` names for `classes` outputs (`LABEL_i` where it names none)."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(classes)]


def dummy_text_inputs(
    input_names: tuple[str, ...], vocab_size: int, segments: tuple[tuple[int, ...], ...] = _NO_SEGMENTS
) -> tuple[torch.Tensor, ...]:
    """Two short padded rows of token ids to trace with (`segments`: their token type ids)."""
    dummy = {
        "input_ids": torch.tensor([[101, 2023, 2003, 102], [101, 2182, 102, 0]], dtype=torch.long) % vocab_size,
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.long),
        "token_type_ids": torch.tensor(segments, dtype=torch.long),
    }
    return tuple(dummy[name] for name in input_names)


def export_torchscript(
    module: nn.Module,
    dummy_inputs: tuple[torch.Tensor, ...],
    path: Path,
    input_names: tuple[str, ...],
    output: Tensor,
    opset: int,
) -> None:
    """Export `module` with the TorchScript exporter (`dynamo=False`: the graph ORT's BERT fusions
    recognise): `input_names` (the contract's token inputs) to the declared `output`, every named
    dimension of each dynamic but the output's last (its width, which the model fixes)."""
    declared = {t.name: t for t in TOKEN_INPUTS}
    axes = {name: declared[name].dynamic_axes() for name in input_names}
    axes[output.name] = {i: d for i, d in output.dynamic_axes().items() if i < len(output.shape) - 1}
    output_name = output.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            dummy_inputs,
            str(path),
            input_names=list(input_names),
            output_names=[output_name],
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )


def save_tokenizer_json(tokenizer: Any, path: Path) -> None:
    """Save the fast tokenizer as a bare tokenizer.json: no truncation or padding baked in; the
    server applies both from the manifest settings."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    backend.save(str(path))


def tokenizer_settings(tokenizer: Any, max_length: int, input_names: tuple[str, ...]) -> dict[str, Any]:
    """The manifest's tokenizer section of a text export (ortpack.kernel.contracts.TokenizerSettings)."""
    return {
        "file": "tokenizer.json",
        "max_length": max_length,
        "truncation": True,
        "padding": "longest",
        "pad_token_id": int(tokenizer.pad_token_id or 0),
        "model_input_names": list(input_names),
    }


def tokenize_reference(
    tokenizer_file: Path,
    hf_tokenizer: Any,
    texts: tuple[str, ...] | list[str],
    max_length: int,
    input_names: tuple[str, ...],
    pairs_with: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Tokenize `texts` (or the pairs `texts[i]`, `pairs_with[i]`) with the shipped tokenizer.json
    exactly as the server will, padded to the longest, and check it agrees with the checkpoint's
    own tokenizer (a disagreement would break parity silently). Returns the named arrays and
    `lengths`."""
    from tokenizers import Tokenizer

    texts = list(texts)
    shipped = Tokenizer.from_file(str(tokenizer_file))
    shipped.enable_truncation(max_length)
    inputs = list(zip(texts, pairs_with, strict=True)) if pairs_with is not None else texts
    encodings = shipped.encode_batch(inputs)
    expected = hf_tokenizer(texts, pairs_with, truncation=True, max_length=max_length)["input_ids"]
    mismatched = [i for i, (enc, ids) in enumerate(zip(encodings, expected, strict=True)) if enc.ids != list(ids)]
    if mismatched:
        raise ExportError(
            f"tokenizer.json disagrees with the checkpoint tokenizer on {len(mismatched)} of "
            f"{len(texts)} validation inputs (first: {texts[mismatched[0]]!r})"
        )
    lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
    width = int(lengths.max())
    pad_id = hf_tokenizer.pad_token_id or 0
    arrays = {
        "input_ids": np.full((len(texts), width), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((len(texts), width), dtype=np.int64),
        "token_type_ids": np.zeros((len(texts), width), dtype=np.int64),
    }
    for i, enc in enumerate(encodings):
        n = len(enc.ids)
        arrays["input_ids"][i, :n] = enc.ids
        arrays["attention_mask"][i, :n] = 1
        arrays["token_type_ids"][i, :n] = enc.type_ids
    return {**{name: arrays[name] for name in input_names}, "lengths": lengths}


def torch_text_latency(
    module: nn.Module, input_names: tuple[str, ...], max_length: int, vocab_size: int
) -> dict[str, dict[str, float]]:
    """PyTorch's latency at the text benchmark shapes (b1x16, b16x128 within `max_length`), on
    random token ids: what each variant's speed-up is measured against."""
    latency = {}
    with torch.inference_mode():
        for key, (batch, seq) in text_bench_shapes(max_length).items():
            feeds = synthetic_text_batch(batch, seq, list(input_names), vocab_size=vocab_size)
            tensors = [torch.from_numpy(feeds[n]) for n in input_names]
            latency[key] = measure_latency(partial(module, *tensors), budget_s=3.0)
    return latency


def huggingface_source(config: Any, model_dir: Path, weights: Path) -> dict[str, Any]:
    """The manifest's source record of a local Hugging Face checkpoint."""

    return {
        "kind": "huggingface",
        "id": str(getattr(config, "_name_or_path", "") or model_dir.name),
        "revision": None,
        "weights_sha256": sha256_file(weights),
    }


def encoder_info(config: Any, exporter: str, fuser: str, hidden_size: int = 0) -> dict[str, Any]:
    """The manifest's model record of an encoder (`hidden_size`: where the config names none)."""
    return {
        "model_type": str(config.model_type),
        "exporter": exporter,
        "fuser": fuser,
        "num_heads": int(getattr(config, "num_attention_heads", 0)),
        "hidden_size": int(getattr(config, "hidden_size", hidden_size)),
        "vocab_size": int(config.vocab_size),
        "num_layers": int(getattr(config, "num_hidden_layers", 0)),
    }


def text_versions() -> dict[str, str]:
    """The library versions a text export records."""
    import onnx
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__}


def token_id_inputs(input_names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The manifest's inputs of a text graph: the contract's token inputs it takes."""
    return [t.spec() for t in TOKEN_INPUTS if t.name in input_names]


@torch.inference_mode()
def reference_outputs(module: nn.Module, inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """PyTorch's output row of every text (`inputs` as `tokenize_reference` writes them), in
    length-sorted batches of REFERENCE_BATCH padded per batch, back in the texts' order."""
    lengths = inputs["lengths"]
    order = np.argsort(lengths, kind="stable")
    rows: dict[int, np.ndarray] = {}
    for start in range(0, len(order), REFERENCE_BATCH):
        idx = order[start : start + REFERENCE_BATCH]
        width = int(lengths[idx].max())
        out = module(*[torch.from_numpy(inputs[name][idx, :width]) for name in names]).float().numpy()
        for row, i in enumerate(idx):
            rows[int(i)] = out[row]
    return np.stack([rows[i] for i in range(len(lengths))]).astype(np.float32)
