"""Uploaded audio to Whisper's 16 kHz mono float32 (kernel/audio.py), and every refusal a server maps
to a 4xx.

One espeak-ng sentence (tests/speech.py) at 16 kHz mono, 44.1 kHz stereo (the right channel the
left at 0.6x, 5 ms late) and 8 kHz mono, encoded as WAV, FLAC, OGG Vorbis, OGG Opus and MP3 by the
benchmark's encoders (bench/audio_decode.py: PyAV, and libsndfile for Vorbis), must decode to what
the original gives at 16 kHz: the channels' mean, resampled with soxr VHQ (for 8 kHz: the sentence
taken down to 8 kHz and back, the band the file can hold). Lengths match to a millisecond (every
case measured 0 samples apart). Lossless files match sample for sample: correlation 0.9999 and
1e-3 at most apart (measured: 3e-5 at 16 kHz, the 16-bit rounding; 3e-4 through the resamplers).
Lossy codecs change the waveform by design, so they are held to a correlation of 0.97 at the best
lag within 2 ms (measured 0.994 or more, but Opus at 32 kbit/s in stereo, 0.982: it codes the
stereo image parametrically) and to the loudness envelope (25 ms windows every 10 ms, those within
40 dB of the loudest): within 4 dB at the 95th percentile (measured 3.0 dB at most, Opus).
"""

from __future__ import annotations

import io
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.audio_decode import at_rate, encode
from ortpack.kernel.audio import SAMPLING_RATE, TAKEN, decode_audio, guess_format, held_bytes
from ortpack.kernel.errors import InputError, InputTooLargeError, UnsupportedInputError
from ortpack.serving.errors import from_input_error, status_of
from tests.speech import SENTENCES, NoSynthesizer, speak, write_wav

soxr = pytest.importorskip("soxr")
pytest.importorskip("soundfile")
pytest.importorskip("av")

RATES = {"16k-mono": (16_000, 1), "44.1k-stereo": (44_100, 2), "8k-mono": (8_000, 1)}
LOSSLESS = ("wav", "flac")
LOSSY = ("vorbis", "opus", "mp3")
LIMITS: dict[str, Any] = {"max_seconds": 60.0, "max_bytes": 64 << 20}


@pytest.fixture(scope="module")
def sentence() -> np.ndarray:
    try:
        return speak(SENTENCES[1])  # 4.7 s
    except NoSynthesizer as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def files(sentence: np.ndarray) -> dict[tuple[str, str], bytes]:
    """(rate, format) -> the sentence encoded."""
    out = {}
    for name, (rate, channels) in RATES.items():
        audio = at_rate(sentence, rate, channels)
        for fmt in LOSSLESS + LOSSY:
            out[name, fmt] = encode(audio, rate, fmt)
    return out


def expected(sentence: np.ndarray, rate: int, channels: int) -> np.ndarray:
    """What a file of `sentence` at `rate` and `channels` holds, as 16 kHz mono: its channels' mean,
    taken to 16 kHz by soxr's best quality."""
    mono = at_rate(sentence, rate, channels).mean(axis=0)
    return mono if rate == SAMPLING_RATE else soxr.resample(mono, rate, SAMPLING_RATE, quality="VHQ")


def best_lag_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 32) -> float:
    n = min(len(a), len(b)) - max_lag
    return max(
        float(np.corrcoef(a[max_lag + lag : n + lag], b[max_lag:n])[0, 1]) for lag in range(-max_lag, max_lag + 1)
    )


def envelope_db(x: np.ndarray) -> np.ndarray:
    """Log energy of 25 ms windows every 10 ms, in dB."""
    windows = np.lib.stride_tricks.sliding_window_view(x, 400)[::160]
    return 10 * np.log10(np.mean(windows.astype(np.float64) ** 2, axis=1) + 1e-10)


def refused(data: bytes, **limits: Any) -> InputError:
    with pytest.raises(InputError) as caught:
        decode_audio(data, **{**LIMITS, **limits})
    error = caught.value
    assert 400 <= status_of(from_input_error(error)) < 500  # never a 5xx
    assert "\n" not in str(error)
    return error


@pytest.mark.parametrize("fmt", LOSSLESS + LOSSY)
@pytest.mark.parametrize("clip", list(RATES))
def test_each_format_and_rate_decodes_to_the_original_at_16k(
    files: dict[tuple[str, str], bytes], sentence: np.ndarray, clip: str, fmt: str
) -> None:
    rate, channels = RATES[clip]
    assert guess_format(files[clip, fmt]) in TAKEN
    samples = decode_audio(files[clip, fmt], **LIMITS)
    reference = expected(sentence, rate, channels)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - len(reference)) <= SAMPLING_RATE // 1000  # 1 ms
    n = min(len(samples), len(reference))
    if fmt in LOSSLESS:
        assert np.corrcoef(samples[:n], reference[:n])[0, 1] >= 0.9999
        assert np.abs(samples[:n] - reference[:n]).max() <= 1e-3
    else:
        assert best_lag_correlation(samples[:n], reference[:n]) >= 0.97
        ours, theirs = envelope_db(samples[:n]), envelope_db(reference[:n])
        loud = theirs > theirs.max() - 40
        assert np.percentile(np.abs(ours - theirs)[loud], 95) <= 4.0


def test_stereo_is_the_mean_of_its_channels(sentence: np.ndarray, tmp_path: Path) -> None:
    """Left the sentence, right silent: the mean is half the sentence (not the sum, nor FFmpeg's
    0.707 per channel to float), at 16 kHz without resampling: 16-bit rounding apart."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.stack([sentence, np.zeros_like(sentence)], axis=1), SAMPLING_RATE, format="WAV")
    samples = decode_audio(buffer.getvalue(), **LIMITS)
    assert np.abs(samples - sentence / 2).max() <= 2 / 32768


def test_bytearray_and_memoryview_decode_like_bytes(files: dict[tuple[str, str], bytes]) -> None:
    data = files["16k-mono", "flac"]
    reference = decode_audio(data, **LIMITS)
    for view in (bytearray(data), memoryview(data)):
        assert np.array_equal(decode_audio(view, **LIMITS), reference)


def test_reserve_gets_the_memory_of_the_header_duration(files: dict[tuple[str, str], bytes]) -> None:
    asked: list[int] = []
    samples = decode_audio(files["16k-mono", "wav"], reserve=asked.append, **LIMITS)
    assert asked == [held_bytes(len(samples) / SAMPLING_RATE)]


# --- refusals -------------------------------------------------------------------------------------


def test_empty() -> None:
    assert str(refused(b"")) == "file is empty"


def test_over_max_bytes_before_anything_is_read(files: dict[tuple[str, str], bytes]) -> None:
    data = files["16k-mono", "wav"]
    error = refused(data, max_bytes=1000)
    assert isinstance(error, InputTooLargeError)
    assert str(error) == f"file is {len(data):,} bytes; the limit is 1,000"


@pytest.mark.parametrize(
    ("data", "looks_like"),
    [
        (np.random.default_rng(0).bytes(50_000), "unrecognized bytes"),
        (b"Please transcribe this.\nIt is not audio, it is text.\n" * 40, "text"),
        (b'{"model": "whisper-1", "file": "speech.mp3"}', "text"),
        (b"\x89PNG\r\n\x1a\n" + bytes(200), "a PNG image"),
    ],
    ids=["random", "text", "json", "png"],
)
def test_not_audio_says_what_it_looks_like(data: bytes, looks_like: str) -> None:
    error = refused(data)
    assert type(error) is InputError  # 400
    assert str(error) == f"file is not audio: it looks like {looks_like}; send WAV, FLAC, OGG (Vorbis or Opus) or MP3"


@pytest.mark.parametrize(("fmt", "kind"), [("m4a", "M4A/MP4"), ("webm", "WebM/Matroska")])
def test_audio_formats_not_taken_are_415(sentence: np.ndarray, fmt: str, kind: str) -> None:
    """What browsers (WebM/Opus) and phones (M4A) record: libsndfile cannot decode them."""
    error = refused(encode(sentence[None], SAMPLING_RATE, fmt))
    assert isinstance(error, UnsupportedInputError)
    assert str(error) == f"file is {kind}; send WAV, FLAC, OGG (Vorbis or Opus) or MP3"


def test_an_odd_sample_rate_is_415(sentence: np.ndarray, tmp_path: Path) -> None:
    error = refused(write_wav(tmp_path / "slow.wav", sentence[:1000], sample_rate=500).read_bytes())
    assert isinstance(error, UnsupportedInputError)
    assert str(error) == "file is sampled at 500 Hz; send 1,000 to 768,000 Hz"


def test_an_ogg_without_an_audio_stream_is_415(files: dict[tuple[str, str], bytes]) -> None:
    """Its first stream's header packet (at byte 28) names the codec: a Theora video here."""
    data = bytearray(files["16k-mono", "opus"])
    data[28:36] = b"\x80theora"
    error = refused(bytes(data))
    assert isinstance(error, UnsupportedInputError)
    assert str(error) == "file is Ogg without Vorbis or Opus; send WAV, FLAC, OGG (Vorbis or Opus) or MP3"


def test_a_wav_without_samples_in_it() -> None:
    """A RIFF header and a format chunk, no data chunk."""
    fmt = struct.pack("<HHIIHH", 1, 1, SAMPLING_RATE, 2 * SAMPLING_RATE, 2, 16)  # PCM, mono, 16-bit
    wav = b"RIFF" + struct.pack("<I", 12 + len(fmt)) + b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt
    assert str(refused(wav)) == "file is WAV but truncated or corrupt: Error in WAV file. No 'data' chunk marker."


def test_a_wav_cut_inside_its_header(files: dict[tuple[str, str], bytes]) -> None:
    error = refused(files["16k-mono", "wav"][:30])
    assert str(error).startswith("file is WAV but truncated or corrupt: ")


def test_a_truncated_flac(files: dict[tuple[str, str], bytes]) -> None:
    data = files["16k-mono", "flac"]
    assert (
        str(refused(data[: len(data) // 2])) == "file is FLAC but truncated or corrupt: Error : flac decoder lost sync."
    )


def test_a_truncated_mp3_holds_less_than_its_header_counts(files: dict[tuple[str, str], bytes]) -> None:
    data = files["16k-mono", "mp3"]
    error = str(refused(data[: len(data) // 2]))
    assert error.startswith("file is MP3 but truncated or corrupt: its header says 4.69 s, it holds 2.")


def test_a_wav_cut_in_its_samples_is_what_it_holds(files: dict[tuple[str, str], bytes], sentence: np.ndarray) -> None:
    """libsndfile (and FFmpeg) read a WAV's sample count from the file's size where its header
    counts more (a WAV written to a pipe has placeholders there): the samples present decode."""
    data = files["16k-mono", "wav"]
    samples = decode_audio(data[: len(data) // 2], **LIMITS)
    assert abs(len(samples) - len(sentence) / 2) < 100
    assert np.abs(samples - sentence[: len(samples)]).max() <= 2 / 32768  # 16-bit: rounding, 32767 vs 32768


def test_no_samples(tmp_path: Path) -> None:
    assert str(refused(write_wav(tmp_path / "empty.wav", np.zeros(0, np.float32)).read_bytes())) == (
        "file holds no audio: WAV with no samples"
    )


def test_over_max_seconds_by_the_header_before_decoding(files: dict[tuple[str, str], bytes]) -> None:
    asked: list[int] = []
    with pytest.raises(InputTooLargeError, match=r"^file lasts 4\.7 s; the limit is 2 s$"):
        decode_audio(files["44.1k-stereo", "flac"], max_seconds=2, max_bytes=1 << 30, reserve=asked.append)
    assert asked == []


def test_a_header_claiming_ten_hours_is_refused_unread(files: dict[tuple[str, str], bytes]) -> None:
    """A FLAC whose STREAMINFO counts 10 h of samples (36 bits after rate, channels and bits)."""
    data = bytearray(files["16k-mono", "flac"])
    fields = int.from_bytes(data[18:26], "big")
    data[18:26] = ((fields & ~((1 << 36) - 1)) | 36_000 * SAMPLING_RATE).to_bytes(8, "big")
    error = refused(bytes(data))
    assert isinstance(error, InputTooLargeError)
    assert str(error) == "file lasts 36000.0 s; the limit is 60 s"


def silent_mp3(seconds: float) -> bytes:
    """Silent MPEG-2 layer III at 16 kHz, 8 kbit/s, mono: 36-byte frames of 576 samples, no Xing
    frame, so the header's length is an estimate from the bitrate and only decoding tells. 1 KB a
    second: 10 h in 36 MB, made at once."""
    frame = bytes([0xFF, 0xF3, 0x18, 0xC4]) + bytes(32)  # sync, MPEG-2 layer III, 8 kbit/s 16 kHz, mono
    return frame * round(seconds * SAMPLING_RATE / 576)


def test_ten_hours_without_a_count_stop_at_the_limit_in_bounded_memory() -> None:
    data = silent_mp3(10 * 3600)
    asked: list[int] = []
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InputTooLargeError) as caught:
            decode_audio(data, max_seconds=60, max_bytes=64 << 20, reserve=asked.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught.value) == "file lasts longer than the limit of 60 s"
    assert time.perf_counter() - started < 5  # 60 s of it decoded, not 10 h (measured ~0.1 s)
    assert asked == [held_bytes(60)]  # no count in the header: the limit's memory is reserved
    assert peak <= held_bytes(60)  # the 60 s at 16 kHz, not 10 h (2.3 GB as float32)
    # within the limit the same stream decodes: silence
    assert not decode_audio(silent_mp3(30), max_seconds=60, max_bytes=1 << 20).any()


@pytest.mark.parametrize("fmt", LOSSLESS + LOSSY)
def test_damaged_files_decode_or_are_refused_never_crash(files: dict[tuple[str, str], bytes], fmt: str) -> None:
    """40 copies of each file with 1-16 bytes overwritten at random (headers included): each decodes
    to float32 or raises an InputError (a 4xx), never another exception (a 5xx)."""
    rng = np.random.default_rng(7)
    data = files["8k-mono", fmt]
    for _ in range(40):
        damaged = bytearray(data)
        where = rng.integers(0, min(len(data), 2048) if rng.random() < 0.5 else len(data), rng.integers(1, 17))
        damaged_bytes = rng.integers(0, 256, len(where), dtype=np.uint8)
        for i, value in zip(where, damaged_bytes, strict=True):
            damaged[i] = value
        try:
            samples = decode_audio(bytes(damaged), **LIMITS)
        except InputError as error:
            assert 400 <= status_of(from_input_error(error)) < 500
        else:
            assert samples.dtype == np.float32 and np.isfinite(samples).all()
