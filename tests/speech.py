"""Speech for the speech tests, synthesized here: Debian's `espeak-ng` speaks shipped English
sentences (nothing is downloaded; the Makefile's test target apt-installs it where missing), and
soxr resamples its 22.05 kHz output to the 16 kHz mono float32 that Whisper's front end takes.

espeak-ng is a formant synthesizer: robotic, but words a speech recognizer knows. Whisper base
transcribes these sentences word for word but for a few homophones and spellings, which is why
tests compare normalized words with a word error rate (`word_error_rate`), not strings.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000  # Whisper's
VOICE = "en-us"
WORDS_PER_MINUTE = 150  # a little slower than espeak-ng's 175: clearer words

# Short everyday sentences, each well under Whisper's 30 s window, with no numbers or names that a
# recognizer may rightly write another way.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "The weather today is sunny with a light breeze from the west.",
    "A model is packaged once and served on many machines.",
)

INSTALL_HINT = "espeak-ng is not installed: apt-get install espeak-ng (the Makefile's test target does)"


class NoSynthesizer(RuntimeError):
    """espeak-ng is not on PATH."""


def speak(text: str, *, voice: str = VOICE, words_per_minute: int = WORDS_PER_MINUTE) -> np.ndarray:
    """`text` spoken by espeak-ng: float32 mono samples in [-1, 1] at SAMPLE_RATE."""
    import soxr

    if shutil.which("espeak-ng") is None:
        raise NoSynthesizer(INSTALL_HINT)
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "--stdout", text],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    audio, rate = _read_wav(wav)
    return np.asarray(soxr.resample(audio, rate, SAMPLE_RATE, quality="VHQ"), dtype=np.float32)


def write_wav(path: Path, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> Path:
    """`audio` (float32 mono in [-1, 1]) as a 16-bit PCM WAV file, the way a client would send it."""
    pcm = np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())
    return path


def speak_to_wav(text: str, path: Path) -> Path:
    """`text` spoken by espeak-ng into a 16 kHz mono WAV file."""
    return write_wav(path, speak(text))


def _read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(float32 mono samples, sample rate) of a 16-bit PCM WAV. espeak-ng writes to a pipe, so its
    header's sizes are placeholders (0x7fffffff): the frames are taken to the end of the bytes."""
    with wave.open(io.BytesIO(data), "rb") as wav:
        if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError(f"expected 16-bit mono, got {wav.getsampwidth() * 8}-bit x {wav.getnchannels()}")
        rate = wav.getframerate()
        pcm = wav.readframes(wav.getnframes())
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768, rate


def normalized_words(text: str) -> list[str]:
    """Lower-case words without punctuation (apostrophes kept), for comparing transcripts."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(reference: str, hypothesis: str) -> int:
    """Substitutions + deletions + insertions turning the reference's normalized words into the hypothesis's."""
    ref, hyp = normalized_words(reference), normalized_words(hypothesis)
    previous = list(range(len(hyp) + 1))  # Levenshtein distance over words, one row at a time
    for i, word in enumerate(ref, start=1):
        current = [i]
        for j, other in enumerate(hyp, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1]


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Word errors over all references / their words (a corpus rate: short sentences weigh less)."""
    errors = sum(word_errors(r, h) for r, h in zip(references, hypotheses, strict=True))
    return errors / max(sum(len(normalized_words(r)) for r in references), 1)
