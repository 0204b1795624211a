"""Whisper base's trained weights exported to the two ONNX graphs and decoded by the generation loop
(components/core/exporters/speech_recognition.py, kernel/generation/whisper.py), against PyTorch's
greedy `generate` on speech espeak-ng synthesizes in several voices and rates (slow).

fp32 must equal PyTorch token for token: all clips at once through the loop (left-padded caches,
each row's cross keys and values stacked beside them) and from files in several formats and rates
as the server decodes them. One sequence at a time, two windows, WAV and MP3 served: the task's
own test (test_speech_recognition.py) and its gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.speech import SAMPLE_RATE, SENTENCES, NoSynthesizer, speak
from tests.whispers import NotInstalled, whisper_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("soundfile")
pytest.importorskip("soxr")

# (sentence, voice, words per minute): American and British English, slow and fast
CLIPS = (
    (SENTENCES[0], "en-us", 150),
    (SENTENCES[1], "en-us", 120),
    (SENTENCES[2], "en", 175),
    (SENTENCES[3], "en-us+f3", 150),
    (SENTENCES[1], "en-gb-x-rp", 190),
)


@pytest.fixture(scope="module")
def whisper() -> tuple[Any, Any, Any]:
    from ortpack.components.core.exporters.speech_recognition import load_whisper

    try:
        return load_whisper(whisper_dir())
    except NotInstalled as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    try:
        out = [speak(text, voice=voice, words_per_minute=wpm) for text, voice, wpm in CLIPS]
    except NoSynthesizer as exc:
        pytest.skip(str(exc))
    rng = np.random.default_rng(0)
    noisy = out[0] + rng.normal(0, 0.01, out[0].shape).astype(np.float32)  # about 20 dB SNR
    return [*out, noisy]


@pytest.fixture(scope="module")
def graphs(whisper: tuple[Any, Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.exporters.speech_recognition import (
        DECODER_FILE,
        ENCODER_FILE,
        export_decoder,
        export_encoder,
    )

    _, features, model = whisper
    out = tmp_path_factory.mktemp("whisper-onnx")
    export_encoder(model, features, out / ENCODER_FILE)
    export_decoder(model, out / DECODER_FILE)
    return out


@pytest.fixture(scope="module")
def parts(whisper: tuple[Any, Any, Any], graphs: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from ortpack.components.core.exporters.speech_recognition import DECODER_FILE, ENCODER_FILE, settings_of
    from ortpack.kernel.contracts.text_generation import DecoderSettings
    from ortpack.kernel.generation.decoder import Decoder
    from ortpack.kernel.generation.whisper import Encoder

    _, _, model = whisper
    s = settings_of(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2

    def session(name: str) -> Any:
        return ort.InferenceSession(str(graphs / name), options, providers=["CPUExecutionProvider"])

    geometry = DecoderSettings(
        model_type="whisper", layers=s.layers, kv_heads=s.heads, head_dim=s.head_dim, vocab_size=s.vocab_size
    )
    return {
        "settings": s,
        "encoder": Encoder(session(ENCODER_FILE), s),
        "decoder": Decoder(session(DECODER_FILE), geometry),
    }


def torch_tokens(whisper: tuple[Any, Any, Any], audio: np.ndarray) -> list[int]:
    """PyTorch's greedy transcript of one window (English, transcribe, no timestamps): `generate`
    returns the tokens after the prompt, without the end of text."""
    import torch

    _, features, model = whisper
    feats = features(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    with torch.inference_mode():
        out = model.generate(feats, language="en", task="transcribe", return_timestamps=False, num_beams=1)
    return [t for t in out[0].tolist() if t != model.generation_config.eos_token_id]


@pytest.fixture(scope="module")
def references(whisper: tuple[Any, Any, Any], clips: list[np.ndarray]) -> list[list[int]]:
    return [torch_tokens(whisper, clip) for clip in clips]


def test_the_encoder_graph_gives_pytorchs_cross_keys_and_values_from_the_waveform(
    whisper: tuple[Any, Any, Any], parts: dict[str, Any], clips: list[np.ndarray]
) -> None:
    import torch

    from ortpack.components.core.exporters.speech_recognition import CrossKeyValues

    _, features, model = whisper
    feats = features(clips[0], sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    with torch.inference_mode():
        expected = [t.numpy() for t in CrossKeyValues(model)(feats)]
    got = parts["encoder"].encode([clips[0]])[0]
    assert len(got) == len(expected) == 2 * parts["settings"].layers
    worst = max(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True))
    scale = max(float(np.abs(e).max()) for e in expected)
    assert worst < 1e-3 * scale, f"cross keys/values differ by {worst:.2e} (largest {scale:.1f})"


@pytest.fixture(scope="module")
def transcriber(whisper: tuple[Any, Any, Any], parts: dict[str, Any]) -> Any:
    from ortpack.kernel.generation.engine import Generator
    from ortpack.kernel.generation.scheduler import Limits
    from ortpack.kernel.generation.whisper import Transcriber

    s = parts["settings"]
    tokenizer, _, _ = whisper
    generator = Generator(
        parts["decoder"], tokenizer, [s.end_of_text], Limits(capacity=8 * 448, context=s.max_target_positions)
    )
    generator.warm_up()
    generator.start()
    yield Transcriber(parts["encoder"], generator, s)
    generator.stop()


def test_the_loop_decodes_every_clip_at_once_as_pytorch_does_one_by_one(
    transcriber: Any, clips: list[np.ndarray], references: list[list[int]], whisper: tuple[Any, Any, Any]
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    tokenizer, _, _ = whisper
    with ThreadPoolExecutor(len(clips)) as pool:
        transcripts = list(pool.map(lambda clip: transcriber.transcribe(clip, language="en"), clips))
    for transcript, expected in zip(transcripts, references, strict=True):
        (segment,) = transcript.segments
        assert segment.finish_reason == "stop"
        assert list(segment.tokens) == expected
        assert transcript.text == tokenizer.decode(expected, skip_special_tokens=True).strip()


@pytest.mark.parametrize(
    ("fmt", "rate", "channels"),
    [("flac", 16_000, 1), ("mp3", 44_100, 1), ("opus", 48_000, 1), ("wav", 8_000, 1)],
)
def test_a_file_the_server_decodes_transcribes_as_pytorch_does_its_samples(
    transcriber: Any, whisper: tuple[Any, Any, Any], clips: list[np.ndarray], fmt: str, rate: int, channels: int
) -> None:
    from bench.audio_decode import at_rate, encode
    from ortpack.kernel.audio import decode_audio

    data = encode(at_rate(clips[1], rate, channels), rate, fmt)
    samples = decode_audio(data, max_seconds=60.0, max_bytes=16 << 20)
    transcript = transcriber.transcribe(samples, language="en")
    assert list(transcript.segments[0].tokens) == torch_tokens(whisper, samples)
