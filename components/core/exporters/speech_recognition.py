"""Export a Hugging Face Whisper checkpoint as the two graphs the generation engine runs
(ortpack.kernel.generation.whisper says what each takes and gives).

- `encoder.onnx`: Whisper's log-mel front end (audio_common.py, within 1e-4 of
  WhisperFeatureExtractor) composed with the encoder and every decoder layer's cross-attention key
  and value projections: waveforms in, the cross keys and values out, once per 30 s window.
- `decoder.onnx`: one decoder step, the text-generation contract's (past and present self-attention
  keys and values, explicit positions, `logits_to_keep`) with the cross keys and values as inputs.

The route is text generation's: the TorchScript exporter over the checkpoint's own transformers
modules. The step puts the past into an `EncoderDecoderCache` whose cross-attention half holds the
graph's cross inputs, marked as computed, so the model's attention reads them where `generate`
reads its cached ones; positions come in explicitly (Whisper's are learned), so a left-padded
batch of sequences keeps each row's own.
"""

from __future__ import annotations

import dataclasses
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
from ortpack.components.core.exporters.audio_common import FEATURES_NAME, log_mel_settings, whisper_log_mel_graph
from ortpack.components.core.exporters.text_common import (
    huggingface_source,
    save_tokenizer_json,
    text_versions,
    weights_file,
)
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.timing import measure_latency
from ortpack.components.core.validation_data import speech_clips
from ortpack.kernel.contracts.automatic_speech_recognition import (
    BENCH_BATCHES,
    ENCODER_FILE,
    GATE_MAX_TOKENS,
    TASK,
    SpeechRecognitionSettings,
    decode_step_feeds,
    signature,
)
from ortpack.kernel.contracts.text_generation import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    cache_names,
    past_name,
    present_name,
)
from ortpack.kernel.generation.whisper import AUDIO, WhisperSettings, cross_names, prompt_ids, whisper_settings

log = logging.getLogger("ortpack.export")

SPEECH_OPSET = 17  # the front end's floor (audio_common.MIN_OPSET); Whisper needs nothing later
DECODER_FILE = "decoder.onnx"  # where tests and benchmarks put the decoder (a bundle's is the variant's model.onnx)


class CrossKeyValues(nn.Module):
    """Log-mel features to every decoder layer's cross-attention keys and values:
    `[batch, mels, frames]` -> (layer 0 key, layer 0 value, layer 1 key, ...) `[batch, heads, 1500, head_dim]`."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.encoder: Any = model.model.encoder
        self.layers: Any = model.model.decoder.layers

    def forward(self, input_features: Any) -> Any:
        states = self.encoder(input_features).last_hidden_state
        batch = states.shape[0]
        out = []
        for layer in self.layers:
            attn = layer.encoder_attn
            for proj in (attn.k_proj, attn.v_proj):
                out.append(proj(states).view(batch, -1, attn.num_heads, attn.head_dim).transpose(1, 2).contiguous())
        return tuple(out)


class WhisperDecoderStep(nn.Module):
    """One decoder step: (input_ids, attention_mask, position_ids, logits_to_keep, *past, *cross) ->
    (logits of the last `logits_to_keep` positions, *present)."""

    def __init__(self, model: Any, layers: int) -> None:
        super().__init__()
        self.decoder: Any = model.model.decoder
        self.proj_out: Any = model.proj_out
        self.layers = layers

    def forward(
        self, input_ids: Any, attention_mask: Any, position_ids: Any, logits_to_keep: Any, *tensors: Any
    ) -> Any:
        from transformers import DynamicCache, EncoderDecoderCache

        past, cross = tensors[: 2 * self.layers], tensors[2 * self.layers :]
        own, encoded = DynamicCache(), DynamicCache()
        for layer in range(self.layers):
            own.update(past[2 * layer], past[2 * layer + 1], layer)
            encoded.update(cross[2 * layer], cross[2 * layer + 1], layer)
        cache = EncoderDecoderCache(own, encoded)
        for layer in range(self.layers):
            cache.is_updated[layer] = True  # the cross half is computed: attention reads it as it is
        # the cross-attention layers need encoder states to know they attend across; their keys
        # and values come from the cache, so this placeholder's values are never read
        placeholder = cross[0][:, 0, :1, :1].expand(-1, 1, self.decoder.config.d_model)
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=placeholder,
            cache=cache,
            position_ids=position_ids,
            use_cache=True,
        )
        length = input_ids.shape[1]
        kept = out.last_hidden_state[:, length - logits_to_keep[0] :]
        present = [t for layer in out.cache.self_attention_cache.layers for t in (layer.keys, layer.values)]
        return (self.proj_out(kept), *present)


def load_whisper(model_dir: Path) -> tuple[Any, Any, Any]:
    """(tokenizer, feature extractor, model in eval mode, float32) of a local Whisper checkpoint;
    each refusal is one ModelLoadError line."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable config is a bad checkpoint
        raise ModelLoadError(f"cannot read {model_dir}/config.json: {one_line(exc, 300)}") from None
    if config.model_type != "whisper":
        raise ModelLoadError(
            f"{model_dir} is a {config.model_type!r} model; automatic-speech-recognition takes Whisper"
        )
    try:
        tokenizer = WhisperTokenizer.from_pretrained(model_dir, local_files_only=True)
        features = WhisperFeatureExtractor.from_pretrained(model_dir, local_files_only=True)
        model = WhisperForConditionalGeneration.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load the Whisper checkpoint in {model_dir}: {one_line(exc, 300)}") from None
    return tokenizer, features, model.eval()


def settings_of(model: Any) -> WhisperSettings:
    return whisper_settings(model.config, model.generation_config)


def _export(module: nn.Module, args: tuple[Any, ...], path: Path, **kwargs: Any) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, str(path), opset_version=SPEECH_OPSET, dynamo=False, do_constant_folding=True, **kwargs
        )


def export_encoder(model: Any, feature_extractor: Any, path: Path) -> None:
    """The front end and the cross projections as one graph: `audio` -> `cross_key_values.*`."""
    import onnx
    from onnx import compose

    settings = settings_of(model)
    names = cross_names(settings.layers)
    traced = path.with_name(path.stem + ".traced.onnx")
    mels = log_mel_settings(feature_extractor)
    _export(
        CrossKeyValues(model),
        (torch.zeros(1, mels.n_mels, mels.frames),),
        traced,
        input_names=[FEATURES_NAME],
        output_names=names,
        dynamic_axes={FEATURES_NAME: {0: "batch"}, **{n: {0: "batch"} for n in names}},
    )
    encoder = onnx.load(str(traced))
    traced.unlink()
    front = whisper_log_mel_graph(mels, opset=SPEECH_OPSET)
    front.ir_version = encoder.ir_version
    merged = compose.merge_models(front, encoder, io_map=[(FEATURES_NAME, FEATURES_NAME)])
    opsets = {o.domain: o.version for o in merged.opset_import}  # both graphs import the default domain
    del merged.opset_import[:]
    merged.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items())
    onnx.checker.check_model(merged)
    onnx.save(merged, str(path))
    assert [i.name for i in merged.graph.input] == [AUDIO]


def export_decoder(model: Any, path: Path) -> None:
    """One decoder step with the self-attention cache and the cross keys and values as inputs."""
    s = settings_of(model)
    batch, length, past = 2, 3, 4
    pasts = [past_name(i, kind) for i, kind in cache_names(s.layers)]
    presents = [present_name(i, kind) for i, kind in cache_names(s.layers)]
    cross = cross_names(s.layers)
    dummy = (
        torch.randint(0, s.vocab_size, (batch, length)),
        torch.ones(batch, past + length, dtype=torch.long),
        torch.arange(past, past + length).expand(batch, length).contiguous(),
        torch.tensor([length]),
        *(torch.randn(batch, s.heads, past, s.head_dim) for _ in pasts),
        *(torch.randn(batch, s.heads, s.frames, s.head_dim) for _ in cross),
    )
    _export(
        WhisperDecoderStep(model, s.layers),
        dummy,
        path,
        input_names=[INPUT_IDS.name, ATTENTION_MASK.name, POSITION_IDS.name, LOGITS_TO_KEEP.name, *pasts, *cross],
        output_names=[LOGITS, *presents],
        dynamic_axes={
            INPUT_IDS.name: INPUT_IDS.dynamic_axes(),
            ATTENTION_MASK.name: ATTENTION_MASK.dynamic_axes(),
            POSITION_IDS.name: POSITION_IDS.dynamic_axes(),
            LOGITS: {0: "batch", 1: "kept"},
            **{name: {0: "batch", 2: "past_sequence"} for name in pasts},
            **{name: {0: "batch", 2: "total_sequence"} for name in presents},
            **{name: {0: "batch"} for name in cross},
        },
    )


def greedy_reference(model: Any, features: Any, clips: list[np.ndarray], language: str | None) -> list[list[int]]:
    """PyTorch's greedy transcript of each clip, one window each (`generate`, no timestamps, at most
    GATE_MAX_TOKENS): the tokens after the prompt, without the end of text."""
    eos = int(model.generation_config.eos_token_id)
    out = []
    for clip in clips:
        feats = features(clip, sampling_rate=features.sampling_rate, return_tensors="pt").input_features
        with torch.inference_mode():
            ids = model.generate(
                feats,
                language=language,
                task="transcribe",
                return_timestamps=False,
                num_beams=1,
                max_new_tokens=GATE_MAX_TOKENS,
            )
        out.append([int(t) for t in ids[0].tolist() if t != eos])
    return out


def first_logprobs(model: Any, features: Any, clips: list[np.ndarray], prompt: list[int]) -> np.ndarray:
    """PyTorch's log-probabilities of each clip's first transcript token `[clips, vocab]`: what the
    export step's spread check reads (random weights give nearly the same row for every clip)."""
    rows = []
    for clip in clips:
        feats = features(clip, sampling_rate=features.sampling_rate, return_tensors="pt").input_features
        with torch.inference_mode():
            logits = model(input_features=feats, decoder_input_ids=torch.tensor([prompt])).logits[0, -1]
        rows.append(torch.log_softmax(logits.double(), -1).numpy())
    return np.stack(rows)


def torch_latency(model: Any, section: SpeechRecognitionSettings) -> dict[str, dict[str, float]]:
    """PyTorch eager's decoder step at the benchmark's shapes (the variants' are timed on the same
    feeds), in ms."""
    step = WhisperDecoderStep(model, section.whisper.layers).eval()
    out = {}
    for batch in BENCH_BATCHES:
        feeds = decode_step_feeds(section.whisper, batch)
        args = tuple(torch.from_numpy(v) for v in feeds.values())

        def call(args: tuple[Any, ...] = args) -> None:
            with torch.inference_mode():
                step(*args)

        out[f"decode_b{batch}"] = measure_latency(call, warmup=2, min_iters=10, max_iters=100, budget_s=2.0)
    return out


def export_speech_recognition(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a Whisper checkpoint directory) into `out_dir`: the decoder step as
    model.onnx, the encoder as encoder.onnx, tokenizer.json and PyTorch's transcripts of the shipped
    speech (reference.npz)."""
    model_dir = Path(spec.source)
    weights = weights_file(model_dir)
    started = time.perf_counter()
    tokenizer, features, model = load_whisper(model_dir)
    settings = settings_of(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info(
        "export: Whisper %s, %d decoder layers, encoder with the log-mel front end", model_dir.name, settings.layers
    )
    try:
        export_encoder(model, features, out_dir / ENCODER_FILE)
        export_decoder(model, out_dir / "model.onnx")
    except Exception as exc:  # noqa: BLE001 - any exporter failure means this model cannot be exported
        raise ExportError(f"cannot export {model_dir} to ONNX: {one_line(exc, 300)}") from None
    seconds = time.perf_counter() - started
    save_tokenizer_json(tokenizer, out_dir / "tokenizer.json")

    clips = list(speech_clips())
    if any(c.sampling_rate != settings.sampling_rate for c in clips):
        raise ExportError(f"the shipped speech is not at the model's {settings.sampling_rate} Hz")
    samples = [c.samples for c in clips]
    language = "en" if settings.multilingual else None
    prompt = prompt_ids(settings, language=language)
    log.info("export: PyTorch's greedy transcripts of %d shipped clips", len(clips))
    transcripts = greedy_reference(model, features, samples, language)
    section = dataclasses.asdict(settings)
    task_settings = {"whisper": section, "tokenizer_file": "tokenizer.json", "encoder_file": ENCODER_FILE}
    task_section = SpeechRecognitionSettings.model_validate(task_settings)
    Reference.write(
        out_dir / REFERENCE_FILE,
        {
            "task": np.array(TASK),
            "input_names": np.array(sorted(i.name for i in signature(task_section).inputs)),
            "outputs": first_logprobs(model, features, samples, prompt),
            "audio": np.concatenate(samples),
            "audio_ends": np.cumsum([len(s) for s in samples]).astype(np.int64),
            "prompt": np.asarray(prompt, np.int64),
            "tokens": np.asarray([t for ts in transcripts for t in ts], np.int64),
            "token_ends": np.cumsum([len(t) for t in transcripts]).astype(np.int64),
            "texts": np.array([c.text for c in clips]),
            "names": np.array([c.name for c in clips]),
        },
    )
    tensors = signature(task_section)
    config = model.config
    graph_mb = sum(p.stat().st_size for p in out_dir.glob("*.onnx")) / 1e6
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task=TASK,
        name=spec.name,
        source=huggingface_source(config, model_dir, weights),
        inputs=[t.spec() for t in tensors.inputs],
        outputs=[t.spec() for t in tensors.outputs],
        opset=SPEECH_OPSET,
        model_info={
            "model_type": "whisper",
            "exporter": "torchscript",
            "fuser": "none",
            "num_heads": settings.heads,
            "hidden_size": int(config.d_model),
            "vocab_size": settings.vocab_size,
            "num_layers": settings.layers,
            "encoder_layers": int(config.encoder_layers),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "multilingual": settings.multilingual,
        },
        metrics={
            "nodes": float(_node_count(out_dir / "model.onnx")),
            "encoder_nodes": float(_node_count(out_dir / ENCODER_FILE)),
            "mb": graph_mb,
            "seconds": seconds,
            "validation_samples": float(len(clips)),
        },
        torch_latency=torch_latency(model, task_section),
        versions=text_versions(),
        task_settings=task_settings,
        extra_files=["tokenizer.json", ENCODER_FILE],
    )


def _node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)
