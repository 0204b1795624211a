"""Export a Hugging Face text-embedding checkpoint with pooling and normalisation in the graph.

Input: a checkpoint directory (config.json, safetensors or weights-only torch weights, a fast
tokenizer; optionally sentence-transformers' modules.json, 1_Pooling/config.json and
sentence_bert_config.json) of an encoder family listed in `families.FAMILIES`. Output graph:
`input_ids`, `attention_mask` (and `token_type_ids` when the model and its graph take them), all
int64 `[batch, sequence]`, to `sentence_embedding` float32 `[batch, dim]`.

The family decides the exporter (TorchScript or dynamo), the fuser the optimize step runs, and the
position handling that bounds the input length; sizes come from the checkpoint's config.

What this does not do: sentence-transformers Dense layers or prompts (a checkpoint whose
modules.json has modules beyond Transformer/Pooling/Normalize is refused), models whose weights
exceed the 2 GB protobuf limit, or any checkpoint code (`trust_remote_code` is never set).
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, ModelLoadError, one_line
from ortpack.components.core.exporters.families import EncoderFamily, family_for
from ortpack.components.core.exporters.text_common import (
    INPUT_NAMES,
    dummy_text_inputs,
    encoder_info,
    export_torchscript,
    huggingface_source,
    reference_outputs,
    save_tokenizer_json,
    text_versions,
    token_id_inputs,
    tokenize_reference,
    tokenizer_settings,
    torch_text_latency,
)
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.validation_data import validation_sentences
from ortpack.kernel.contracts import TextOptions
from ortpack.kernel.contracts.text_embedding import OUTPUT, SIGNATURE

log = logging.getLogger("ortpack.export")

DYNAMO_MIN_OPSET = 18  # torch.export's ONNX translation targets opset 18 and later
# Weights a checkpoint may lack without changing the embedding: the pooler is never in the graph.
_UNUSED_WEIGHT_PREFIXES = ("pooler.",)
_ST_MODULES = {
    "sentence_transformers.models.Transformer": "transformer",
    "sentence_transformers.models.Pooling": "pooling",
    "sentence_transformers.models.Normalize": "normalize",
}


class Pooling(nn.Module):
    """Pool token embeddings into one sentence embedding, then optionally L2-normalise.

    `mean` averages over real tokens (the attention mask), `cls` takes the first token, `max`
    takes the maximum over real tokens. Everything stays in the input dtype's float32 math so an
    fp16 graph can keep this block in fp32.
    """

    def __init__(self, mode: str, normalize: bool) -> None:
        super().__init__()
        self.mode = mode
        self.normalize = normalize

    def forward(self, token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.mode == "cls":
            pooled = token_embeddings[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            if self.mode == "mean":
                summed = (token_embeddings * mask).sum(dim=1)
                pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
            else:
                pooled = token_embeddings.masked_fill(mask == 0, -1e9).amax(dim=1)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled


class SentenceEmbedding(nn.Module):
    """A transformer encoder followed by `Pooling`: the graph that gets exported."""

    def __init__(self, encoder: nn.Module, pooling: Pooling, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.input_names, inputs, strict=True))
        hidden = self.encoder(**kwargs).last_hidden_state
        return self.pooling(hidden, kwargs["attention_mask"])


def read_pooling_config(model_dir: Path) -> dict[str, Any]:
    """Pooling mode, normalisation and max length from sentence-transformers configs, if any.

    Without them: mean pooling and L2 normalisation (the sentence-transformers default for
    embedding models). With modules.json, normalisation is on only if a Normalize module is listed.
    """
    config: dict[str, Any] = {"mode": "mean", "normalize": True, "max_seq_length": None}
    modules_file = model_dir / "modules.json"
    pooling_dir = model_dir / "1_Pooling"
    if modules_file.is_file():
        modules = _read_json(modules_file)
        kinds = []
        for module in modules:
            kind = _ST_MODULES.get(module.get("type", ""))
            if kind is None:
                raise ExportError(
                    f"unsupported sentence-transformers module {module.get('type')!r} in "
                    f"{modules_file} (supported: Transformer, Pooling, Normalize)"
                )
            kinds.append(kind)
            if kind == "pooling":
                pooling_dir = model_dir / module.get("path", "1_Pooling")
        config["normalize"] = "normalize" in kinds
    pooling_file = pooling_dir / "config.json"
    if pooling_file.is_file():
        pooling = _read_json(pooling_file)
        modes = [
            m
            for m in ("cls", "mean", "max")
            if pooling.get(f"pooling_mode_{m}_token") or pooling.get(f"pooling_mode_{m}_tokens")
        ]
        unsupported = [
            k
            for k, v in pooling.items()
            if k.startswith("pooling_mode_")
            and v
            and k not in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens")
        ]
        if unsupported or len(modes) != 1:
            raise ExportError(f"unsupported pooling configuration in {pooling_file}: {pooling}")
        config["mode"] = modes[0]
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file():
        config["max_seq_length"] = _read_json(st_config).get("max_seq_length")
    return config


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable {path}: {exc}") from None


def _check_checkpoint(model_dir: Path) -> tuple[Path, EncoderFamily]:
    """The weights file and the encoder family, from the files alone (nothing is loaded yet)."""
    if not model_dir.exists():
        raise ModelLoadError(f"model path not found: {model_dir}")
    if not model_dir.is_dir():
        raise ModelLoadError(f"model path is not a directory: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"not a Hugging Face checkpoint: {model_dir} has no config.json")
    config = _read_json(model_dir / "config.json")
    if not isinstance(config, dict):
        raise ModelLoadError(f"{model_dir / 'config.json'} is not a JSON object")
    family = family_for(config)
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (model_dir / name).is_file():
            return model_dir / name, family
    raise ModelLoadError(f"no weights in {model_dir} (expected model.safetensors or pytorch_model.bin)")


def _load(model_dir: Path, weights: Path) -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_dir, use_fast=True, local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure is a bad checkpoint
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {one_line(exc, 300)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{model_dir} has no fast tokenizer (tokenizer.json); ortpack ships one")
    try:
        # transformers loads .bin files with torch.load(weights_only=True): nothing is unpickled.
        model, info = AutoModel.from_pretrained(
            model_dir,
            attn_implementation="eager",
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=weights.suffix != ".bin",
            output_loading_info=True,
        )
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load weights from {weights}: {one_line(exc, 300)}") from None
    # transformers fills weights the checkpoint lacks with random values and only logs it: a
    # checkpoint written for other code (a custom-code model under a known model_type) would
    # export "fine" and embed nonsense.
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(_UNUSED_WEIGHT_PREFIXES))
    if missing:
        raise ModelLoadError(
            f"{weights} does not match the {model.config.model_type} architecture: {len(missing)} weights "
            f"missing (first: {missing[0]}); is it written for custom code?"
        )
    return tokenizer, model.eval()


def _position_limit(encoder: Any, family: EncoderFamily) -> int:
    """The longest input whose position ids stay inside the position table: the family's rule
    (`EncoderFamily.max_positions`, from the config), checked against the loaded module itself
    (its `embeddings.position_embeddings` rows and, for padding-offset families, the
    `embeddings.padding_idx` its position ids start after); the smaller wins, so no input the
    tokenizer lets through can index past the table."""
    config = encoder.config
    limit = family.max_positions(config)
    embeddings = getattr(encoder, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    if isinstance(table, nn.Embedding) and family.positions in ("absolute", "padding-offset"):
        offset = 0
        if family.positions == "padding-offset":
            padding_idx = getattr(embeddings, "padding_idx", None)
            offset = family.position_offset(config) if padding_idx is None else int(padding_idx) + 1
        measured = int(table.num_embeddings) - offset
        if measured < limit:
            log.warning(
                "export: %s position table allows %d tokens, not the %d its config implies; using %d",
                family.model_type,
                measured,
                limit,
                measured,
            )
            limit = measured
    return limit


def _max_length(
    tokenizer: Any, config: Any, pooling_config: dict[str, Any], spec: ExportSpec, family: EncoderFamily, limit: int
) -> int:
    max_length = spec.options_as(TextOptions).max_length
    if max_length is not None:
        if max_length > limit:
            raise ExportError(
                f"max_length {max_length} is too long for this {family.model_type} model: its position "
                f"table takes at most {limit} tokens (max_position_embeddings "
                f"{getattr(config, 'max_position_embeddings', '?')}, first position id "
                f"{family.position_offset(config)})"
            )
        return max_length
    if pooling_config["max_seq_length"]:
        return min(int(pooling_config["max_seq_length"]), limit)
    model_max = int(getattr(tokenizer, "model_max_length", limit) or limit)
    return min(model_max, limit)


class _NamedInputs(nn.Module):
    """`SentenceEmbedding` with named arguments: torch.export names dynamic axes per argument."""

    def __init__(self, module: SentenceEmbedding) -> None:
        super().__init__()
        self.module = module

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = (input_ids, attention_mask) if token_type_ids is None else (input_ids, attention_mask, token_type_ids)
        return self.module(*inputs)


def _export_onnx_dynamo(
    module: SentenceEmbedding, input_names: tuple[str, ...], path: Path, opset: int, vocab_size: int, max_length: int
) -> None:
    """The dynamo exporter (`torch.export`, then onnxscript's graph optimizer), for the families
    whose attention the onnxscript rewriter fuses. Nodes of the pooling block are renamed
    `/pooling/...` as the TorchScript exporter names them, so fp16 keeps them in fp32 either way."""
    import onnx

    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", min=2, max=max(max_length, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            _NamedInputs(module),
            dummy_text_inputs(input_names, vocab_size),
            input_names=list(input_names),
            output_names=[OUTPUT],
            dynamic_shapes={name: {0: batch, 1: sequence} for name in input_names},
            opset_version=opset,
            dynamo=True,
            optimize=True,
            verbose=False,
        )
    assert program is not None
    model = program.model_proto
    for node in model.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
        if "module.pooling" in ast.literal_eval(scopes):  # e.g. ['', 'module', 'module.pooling', 'div']
            node.name = f"/pooling/{node.name}"
    for value in model.graph.input:
        for axis, dim in zip(("batch", "sequence"), value.type.tensor_type.shape.dim, strict=True):
            dim.dim_param = axis
    onnx.save(model, str(path))


@torch.inference_mode()
def _pin_output_dim(graph: Any, module: SentenceEmbedding, input_names: tuple[str, ...]) -> int:
    """The legacy exporter names every output axis; the embedding width is a fixed number."""
    probe = [(torch.zeros if n == "token_type_ids" else torch.ones)((1, 2), dtype=torch.long) for n in input_names]
    dim = int(module(*probe).shape[1])
    output_dims = graph.graph.output[0].type.tensor_type.shape.dim
    output_dims[0].dim_param = "batch"
    output_dims[1].dim_value = dim
    return dim


def _input_names(tokenizer: Any, encoder: Any, family: EncoderFamily) -> tuple[str, ...]:
    """What the graph should take: what the tokenizer produces and the model's forward accepts,
    token types only when the family and config have them."""
    accepted = inspect.signature(encoder.forward).parameters
    names = tuple(n for n in INPUT_NAMES if n in tokenizer.model_input_names and n in accepted)
    if not family.takes_token_type_ids(encoder.config):
        names = tuple(n for n in names if n != "token_type_ids")
    if names[:2] != ("input_ids", "attention_mask"):
        raise ExportError(
            f"{family.model_type} model with tokenizer inputs {list(tokenizer.model_input_names)} takes {names}; "
            "a text-embedding model needs input_ids and attention_mask"
        )
    return names


def _embedding_module(
    tokenizer: Any, encoder: Any, family: EncoderFamily, pooling_config: dict[str, Any]
) -> SentenceEmbedding:
    """The encoder followed by the checkpoint's pooling, taking the inputs `_input_names` chooses."""
    pooling = Pooling(pooling_config["mode"], pooling_config["normalize"])
    return SentenceEmbedding(encoder, pooling, _input_names(tokenizer, encoder, family)).eval()


def _opset_for(family: EncoderFamily, opset: int) -> int:
    """The spec's opset, raised to what torch.export's ONNX translation targets for dynamo families."""
    return max(opset, DYNAMO_MIN_OPSET) if family.exporter == "dynamo" else opset


def _export_graph(
    module: SentenceEmbedding,
    family: EncoderFamily,
    model_dir: Path,
    path: Path,
    opset: int,
    vocab_size: int,
    max_length: int,
) -> None:
    """`path` from the family's exporter (TorchScript or dynamo), checked; any failure of either
    means this model cannot be exported, and is one ExportError line."""
    import onnx

    log.info(
        "export: %s (%s) to ONNX with the %s exporter, opset %d",
        model_dir.name,
        family.model_type,
        family.exporter,
        opset,
    )
    names = module.input_names
    try:
        if family.exporter == "dynamo":
            _export_onnx_dynamo(module, names, path, opset, vocab_size, max_length)
        else:
            dummy = dummy_text_inputs(names, vocab_size)
            export_torchscript(module, dummy, path, names, SIGNATURE.output(OUTPUT), opset)
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # noqa: BLE001 - any exporter failure means this model cannot be exported
        raise ExportError(f"cannot export {model_dir} to ONNX: {one_line(exc, 300)}") from None


def _fit_graph(module: SentenceEmbedding, path: Path) -> tuple[Any, int]:
    """Make the module take exactly the exported graph's inputs and pin the graph's embedding
    width; returns the saved graph and the width. An input the model ignores (DeBERTa's token
    types with type_vocab_size 0) is dropped by the exporter, so the reference must not feed it."""
    import onnx

    graph = onnx.load(str(path))
    graph_inputs = {i.name for i in graph.graph.input}
    input_names = tuple(n for n in module.input_names if n in graph_inputs)
    if input_names[:2] != ("input_ids", "attention_mask"):
        raise ExportError(f"the exported graph takes {sorted(graph_inputs)}; it needs input_ids and attention_mask")
    module.input_names = input_names
    dim = _pin_output_dim(graph, module, input_names)
    onnx.save(graph, str(path))
    return graph, dim


def _write_reference(module: SentenceEmbedding, tokenizer: Any, max_length: int, out_dir: Path) -> int:
    """tokenizer.json, and reference.npz: PyTorch's embeddings of the validation sentences as the
    shipped tokenizer feeds them. Returns how many sentences."""
    tokenizer_path = out_dir / "tokenizer.json"
    save_tokenizer_json(tokenizer, tokenizer_path)
    texts = validation_sentences()
    log.info("export: computing PyTorch reference outputs on %d sentences", len(texts))
    inputs = tokenize_reference(tokenizer_path, tokenizer, texts, max_length, module.input_names)
    embeddings = reference_outputs(module, inputs, module.input_names)
    if not np.isfinite(embeddings).all():
        raise ExportError("the PyTorch model produces non-finite embeddings on the validation set")
    arrays: dict[str, Any] = {
        "task": np.array("text-embedding"),
        "texts": np.array(texts),
        "outputs": embeddings,
        "input_names": np.array(module.input_names),
        **inputs,
    }
    Reference.write(out_dir / REFERENCE_FILE, arrays)
    return len(texts)


def _torch_latency(module: SentenceEmbedding, encoder: Any, max_length: int) -> dict[str, dict[str, float]]:
    """PyTorch's latency as users run it: transformers' default attention, not the eager attention
    the exporter needs (the same math; sdpa is the faster kernel)."""
    log.info("export: measuring PyTorch eager latency")
    try:
        encoder.set_attn_implementation("sdpa")
    except (AttributeError, ValueError):
        pass  # this architecture has only eager attention
    return torch_text_latency(module, module.input_names, max_length, int(encoder.config.vocab_size))


def export_text_embedding(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a checkpoint directory) into `out_dir`; return what was written."""
    model_dir = Path(spec.source)
    weights, family = _check_checkpoint(model_dir)
    pooling_config = read_pooling_config(model_dir)
    t0 = time.perf_counter()
    tokenizer, encoder = _load(model_dir, weights)
    module = _embedding_module(tokenizer, encoder, family, pooling_config)
    limit = _position_limit(encoder, family)
    max_length = _max_length(tokenizer, encoder.config, pooling_config, spec, family, limit)

    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "model.onnx"
    opset = _opset_for(family, spec.opset)
    _export_graph(module, family, model_dir, model_path, opset, int(encoder.config.vocab_size), max_length)
    export_seconds = time.perf_counter() - t0
    graph, dim = _fit_graph(module, model_path)
    samples = _write_reference(module, tokenizer, max_length, out_dir)
    torch_latency = _torch_latency(module, encoder, max_length)

    config = encoder.config
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task="text-embedding",
        name=spec.name,
        source=huggingface_source(config, model_dir, weights),
        inputs=token_id_inputs(module.input_names),
        outputs=[t.spec({"dim": dim}) for t in SIGNATURE.outputs],
        opset=opset,
        model_info=encoder_info(config, family.exporter, family.fuser, hidden_size=dim),
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": model_path.stat().st_size / 1e6,
            "seconds": export_seconds,
            "validation_samples": float(samples),
        },
        torch_latency=torch_latency,
        versions=text_versions(),
        task_settings={
            "tokenizer": tokenizer_settings(tokenizer, max_length, module.input_names),
            "pooling": {"mode": pooling_config["mode"], "normalize": bool(pooling_config["normalize"])},
        },
        extra_files=["tokenizer.json"],
    )
