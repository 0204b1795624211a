"""The automatic-speech-recognition family: a Hugging Face Whisper checkpoint as the encoder graph
(the log-mel front end inside) and the decoder step (exporter: components/core/exporters/
speech_recognition.py; tensors: kernel/contracts/automatic_speech_recognition.py), decoded by the
generation engine (kernel/generation/whisper.py).

Gated against PyTorch on the shipped speech (five espeak-ng clips, validation_data.speech_clips),
through the code that serves: each clip's greedy transcript one sequence at a time, and all clips
decoded together in one left-padded batch with their windows' cross keys and values stacked
beside the cache. fp32 must equal PyTorch's transcripts token for token on both paths.

Precisions: fp32, and int8 as weight-only `MatMulNBits` on the decoder (block size by measurement
and by the gate, as text generation's: components/core/quantization/weight_only.py); the encoder
is the bundle's one fp32 graph. Measured on whisper-base (2-core AMD EPYC, the five shipped clips
and four more): int8 in blocks of 128 decodes 2.3x faster than fp32 with every transcript equal;
int4 in blocks of 32 was 2.5x with 3 of 9 transcripts changed (word error rate 0.038 against
fp32's), so it is not offered. ONNX Runtime's dynamic int8 of every MatMul was measured and not
shipped (bench/whisper.py: with the encoder quantized the 27 s clip's transcript broke off).
"""

from __future__ import annotations

import io
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.graph_files import save_graph
from ortpack.components.core.quantization.int8_search import Candidate, Judged, search
from ortpack.components.core.quantization.int8_search import session as candidate_session
from ortpack.components.core.quantization.weight_only import WeightOnly
from ortpack.components.core.quantization.weight_only import quantize_weight_only as quantize_weight_only_graph
from ortpack.components.core.reference import Reference
from ortpack.components.core.sources import resolve_checkpoint
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.kernel.contracts.automatic_speech_recognition import (
    BENCH_BATCHES,
    CONTRACT,
    GATE_MAX_TOKENS,
    SpeechRecognitionSettings,
    decode_step_feeds,
    transcript_metrics,
)
from ortpack.kernel.engines.automatic_speech_recognition import TRANSCRIPT, open_encoder, whisper_decoder
from ortpack.kernel.generation.cache import DecodeBatch, Joining
from ortpack.kernel.generation.whisper import SuppressTokens
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.specs import ExportSpec

GATES = CONTRACT.gates
# fp32 equals PyTorch. int8's gate is on words: a transcript may differ in a token (a capital, a
# comma) but at most 5 % of the words may change, and 3 of 5 transcripts must be exact.
THRESHOLDS = {
    "fp32": ParityThresholds.of(GATES, min_exact_match=1.0, word_error_rate=0.0, min_greedy_match=1.0),
    "int8": ParityThresholds.of(GATES, min_exact_match=0.6, word_error_rate=0.05),
}
INT8_CANDIDATES = tuple(WeightOnly(bits=8, block_size=block, accuracy_level=4) for block in (128, 32))
INT8_FIELDS = ("recipe", "candidate", "rule", "candidates")  # what the manifest's int8 record holds
PROBE_CLIPS = 3  # every serving node transcribes these at start-up


def resolve_source(value: str) -> tuple[str, str]:
    return resolve_checkpoint(value)


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.speech_recognition import export_speech_recognition

    return export_speech_recognition(spec, out_dir)


class SpeechReference:
    """The export's reference.npz: the shipped clips' samples, the decoder prompt, and PyTorch's
    greedy transcripts of them."""

    def __init__(self, ref: Reference) -> None:
        self.clips = np.split(ref["audio"], ref["audio_ends"][:-1])
        self.prompt = ref["prompt"].tolist()
        self.transcripts = [t.tolist() for t in np.split(ref["tokens"], ref["token_ends"][:-1])]
        self.names = [str(n) for n in ref["names"]]


def _settings(export_dir: Path) -> SpeechRecognitionSettings:
    settings = ExportResult.load(export_dir).settings()
    assert isinstance(settings, SpeechRecognitionSettings)
    return settings


def batched_greedy(
    decoder: Any, prompt: list[int], contexts: list[Any], rule: SuppressTokens, end: int, count: int
) -> list[list[int]]:
    """Every clip's greedy transcript decoded together, as the server's loop runs them: each prompt
    prefilled alone, then all rows in one batch (their cross keys and values stacked beside the
    cache), each row's tokens kept until its end of text."""
    batch = DecodeBatch(decoder)
    joining, tokens = [], []
    for key, context in enumerate(contexts):
        out = decoder.prefill(prompt, context=context)
        row = out.logits[0, -1]
        rule([], row)
        tokens.append([int(np.argmax(row))])
        joining.append(Joining(key=key, cache=out.present, position=len(prompt), context=context))
    batch.rebuild([], joining)
    for _ in range(count - 1):
        if all(t[-1] == end for t in tokens):
            break
        logits = batch.step(np.array([t[-1] for t in tokens]))
        for row_tokens, row in zip(tokens, logits, strict=True):
            if row_tokens[-1] != end:
                rule(row_tokens, row)
                row_tokens.append(int(np.argmax(row)))
    return [[t for t in row if t != end] for row in tokens]


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """Greedy transcripts of the shipped clips, one by one and batched, against PyTorch's:
    `exact_match`, `word_error_rate` and `greedy_match` are the worse of the two paths."""
    from tokenizers import Tokenizer

    settings = _settings(export_dir)
    whisper = settings.whisper.kernel()
    reference = SpeechReference(ref)
    encoder = open_encoder((export_dir / settings.encoder_file).read_bytes(), whisper)
    decoder = whisper_decoder(session, settings)
    tokenizer = Tokenizer.from_file(str(export_dir / settings.tokenizer_file))
    rule = SuppressTokens(whisper)
    contexts = [encoder.encode([clip])[0] for clip in reference.clips]
    end = whisper.end_of_text
    single = [
        [
            t
            for t in decoder.greedy(reference.prompt, GATE_MAX_TOKENS, context=c, rules=[rule], stop=frozenset([end]))
            if t != end
        ]
        for c in contexts
    ]
    batched = batched_greedy(decoder, reference.prompt, contexts, rule, end, GATE_MAX_TOKENS)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    paths = {
        name: transcript_metrics(reference.transcripts, got, decode)
        for name, got in (("single", single), ("batched", batched))
    }
    values: dict[str, float] = {f"{p}.{k}": v for p, m in paths.items() for k, v in m.items()}
    values["exact_match"] = min(m["exact_match"] for m in paths.values())
    values["word_error_rate"] = max(m["word_error_rate"] for m in paths.values())
    values["greedy_match"] = min(m["greedy_match"] for m in paths.values())
    per_clip = [
        transcript_metrics([r], [c], decode)["greedy_match"] for r, c in zip(reference.transcripts, single, strict=True)
    ]
    return Comparison(values=values, per_item={"greedy_match": per_clip}, samples=len(reference.clips))


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """A clip as the 16-bit PCM WAV file a client would upload."""
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """The first PROBE_CLIPS shipped clips as WAV files (the server decodes them as uploads) with
    PyTorch's transcripts."""
    reference = SpeechReference(Reference.load(export_dir / export.reference_file))
    rate = int(export.task_settings["whisper"]["sampling_rate"])
    inputs = [wav_bytes(clip, rate) for clip in reference.clips[:PROBE_CLIPS]]
    outputs = [{TRANSCRIPT: np.asarray(t, np.int64)} for t in reference.transcripts[:PROBE_CLIPS]]
    return Probe(task=export.task, kind="files", inputs=inputs, outputs=outputs, varying=(TRANSCRIPT,))


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    """Decode steps at batch 1 and 8 after a 32-token transcript, with random cross keys and values."""
    w = SpeechRecognitionSettings.model_validate({**export.task_settings, "task": export.task}).whisper
    return {f"decode_b{batch}": (batch, decode_step_feeds(w, batch)) for batch in BENCH_BATCHES}


def _no_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> None:
    raise TypeError("the decoder quantizes weights only: the optimize step calls quantize_weight_only")


def quantize_weight_only(
    src: Path,
    dst: Path,
    export: ExportResult,
    export_dir: Path,
    precision: str,
    thresholds: ParityThresholds,
    recipe: str | None,
) -> dict[str, Any]:
    """The decoder's weights in int8 (`MatMulNBits`): each candidate judged on the shipped clips
    with the build's gate, the fastest that passes kept (a pinned `recipe` is built alone)."""
    if precision != "int8":
        raise ValueError(f"automatic-speech-recognition has no {precision} variant")
    recipes = {r.name: r for r in INT8_CANDIDATES}
    if recipe:
        if recipe not in recipes:
            raise ValueError(f"unknown int8 recipe {recipe!r} (known: {', '.join(recipes)})")
        quantize_weight_only_graph(src, dst, recipes[recipe], save_graph)
        return {"recipe": recipe, "rule": "pinned", "candidates": {}, "weight_bits": 8}
    reference = Reference.load(export_dir / export.reference_file)

    def judged(path: Path) -> Judged:
        values = compare(candidate_session(path), reference, export_dir).values
        quality = {k: values[k] for k in ("exact_match", "word_error_rate", "greedy_match")}
        return Judged(quality=quality, misses=thresholds.misses(values))

    def build(r: WeightOnly, path: Path) -> None:
        quantize_weight_only_graph(src, path, r, save_graph)

    def candidate(r: WeightOnly) -> Candidate:
        return Candidate(r.name, partial(build, r))

    record = search(
        [candidate(r) for r in INT8_CANDIDATES],
        dst,
        judge=judged,
        feeds={shape: feeds for shape, (_, feeds) in bench_feeds(export).items()},
        fallback=lambda q: -q.get("word_error_rate", np.inf),
        precision=precision,
    )
    return {k: record[k] for k in INT8_FIELDS if k in record} | {"weight_bits": 8}


def _greedy_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("min_greedy_match")


FAMILY = TaskFamily(
    name="automatic-speech-recognition",
    description="a Hugging Face Whisper checkpoint: its encoder with the log-mel front end, its decoder on the loop",
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=_no_int8,
    quantize_weight_only=quantize_weight_only,
    int8_recipes=tuple(r.name for r in INT8_CANDIDATES),
    select_probe=select_probe,
    report=ReportSpec(
        columns=(
            ("exact", "exact_match", ".2f"),
            ("WER", "word_error_rate", ".3f"),
            ("greedy", "greedy_match", ".2f"),
        ),
        distance=("greedy_match", "share of each transcript matching PyTorch's from the start", _greedy_gate),
        agreement=("greedy_match", 1, "share of each transcript matching PyTorch's from the start"),
        unit="clips",
    ),
)
