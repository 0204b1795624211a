"""The text-encoder families the text-embedding exporter supports: one frozen record per Hugging
Face `model_type`, holding everything that differs between them.

A family says which torch.onnx exporter gives the better graph, which fuser then fuses it
(`ortpack.components.core.optimize`), whether the model reads `token_type_ids`, and how its positions
work (which sets the longest input it can take). Everything else (sizes, heads, vocabulary,
padding id) is read from each checkpoint's own config. A `model_type` missing here is refused
before anything is loaded, with one line listing these.

What this does not cover: encoder-decoders (t5, bart) and decoders, models with extra required
inputs (layout boxes, languages, entities, characters), families whose traced graph diverges from
PyTorch (convbert, nystromformer, yoso, longformer, big_bird past its block-sparse threshold),
families without a fast tokenizer (xlm, flaubert) or without an attention mask (fnet), and any
checkpoint that needs its own code: `trust_remote_code` is never set.

How the choices were made: `python bench/coverage.py --survey` builds a family at MiniLM's size
(6 layers, 384 wide, random weights) with each pair (TorchScript + ORT's BERT fusions, TorchScript
+ onnxscript fusions, dynamo + onnxscript fusions) and measures fp32 and int8 at b1x16 and
b16x128 (bench/results/family_survey.md). A family keeps the pair whose p50s, each relative to the
fastest pair's, are lowest on average; a pair within 5% of the fastest counts as as fast, and then
the one that fuses attention is kept. BERT-like families use ORT's BERT fusions, which fuse their
whole layer (Attention, EmbedLayerNormalization), without a survey.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ortpack.components.core.errors import ExportError

Exporter = Literal["torchscript", "dynamo"]
Fuser = Literal["ort-bert", "onnxscript", "none"]
Positions = Literal["absolute", "padding-offset", "relative", "rotary"]


@dataclass(frozen=True, kw_only=True)
class EncoderFamily:
    """One encoder architecture (a Hugging Face `model_type`) and how to export and fuse it.

    - `exporter`: "torchscript" (`torch.onnx.export(dynamo=False)`, opset 17, the graph ORT's BERT
      fusions recognise) or "dynamo" (`torch.export`, opset 18: smaller graphs that the onnxscript
      rewriter fuses; DeBERTa's relative attention traces to 4x fewer nodes).
    - `fuser`: "ort-bert" (`onnxruntime.transformers.optimizer`, model_type "bert": Attention,
      EmbedLayerNormalization, SkipLayerNormalization, BiasGelu), "onnxscript"
      (`onnxscript.rewriter.ort_fusions.optimize_for_ort`: also rotary embeddings, RMS norms and
      MultiHeadAttention) or "none".
    - `token_type_ids`: the model has a token-type embedding; it is an input only when the
      tokenizer produces it, the config has more than one type and the exported graph kept it.
    - `positions`: "absolute" (a learned table of `max_position_embeddings`), "padding-offset"
      (RoBERTa style: position ids start at the padding index + 1, so that many rows of the table
      are never a real position), "relative" or "rotary" (no table is indexed past the trained
      length, which still bounds the input).
    - `padding_idx`: for "padding-offset", the padding index the implementation uses whatever the
      config says (transformers' MPNetEmbeddings hard-codes 1); None: the config's `pad_token_id`
      (RoBERTa, XLM-R, CamemBERT, data2vec-text, ...: `padding_idx = config.pad_token_id`).
    - `int8_per_token`: regexes over the exported graph's MatMul node names whose activations the
      int8 variant quantizes per token rather than per tensor
      (`ortpack.components.core.quantization.graph_recipes.quantize_int8_dynamic`): where a few tokens carry activations
      tens of times larger than the rest. Empty: the shipped recipe as measured on MiniLM.
    """

    model_type: str
    exporter: Exporter
    fuser: Fuser
    token_type_ids: bool
    positions: Positions
    padding_idx: int | None = None
    int8_per_token: tuple[str, ...] = ()

    def position_offset(self, config: Any) -> int:
        """How many rows of the position table no real token reaches: 0, or for "padding-offset"
        the padding index + 1 (the first token's position id)."""

        if self.positions != "padding-offset":
            return 0
        pad = self.padding_idx if self.padding_idx is not None else getattr(config, "pad_token_id", None)
        if pad is None or int(pad) < 0:
            raise ExportError(
                f"this {self.model_type} config has pad_token_id {pad}: its position ids start at "
                "pad_token_id + 1, so it needs a padding id >= 0"
            )
        return int(pad) + 1

    def max_positions(self, config: Any) -> int:
        """The longest input, in tokens, this checkpoint's position handling allows: the position
        table's rows less `position_offset` (ids of a sequence of n tokens reach offset + n - 1)."""

        table = int(getattr(config, "max_position_embeddings", 512) or 512)
        limit = table - self.position_offset(config)
        if limit < 2:
            raise ExportError(
                f"this {self.model_type} model has {table} position embeddings and its positions start "
                f"at {self.position_offset(config)}: no room for a tokenized input"
            )
        return limit

    def takes_token_type_ids(self, config: Any) -> bool:
        """Token types are an input only when there is more than one (with one, every id is 0)."""
        return self.token_type_ids and int(getattr(config, "type_vocab_size", 2) or 0) > 1


def _family(
    model_type: str,
    exporter: Exporter,
    fuser: Fuser,
    token_type_ids: bool,
    positions: Positions,
    **extra: Any,
) -> tuple[str, EncoderFamily]:
    return model_type, EncoderFamily(
        model_type=model_type,
        exporter=exporter,
        fuser=fuser,
        token_type_ids=token_type_ids,
        positions=positions,
        **extra,
    )


# The second FFN MatMul of each MPNet layer, as the TorchScript exporter names it (the attention
# output is `attention/attn/o`, so this matches nothing else).
MPNET_FFN_OUT = r"/layer\.\d+/output/dense/MatMul$"

FAMILIES: dict[str, EncoderFamily] = dict(
    [
        # BERT and its descendants: ORT's BERT fusions take the whole layer, embeddings included.
        _family("bert", "torchscript", "ort-bert", True, "absolute"),
        _family("distilbert", "torchscript", "ort-bert", False, "absolute"),
        _family("electra", "torchscript", "ort-bert", True, "absolute"),
        _family("ernie", "torchscript", "ort-bert", True, "absolute"),
        _family("rembert", "torchscript", "ort-bert", True, "absolute"),
        # RoBERTa's: the same layers, position ids offset by the padding id (not fused into
        # EmbedLayerNormalization, which assumes 0-based positions).
        _family("roberta", "torchscript", "ort-bert", True, "padding-offset"),
        _family("xlm-roberta", "torchscript", "ort-bert", True, "padding-offset"),
        _family("camembert", "torchscript", "ort-bert", True, "padding-offset"),
        _family("data2vec-text", "torchscript", "ort-bert", True, "padding-offset"),
        _family("roberta-prelayernorm", "torchscript", "ort-bert", True, "padding-offset"),
        _family("xlm-roberta-xl", "torchscript", "ort-bert", False, "padding-offset"),
        # Relative or rotary attention, measured (family_survey.md): the TorchScript graph with
        # ORT's BERT fusions (norms, GELUs; attention stays unfused) or the onnxscript fusions was
        # 19-33% faster than the dynamo graph for these four, on average over fp32/int8 x
        # b1x16/b16x128.
        # MPNet's position ids start at 2 whatever its pad_token_id (MPNetEmbeddings: padding_idx = 1).
        # Its second FFN MatMul (`layer.N/output/dense`) takes GELU outputs of 70-100 at the
        # delimiter tokens against ~2.5 elsewhere (all-mpnet-base-v2, layers 6-10): quantized per
        # tensor they left min cosine 0.58 / neighbours 0.73; per token, see optimize.py.
        _family(
            "mpnet",
            "torchscript",
            "ort-bert",
            False,
            "padding-offset",
            padding_idx=1,
            int8_per_token=(MPNET_FFN_OUT,),
        ),
        _family("nomic_bert", "torchscript", "ort-bert", True, "rotary"),
        _family("gte", "torchscript", "onnxscript", True, "rotary"),
        _family("roformer", "torchscript", "onnxscript", True, "rotary"),
        # ... and the dynamo graph with the onnxscript fusions (MultiHeadAttention, rotary
        # embeddings, skip/RMS norms) was the fastest or within 5% of it for these three.
        _family("modernbert", "dynamo", "onnxscript", False, "rotary"),
        _family("eurobert", "dynamo", "onnxscript", False, "rotary"),
        _family("deberta-v2", "dynamo", "onnxscript", True, "relative"),
        # Not surveyed at MiniLM's size (chosen on the tiny size: DeBERTa's relative attention
        # traces to 4x fewer nodes with dynamo; ORT's BERT fusions miss one attention block in six
        # of the pre-LN or weight-shared layers).
        _family("deberta", "dynamo", "onnxscript", True, "relative"),
        _family("albert", "dynamo", "onnxscript", True, "absolute"),
        _family("megatron-bert", "dynamo", "onnxscript", True, "absolute"),
    ]
)


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def family_for(config: dict[str, Any]) -> EncoderFamily:
    """The family of a checkpoint from its raw config.json, or `ExportError` in one line naming
    the supported families (an encoder-decoder, a decoder, an unknown or custom-code model)."""

    model_type = str(config.get("model_type") or "")
    supported = ", ".join(supported_model_types())
    family = FAMILIES.get(model_type)
    if family is not None:
        return family
    if not model_type:
        raise ExportError(f"config.json has no model_type; text-embedding supports: {supported}")
    if config.get("is_encoder_decoder"):
        reason = f"{model_type} is an encoder-decoder model"
    elif config.get("auto_map"):
        reason = f"{model_type} needs the checkpoint's own code (auto_map), which ortpack never runs"
    else:
        reason = f"unsupported architecture {model_type!r}{_vision_hint(model_type)}"
    raise ExportError(f"{reason}; text-embedding exports the encoder families: {supported}")


def _vision_hint(model_type: str) -> str:
    """` (a vision model: give --task TASK)` for a Hugging Face vision checkpoint, else ""."""
    try:  # transformers' own tables (the export step has transformers; a torch-free image does not)
        from transformers.models.auto import modeling_auto as auto
    except ImportError:
        return ""
    if model_type in auto.MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES:
        return " (an object detector: give --task object-detection)"
    if model_type in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return " (an image classifier: give --task image-classification)"
    if model_type in auto.MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES:
        return " (a semantic segmenter: give --task semantic-segmentation)"
    return ""
