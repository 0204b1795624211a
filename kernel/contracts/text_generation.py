"""The text-generation contract: a decoder language model that produces text token by token with a
key/value cache (Llama, Qwen, Mistral, Phi-3, Gemma, GPT-2, BLOOM...), its tokenizer, chat
template and generation defaults, and a gate on next-token distributions, greedy continuations
and perplexity.

The graph is one step of the decoder, called for a prompt chunk (prefill) or one new token per
sequence (decode): token ids, the attention mask over the whole cache and the new tokens, their
positions, and the past keys and values of every layer in; the logits of the last
`logits_to_keep` positions and the present keys and values (the past with the new tokens'
appended) out. The names are Optimum's and ONNX Runtime GenAI's (`past_key_values.N.key`,
`present.N.key`). Batch, sequence and past lengths are dynamic; the cache's heads and width are
the model's. A family without position ids (ALiBi: BLOOM) has a graph without that input.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ortpack.kernel.contracts.base import TEXT_REQUEST, Strict, TaskContract, TextOptions, TextSettings
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import ceiling, floor, gate_table

KV_DTYPES = {"float32": 4, "float16": 2}


class TextGenerationOptions(TextOptions):
    """A decoder's export options: `max_length` is the context (prompt and completion together) the
    bundle serves, at most the model's positions (default: those, capped at CONTEXT_CAP)."""


# A context longer than this is not exported by default: a 128k-position model's every request
# would otherwise reserve its cache for 128k tokens (--max-length raises it)
CONTEXT_CAP = 8192


class DecoderSettings(Strict):
    """The cache's geometry and what the graph takes: what the server allocates and feeds."""

    model_type: str
    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    kv_dtype: Literal["float32", "float16"] = "float32"
    position_ids: bool = True  # ALiBi families (BLOOM) take none: positions come from the mask
    sliding_window: int | None = None  # the widest window a layer attends over (informative)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes the cache holds per token of one sequence: keys and values of every layer."""
        return self.layers * 2 * self.kv_heads * self.head_dim * KV_DTYPES[self.kv_dtype]


class ChatSettings(Strict):
    """The checkpoint's chat template (Jinja, rendered as transformers renders it) and the special
    tokens it may name (`bos_token`, `eos_token`...)."""

    file: str = "chat_template.jinja"
    special_tokens: dict[str, str] = Field(default_factory=dict)


class GenerationDefaults(Strict):
    """What generation_config.json says: the ids that end a sequence, and the sampling a request
    gets when it names none (OpenAI's defaults where the checkpoint does not sample)."""

    eos_token_ids: list[int] = Field(min_length=1)
    bos_token_id: int | None = None
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)


class TextGenerationSettings(TextSettings):
    task: Literal["text-generation"] = "text-generation"
    decoder: DecoderSettings
    generation: GenerationDefaults
    chat: ChatSettings | None = None

    def shared_files(self) -> list[str]:
        return [self.tokenizer.file, *([self.chat.file] if self.chat is not None else [])]


INPUT_IDS = Tensor("input_ids", "int64", (BATCH, "sequence"))
ATTENTION_MASK = Tensor("attention_mask", "int64", (BATCH, "total_sequence"))
POSITION_IDS = Tensor("position_ids", "int64", (BATCH, "sequence"), optional=True)
# how many of the last positions get logits: 1 while generating (a 152k-token vocabulary's logits
# for a 2,000-token prompt would be 1.2 GB), every position for teacher-forced checks
LOGITS_TO_KEEP = Tensor("logits_to_keep", "int64", (1,))
LOGITS = "logits"


def past_name(layer: int, kind: str) -> str:
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"


def cache_names(layers: int) -> list[tuple[int, str]]:
    """(layer, "key"/"value") in the graph's order: every layer's key, then its value."""
    return [(layer, kind) for layer in range(layers) for kind in ("key", "value")]


def signature(settings: TextGenerationSettings) -> Signature:
    """The step graph's tensors for this decoder's cache geometry."""
    d = settings.decoder
    past = tuple(
        Tensor(past_name(i, kind), d.kv_dtype, (BATCH, d.kv_heads, "past_sequence", d.head_dim))
        for i, kind in cache_names(d.layers)
    )
    present = tuple(
        Tensor(present_name(i, kind), d.kv_dtype, (BATCH, d.kv_heads, "total_sequence", d.head_dim))
        for i, kind in cache_names(d.layers)
    )
    return Signature(
        inputs=(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS_TO_KEEP, *past),
        outputs=(Tensor(LOGITS, "float32", (BATCH, "kept", d.vocab_size)), *present),
        request=TEXT_REQUEST,
    )


CONTRACT = TaskContract(
    name="text-generation",
    options=TextGenerationOptions,
    settings=TextGenerationSettings,
    signature=signature,
    gates=gate_table(
        # teacher-forced along PyTorch's greedy continuations of the shipped prompts
        floor("top1_agreement"),
        ceiling("mean_kl"),
        ceiling("max_abs_diff"),  # of log-probabilities
        # the shortest greedy continuation that matches PyTorch's token for token, as a share of its length
        floor("greedy_match"),
        # on a shipped text: the variant's perplexity over PyTorch's
        ceiling("perplexity_ratio"),
    ),
    engine="ortpack.kernel.engines.text_generation",
    plugin="ortpack.serving.tasks.text_generation",
)


# ---------------------------------------------------------------- the gate's arithmetic


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of logits to log-probabilities, in float64."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def distribution_metrics(top_ids: np.ndarray, top_logp: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """A variant's next-token distributions (`candidate`: logits `[positions, vocab]`) against
    PyTorch's, which the reference keeps as its most likely tokens per position (`top_ids`,
    `top_logp`, best first; the whole vocabulary for small ones): the share of positions whose top
    token is kept; KL(PyTorch || variant) per position in nats (mean and max; over the kept tokens
    plus the rest of the vocabulary as one outcome, which is exact when every token is kept and a
    lower bound otherwise); and the largest |difference| of log-probabilities among the tokens
    PyTorch gives at least 1e-4 (the far tail of a 152k vocabulary is noise in any precision)."""
    ref = top_logp.astype(np.float64)
    cand_all = log_softmax(candidate)
    cand = np.take_along_axis(cand_all, top_ids.astype(np.int64), axis=1)
    p = np.exp(ref)
    kl = (p * (ref - cand)).sum(axis=1)
    rest_p = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    rest_q = np.clip(1.0 - np.exp(cand).sum(axis=1), 1e-30, 1.0)
    tail = rest_p > 1e-12
    kl[tail] += rest_p[tail] * (np.log(rest_p[tail]) - np.log(rest_q[tail]))
    likely = ref > np.log(1e-4)
    return {
        "top1_agreement": float(np.mean(cand_all.argmax(axis=1) == top_ids[:, 0])),
        "mean_kl": float(max(kl.mean(), 0.0)),
        "max_kl": float(max(kl.max(), 0.0)),
        "max_abs_diff": float(np.abs(ref - cand)[likely].max()) if likely.any() else 0.0,
        "positions": float(len(ref)),
    }


def matched_prefix(reference: np.ndarray, candidate: np.ndarray) -> int:
    """How many tokens of `candidate` match `reference` from the start."""
    n = min(len(reference), len(candidate))
    differ = np.flatnonzero(np.asarray(reference[:n]) != np.asarray(candidate[:n]))
    return int(differ[0]) if len(differ) else n


def greedy_metrics(references: list[np.ndarray], candidates: list[np.ndarray]) -> dict[str, float]:
    """Greedy continuations against PyTorch's: the least and mean share matched from the start."""
    shares = [matched_prefix(r, c) / max(len(r), 1) for r, c in zip(references, candidates, strict=True)]
    return {"greedy_match": float(min(shares)), "mean_greedy_match": float(np.mean(shares))}
