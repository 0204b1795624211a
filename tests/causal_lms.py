"""Tiny causal language models for tests, built offline: a byte-level BPE tokenizer trained on the
project's shipped texts, and a random-weight checkpoint per decoder family (nothing downloaded).

Random weights are chosen per family so that greedy continuations vary (a model that repeats one
token proves nothing about the cache or the positions) and their top-1 leads its runner-up by a
margin far above float noise: `initializer_range` is the knob (Gemma scales its embeddings by
sqrt(hidden) and wants a small one; GPT-2, OPT and BLOOM collapse to one token below 0.2).
Measured on 3 prompts x 64 tokens: distinct tokens 30-60 per continuation, the least margin
1e-4 to 1e-2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# ChatML, as Qwen2's checkpoints write it (a system turn added when there is none)
CHATML = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 1024

# model_type -> (config overrides, initializer_range): 2 layers, 64 wide, GQA where the family has it
_COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
FAMILIES: dict[str, tuple[dict[str, Any], float]] = {
    "llama": (_COMMON, 0.2),
    "qwen2": ({**_COMMON, "sliding_window": 16, "use_sliding_window": True, "max_window_layers": 1}, 0.2),
    "qwen3": ({**_COMMON, "head_dim": 16}, 0.2),
    "mistral": ({**_COMMON, "sliding_window": 16}, 0.2),
    "phi3": ({**_COMMON, "pad_token_id": 0}, 0.2),
    "gemma2": ({**_COMMON, "head_dim": 16, "sliding_window": 16, "query_pre_attn_scalar": 16}, 0.02),
    "gemma3_text": ({**_COMMON, "head_dim": 16, "sliding_window": 16, "query_pre_attn_scalar": 16}, 0.02),
    "gpt2": ({"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512}, 0.2),
    "granite": (_COMMON, 0.2),
    "olmo": (_COMMON, 0.2),
    "stablelm": (_COMMON, 0.2),
    "phi": (_COMMON, 0.2),
    "gpt_neox": ({**_COMMON, "num_key_value_heads": 4}, 0.2),
    # ALiBi positions, no position ids
    "bloom": ({"hidden_size": 64, "n_layer": 2, "n_head": 4}, 0.4),
    # learned positions (offset by 2), no GQA
    "opt": (
        {
            "hidden_size": 64,
            "ffn_dim": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 512,
            "word_embed_proj_dim": 64,
        },
        0.4,
    ),
    # multi-query attention (one key/value head)
    "falcon": (
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "multi_query": True, "alibi": False},
        0.2,
    ),
    "gpt_bigcode": ({"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512, "multi_query": True}, 0.2),
}


def training_texts() -> list[str]:
    """The shipped texts the tokenizer learns from: validation sentences, prompts, the perplexity text."""
    from ortpack.components.core.validation_data import validation_sentences

    data = Path(__file__).resolve().parents[1] / "components" / "core" / "data"
    prompts = [json.loads(line)["prompt"] for line in (data / "generation_prompts.jsonl").read_text().splitlines()]
    return [*validation_sentences(), *prompts, *(data / "perplexity_text.txt").read_text().split("\n\n")]


def make_bpe_tokenizer(out: Path, *, chat_template: str | None = CHATML) -> Any:
    """A byte-level BPE tokenizer of VOCAB_SIZE ids (the three ChatML specials first) saved in `out`
    as transformers writes it (tokenizer.json, tokenizer_config.json, chat_template.jinja);
    returns the PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def make_tiny_causal_lm(model_type: str, out: Path, *, seed: int = 0, train_steps: int = 0, **overrides: Any) -> Path:
    """A 2-layer checkpoint of `model_type` (a key of FAMILIES) with the BPE tokenizer, its
    generation config naming <|im_end|> and <|endoftext|> as end-of-sequence ids: random weights,
    or trained for `train_steps` steps on the shipped texts (`train`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    fields, init = FAMILIES[model_type]
    tokenizer = make_bpe_tokenizer(out)
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    config = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB_SIZE,
        initializer_range=init,
        bos_token_id=None,
        eos_token_id=eos[0],
        **{**fields, **overrides},
    )
    if hasattr(config, "init_std"):  # OPT names it so
        config.init_std = init
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    if train_steps:
        train(model, tokenizer, train_steps, seed=seed)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1])
    model.save_pretrained(out, safe_serialization=True)
    return out


def train(model: Any, tokenizer: Any, steps: int, *, seed: int = 0, batch: int = 16, length: int = 64) -> float:
    """Train `model` in place on the shipped texts (AdamW, next-token loss on random windows of the
    texts joined by <|im_end|>); returns the last loss. A random tiny model's next-token
    distribution is nearly flat (perplexity ~3,600 over 1,024 ids), which makes every
    quantization look worse than on a real model; 200 steps (~25 s on 2 cores) bring the tiny
    Llama's perplexity on the shipped text to ~280 and give its int8 and int4 variants something
    to keep. It is still not a language model: the int4 gate's defaults are set for real ones."""
    import torch

    ids = [i for text in training_texts() for i in [*tokenizer(text)["input_ids"], tokenizer.eos_token_id]]
    data = torch.tensor(ids)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
        windows = torch.stack([data[s : s + length] for s in starts])
        loss = model(input_ids=windows, labels=windows).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss)
