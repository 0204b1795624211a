"""Export a Hugging Face causal language model as one decoder step with its key/value cache.

The route, chosen by measurement (docs/generation.md): the TorchScript exporter (`dynamo=False`)
over the checkpoint's own transformers modules, wrapped so that the past keys and values are graph
inputs (put into a `DynamicCache` before the model runs) and the present ones graph outputs. The
model's code builds its own masks and positions, so rotary, learned and ALiBi positions, grouped
and multi-query attention, sliding windows and tied embeddings come out as the family defines them
(17 families matched PyTorch's greedy continuations token for token, the coverage table). ONNX
Runtime GenAI's builder writes leaner graphs for ~30 families but not GPT-2 or BLOOM; its int4
graph decoded at 50 tokens/s in ortpack's loop where this route's, quantized the same way, ran
45-51 (Qwen2-0.5B shape, 2 cores).

The reference (reference.npz) is PyTorch's on the shipped prompts (components/core/data/
generation_prompts.jsonl), each tokenized with the shipped tokenizer.json: its greedy
continuation from `generate` (64 tokens, end-of-sequence ids ignored), the teacher-forced
next-token log-probabilities along it (the most likely 1,024 per position: with a 152k vocabulary
the whole rows would be 600 MB), and its perplexity on a shipped text. The chat template is
checked here too: rendered by the kernel's Jinja renderer and tokenized as the server does, it
must give apply_chat_template's ids.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, ModelLoadError, one_line
from ortpack.components.core.exporters.text_common import (
    huggingface_source,
    save_tokenizer_json,
    text_versions,
    weights_file,
)
from ortpack.components.core.graph_files import save_graph
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.timing import decoder_bench_shapes, measure_latency
from ortpack.components.core.validation_data import generation_prompts, perplexity_text
from ortpack.kernel.contracts.text_generation import (
    ATTENTION_MASK,
    CONTEXT_CAP,
    INPUT_IDS,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    TextGenerationOptions,
    TextGenerationSettings,
    cache_names,
    log_softmax,
    past_name,
    present_name,
    signature,
)
from ortpack.kernel.generation.chat import ChatTemplate, ChatTemplateError, load_chat_template, special_tokens_of

log = logging.getLogger("ortpack.export")

CONTINUATION = 64  # greedy tokens per prompt PyTorch's are compared with (fp32 must match them all)
TOP_LOGPROBS = 1024  # per teacher-forced position, the reference keeps this many of PyTorch's log-probabilities
PERPLEXITY_TOKENS = 512  # of the shipped text, at most
# The least opset of a decoder's graph: int4 embedding tables (GatherBlockQuantized) hold int4
# tensors, which ONNX allows from opset 21 (the weight-only quantizer forces 21 onto an older
# graph, which breaks its ReduceMean nodes)
GENERATION_OPSET = 21
# The chat conversations the template is checked on (rendered by the kernel against transformers)
CHAT_CHECKS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "Seven is a prime number."},
        {"role": "user", "content": "And an even one? Antworte auf Deutsch, bitte: über 2."},
    ],
)


class DecoderStep(nn.Module):
    """One decoder step with the cache as tensors: (input_ids, attention_mask, position_ids,
    logits_to_keep, *past) -> (logits of the last `logits_to_keep` positions, *present)."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, logits_to_keep: Any, *past: Any) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        length = input_ids.shape[1]
        kept = torch.arange(length - logits_to_keep[0], length, device=input_ids.device)
        kwargs: dict[str, Any] = {"position_ids": position_ids} if position_ids is not None else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=kept,
            **kwargs,
        )
        present = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def load_causal_lm(model_dir: Path, weights: Path) -> tuple[Any, Any]:
    """(fast tokenizer, model in eval mode, float32) of a local causal-LM checkpoint; each refusal is
    one ModelLoadError line."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable config is a bad checkpoint
        raise ModelLoadError(f"cannot read {model_dir}/config.json: {one_line(exc, 300)}") from None
    if getattr(config, "auto_map", None):
        raise ModelLoadError(f"{model_dir} asks for remote code (auto_map in config.json); ortpack never runs it")
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(
            f"{model_dir} is an encoder-decoder ({config.model_type}); text-generation takes a decoder-only model"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {one_line(exc, 300)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{model_dir} has no fast tokenizer (tokenizer.json); ortpack ships one")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir,
            attn_implementation="eager",
            dtype=torch.float32,
            local_files_only=True,
            use_safetensors=weights.suffix != ".bin",
        )
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(f"{model_dir} is not a causal language model: {one_line(exc, 300)}") from None
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load weights from {weights}: {one_line(exc, 300)}") from None
    return tokenizer, model.eval()


@torch.inference_mode()
def cache_geometry(model: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head width) of the cache the model fills, read off one forward."""
    out = model(input_ids=torch.ones(1, 2, dtype=torch.long), use_cache=True)
    layers = getattr(getattr(out, "cache", None), "layers", None)
    if not layers:  # transformers loads BERT "for causal LM" too, as a model that keeps no cache
        raise ModelLoadError(
            f"{model.config.model_type} keeps no key/value cache when it generates: text-generation takes a "
            "decoder language model (Llama, Qwen, Mistral, Phi, Gemma, GPT-2...)"
        )
    shapes = {tuple(t.shape[1::2]) for layer in layers for t in (layer.keys, layer.values)}
    if len(shapes) != 1:
        raise ExportError(f"layers cache keys and values of different shapes {sorted(shapes)}; not supported yet")
    heads, width = next(iter(shapes))
    return len(layers), int(heads), int(width)


def position_limit(config: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None  # ALiBi models have no table of positions


def context_length(tokenizer: Any, config: Any, spec: ExportSpec) -> int:
    """The context a bundle serves: `max_length` within the model's positions, else the model's
    positions capped at CONTEXT_CAP."""
    wanted = spec.options_as(TextGenerationOptions).max_length
    limit = position_limit(config)
    if wanted is not None:
        if limit is not None and wanted > limit:
            raise ExportError(f"max_length {wanted} exceeds the model's {limit} positions")
        return wanted
    tokenizer_limit = int(getattr(tokenizer, "model_max_length", 0) or 0)
    bounds = [b for b in (limit, tokenizer_limit if 0 < tokenizer_limit < 1 << 30 else None) if b]
    return min([CONTEXT_CAP, *bounds])


def export_graph(step: DecoderStep, path: Path, geometry: tuple[int, int, int], vocab: int, opset: int) -> set[str]:
    """Trace the step into `path` (external data beside it when the weights pass 1.8 GB); returns
    the graph's input names (a model that takes no position ids loses that input)."""
    import onnx

    layers, heads, width = geometry
    batch, length, past = 2, 5, 3
    dummy = (
        torch.randint(0, vocab, (batch, length)),
        torch.ones(batch, past + length, dtype=torch.long),
        torch.arange(past, past + length).expand(batch, length).contiguous(),
        torch.tensor([length]),
        *(torch.randn(batch, heads, past, width) for _ in range(2 * layers)),
    )
    pasts = [past_name(i, kind) for i, kind in cache_names(layers)]
    presents = [present_name(i, kind) for i, kind in cache_names(layers)]
    axes: dict[str, dict[int, str]] = {
        INPUT_IDS.name: INPUT_IDS.dynamic_axes(),
        ATTENTION_MASK.name: ATTENTION_MASK.dynamic_axes(),
        POSITION_IDS.name: POSITION_IDS.dynamic_axes(),
        LOGITS: {0: "batch", 1: "kept"},
        **{name: {0: "batch", 2: "past_sequence"} for name in pasts},
        **{name: {0: "batch", 2: "total_sequence"} for name in presents},
    }
    staging = path.with_name("traced")
    staging.mkdir(exist_ok=True)
    traced = staging / path.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            step,
            dummy,
            str(traced),
            input_names=[INPUT_IDS.name, ATTENTION_MASK.name, POSITION_IDS.name, LOGITS_TO_KEEP.name, *pasts],
            output_names=[LOGITS, *presents],
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )
    graph = onnx.load(str(traced))  # the tracer writes one file per tensor beyond 2 GB: gather them
    save_graph(graph, path)
    for leftover in staging.iterdir():
        leftover.unlink()
    staging.rmdir()
    return {i.name for i in graph.graph.input}


def tokenize_checked(tokenizer_file: Path, hf_tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Each text's ids from the shipped tokenizer.json as the server encodes a completion prompt
    (special tokens as the tokenizer adds them), checked against the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    shipped = Tokenizer.from_file(str(tokenizer_file))
    ids = [e.ids for e in shipped.encode_batch(texts)]
    expected = [list(x) for x in hf_tokenizer(texts)["input_ids"]]
    empty = [text for text, found in zip(texts, expected, strict=True) if not found]
    if empty:
        raise ExportError(f"the tokenizer gives no token ids for {len(empty)} of the prompts (first: {empty[0]!r})")
    mismatched = [i for i, (a, b) in enumerate(zip(ids, expected, strict=True)) if a != b]
    if mismatched:
        raise ExportError(
            f"tokenizer.json disagrees with the checkpoint tokenizer on {len(mismatched)} of {len(texts)} prompts "
            f"(first: {texts[mismatched[0]]!r})"
        )
    return ids


def check_chat_template(template: str, tokenizer_file: Path, hf_tokenizer: Any, special: dict[str, str]) -> int:
    """Render CHAT_CHECKS with the kernel's renderer and tokenize them as the server will; each must
    give apply_chat_template's ids. Returns how many were checked (a conversation the template
    itself refuses, such as a system turn Gemma does not take, is skipped)."""
    from tokenizers import Tokenizer

    shipped = Tokenizer.from_file(str(tokenizer_file))
    renderer = ChatTemplate(source=template, special_tokens=special)
    checked = 0
    for messages in CHAT_CHECKS:
        try:
            expected = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - the template refuses this conversation; so will the server
            try:
                renderer.render(messages, add_generation_prompt=True)
            except ChatTemplateError:
                continue
            raise ExportError(
                "the chat template refuses a conversation in transformers but renders it in ortpack"
            ) from None
        expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)  # a BatchEncoding
        text = renderer.render(messages, add_generation_prompt=True)
        got = shipped.encode(text, add_special_tokens=False).ids
        if got != expected:
            raise ExportError(
                f"the chat template renders {text[:80]!r}... to other token ids than transformers' "
                "apply_chat_template; it cannot be served faithfully"
            )
        checked += 1
    return checked


@torch.inference_mode()
def greedy_reference(model: Any, prompts: list[list[int]], pad_id: int) -> list[np.ndarray]:
    """PyTorch's `generate` greedy continuations, CONTINUATION tokens each, end-of-sequence ids
    ignored (`eos_token_id=[]`; None would take the model's): the checks compare every token."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=CONTINUATION, do_sample=False, eos_token_id=[], pad_token_id=pad_id, num_beams=1
    )
    out = []
    for ids in prompts:
        tokens = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)), generation_config=config)
        out.append(tokens[0, len(ids) :].numpy().astype(np.int64))
    return out


@torch.inference_mode()
def teacher_forced(model: nn.Module, prompt: list[int], continuation: np.ndarray) -> np.ndarray:
    """PyTorch's logits at each continuation position given everything before it."""
    ids = torch.tensor([[*prompt, *continuation[:-1].tolist()]])
    return model(input_ids=ids).logits[0, -len(continuation) :].float().numpy()


@torch.inference_mode()
def perplexity(model: nn.Module, ids: list[int]) -> float:
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().numpy()
    logp = log_softmax(logits)
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def top_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` most likely tokens per row and their log-probabilities, best first."""
    logp = log_softmax(logits)
    k = min(k, logp.shape[1])
    ids = np.argpartition(-logp, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(logp, ids, axis=1), axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    return ids.astype(np.int32), np.take_along_axis(logp, ids, axis=1).astype(np.float32)


def bench_inputs(batch: int, new: int, past: int, geometry: tuple[int, int, int], vocab: int) -> dict[str, Any]:
    """Random token ids and a random cache of one benchmark shape, as the graph takes them."""
    layers, heads, width = geometry
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {
        INPUT_IDS.name: rng.integers(0, vocab, (batch, new), dtype=np.int64),
        ATTENTION_MASK.name: np.ones((batch, past + new), np.int64),
        POSITION_IDS.name: np.broadcast_to(np.arange(past, past + new, dtype=np.int64), (batch, new)).copy(),
        LOGITS_TO_KEEP.name: np.array([1], np.int64),
    }
    for i, kind in cache_names(layers):
        feeds[past_name(i, kind)] = rng.standard_normal((batch, heads, past, width)).astype(np.float32)
    return feeds


def torch_latency(step: DecoderStep, geometry: tuple[int, int, int], context: int, vocab: int) -> dict[str, Any]:
    """PyTorch eager's latency at the benchmark shapes (transformers' default attention, sdpa)."""
    log.info("export: measuring PyTorch eager latency")
    model: Any = step.model
    try:
        model.set_attn_implementation("sdpa")
    except (AttributeError, ValueError):
        pass  # this architecture has only eager attention
    latency = {}
    with torch.inference_mode():
        for key, (batch, new, past) in decoder_bench_shapes(context).items():
            feeds = bench_inputs(batch, new, past, geometry, vocab)
            args = [torch.from_numpy(a) for a in feeds.values()]
            latency[key] = measure_latency(partial(step, *args), budget_s=3.0)
    return latency


def generation_defaults(model: Any, tokenizer: Any) -> dict[str, Any]:
    """The manifest's generation section: end-of-sequence ids (generation_config.json's, else the
    config's and the tokenizer's), BOS, and sampling defaults where the checkpoint samples."""
    gen = getattr(model, "generation_config", None)
    eos: list[int] = []
    for source in (getattr(gen, "eos_token_id", None), model.config.eos_token_id, tokenizer.eos_token_id):
        ids = source if isinstance(source, list) else [source] if source is not None else []
        eos += [int(i) for i in ids if int(i) not in eos]
    if not eos:
        raise ExportError("the checkpoint names no end-of-sequence token (generation_config.json or config.json)")
    bos = getattr(gen, "bos_token_id", None) or model.config.bos_token_id
    defaults: dict[str, Any] = {"eos_token_ids": eos, "bos_token_id": int(bos) if bos is not None else None}
    if gen is not None and getattr(gen, "do_sample", False):
        defaults["temperature"] = float(gen.temperature if gen.temperature is not None else 1.0)
        defaults["top_p"] = float(gen.top_p if gen.top_p is not None else 1.0)
        defaults["top_k"] = int(gen.top_k or 0)
    return defaults


def export_text_generation(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a causal-LM checkpoint directory) into `out_dir`; return what was written."""
    model_dir = Path(spec.source)
    weights = weights_file(model_dir)
    t0 = time.perf_counter()
    tokenizer, model = load_causal_lm(model_dir, weights)
    config = model.config
    geometry = cache_geometry(model)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    context = context_length(tokenizer, config, spec)
    opset = max(spec.opset, GENERATION_OPSET)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "model.onnx"
    # eval() on the wrapper: the exporter returns a module to the mode it found it in, and a new
    # module starts in training mode, which would give the model's dropout (GPT-2, OPT: 0.1) to
    # every PyTorch reference computed after the trace
    step = DecoderStep(model, geometry[0]).eval()
    log.info("export: tracing one decoder step (%d layers, %d kv heads of %d)", *geometry)
    try:
        inputs = export_graph(step, model_path, geometry, vocab, opset)
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - any exporter failure means this model cannot be exported
        raise ExportError(f"cannot export {model_dir} to ONNX: {one_line(exc, 300)}") from None
    model.eval()  # the PyTorch reference below runs as users run the model
    export_seconds = time.perf_counter() - t0

    save_tokenizer_json(tokenizer, out_dir / "tokenizer.json")
    extra = ["tokenizer.json"]
    chat: dict[str, Any] | None = None
    special = special_tokens_of(json.loads((model_dir / "tokenizer_config.json").read_text()))
    template = load_chat_template(model_dir)
    chat_checked = 0
    if template is not None:
        chat_checked = check_chat_template(template, out_dir / "tokenizer.json", tokenizer, special)
        (out_dir / "chat_template.jinja").write_text(template)
        extra.append("chat_template.jinja")
        chat = {"file": "chat_template.jinja", "special_tokens": special}

    prompts = tokenize_checked(out_dir / "tokenizer.json", tokenizer, list(generation_prompts()))
    log.info("export: PyTorch greedy continuations of %d prompts, %d tokens each", len(prompts), CONTINUATION)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    continuations = greedy_reference(model, prompts, pad)
    logits = np.concatenate([teacher_forced(model, p, c) for p, c in zip(prompts, continuations, strict=True)])
    top_ids, top_logp = top_logprobs(logits, TOP_LOGPROBS)
    text_ids = tokenizer(perplexity_text())["input_ids"][: min(PERPLEXITY_TOKENS, context)]
    distinct = max(len(set(c.tolist())) for c in continuations)
    Reference.write(
        out_dir / REFERENCE_FILE,
        {
            "task": np.array("text-generation"),
            "input_names": np.array(sorted(inputs)),
            "outputs": top_logp,  # what the export step's spread check reads
            "top_ids": top_ids,
            "prompt_ids": np.concatenate([np.asarray(p, np.int64) for p in prompts]),
            "prompt_ends": np.cumsum([len(p) for p in prompts]).astype(np.int64),
            "texts": np.array(generation_prompts()),
            "continuations": np.stack(continuations),
            "perplexity_ids": np.asarray(text_ids, np.int64),
            "perplexity": np.array(perplexity(model, text_ids)),
        },
    )
    latency = torch_latency(step, geometry, context, vocab)

    layers, heads, width = geometry
    graph_mb = sum(p.stat().st_size for p in out_dir.glob("model.onnx*")) / 1e6
    settings: dict[str, Any] = {
        "tokenizer": {
            "file": "tokenizer.json",
            "max_length": context,
            "truncation": False,
            "padding": "longest",
            "pad_token_id": pad,
            "model_input_names": [INPUT_IDS.name, ATTENTION_MASK.name],
        },
        "decoder": {
            "model_type": str(config.model_type),
            "layers": layers,
            "kv_heads": heads,
            "head_dim": width,
            "vocab_size": vocab,
            "position_ids": POSITION_IDS.name in inputs,
            "sliding_window": getattr(config, "sliding_window", None) or None,
        },
        "generation": generation_defaults(model, tokenizer),
        "chat": chat,
    }
    tensors = signature(TextGenerationSettings.model_validate(settings))
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task="text-generation",
        name=spec.name,
        source=huggingface_source(config, model_dir, weights),
        inputs=[t.spec() for t in tensors.inputs if t.name in inputs],
        outputs=[t.spec() for t in tensors.outputs],
        opset=opset,
        model_info={
            "model_type": str(config.model_type),
            "exporter": "torchscript",
            "fuser": "none",
            "num_heads": int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0)),
            "hidden_size": int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0)),
            "vocab_size": vocab,
            "num_layers": layers,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "context": context,
            "chat_template_checked": chat_checked,
            "distinct_greedy_tokens": distinct,
        },
        metrics={
            "nodes": float(_node_count(model_path)),
            "mb": graph_mb,
            "seconds": export_seconds,
            "validation_samples": float(len(prompts)),
        },
        torch_latency=latency,
        versions=text_versions(),
        task_settings=settings,
        extra_files=extra,
    )


def _node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)
