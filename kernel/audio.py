"""Audio bytes in, float32 mono samples at 16 kHz out: what Whisper's front end takes, made from an
uploaded file (OpenAI's /v1/audio/transcriptions sends one in the `file` form field).

WAV, FLAC, OGG (Vorbis or Opus) and MP3 are decoded by libsndfile through `soundfile`, the channels
averaged to mono and resampled by soxr at "HQ". Both are imported when the first file is decoded,
so a server without speech bundles needs neither.

Why these, measured by bench/audio_decode.py (bench/results/audio_decode.json: espeak-ng speech,
30 s and 10 min, at 16 kHz mono, 44.1 kHz stereo and 8 kHz mono, 2-core AMD EPYC, beside another
benchmark: timings moved up to 1.5x between runs):
- libsndfile 1.2.2 (the soundfile 0.14 wheel bundles it, with mpg123 and libopus) decodes all four
  formats; PyAV (FFmpeg) decodes them too, and M4A/MP4 and WebM besides, which libsndfile cannot.
  To float32 at the file's own rate, libsndfile was the faster in 22 of 24 WAV, FLAC, Vorbis and
  MP3 decodes (WAV 2-14x, the others up to 2.6x) and PyAV in 4 of 6 Opus ones (up to 2x); no
  decode took 6 ms per second of audio. Installed, soundfile is 4.3 MB (+1.3 MB of cffi, which the
  signed serving image already has) and soxr 0.5 MB; PyAV is 133 MB (a 36 MB wheel), as much again
  as the 146 MB serving image. `decode_audio` end to end: 0.04-1.7 ms per audio second, Opus
  1.4-4.7.
- soxr "HQ" and "VHQ" keep speech below 7 kHz to 88 and 90 dB through a 44.1 kHz round trip
  (FFmpeg's default swresample: 62 dB); HQ took 0.19 ms per second of 44.1 kHz audio, VHQ 0.23.
  Whisper's log-mel keeps an 80 dB range (its floor is the maximum less 8 in log10), so VHQ's
  extra accuracy is below what the model sees. HQ is librosa's default resampler too.
- Mono is the mean of the channels: what transformers' ASR pipeline does with a (channels,
  samples) array, and whisper's and faster-whisper's `-ac 1` to 16-bit (FFmpeg's matrix,
  normalized: 0.5 a channel for stereo). FFmpeg's `-ac 1` to float, which transformers'
  ffmpeg_read asks for, weights each stereo channel 0.707 (measured): 3 dB louder, which Whisper's
  per-clip log-mel scaling takes out. More than two channels: the plain mean too (FFmpeg drops LFE
  and weights the rest).

Bounded: the file's bytes (`max_bytes`, before anything is read); its duration (`max_seconds`),
from the header before decoding where the container counts its samples (WAV, FLAC, Ogg, and MP3
with a Xing, Info or VBRI frame: elsewhere an MP3's length is an estimate from its bitrate), and
while decoding otherwise: the decoder reads at most one frame past the limit, so a 10 h file is
refused after `max_seconds` of audio, never held; memory, by duration: the file is decoded in
blocks of at most 128k samples (0.5 MB) through the downmix and the resampler into one array for
the 16 kHz output, so 4 bytes a sample of output are held, whatever the file's rate and channels
(`held_bytes`): 39-44 MB for 10 minutes, where reading a whole 44.1 kHz stereo file first held
212 MB (soundfile) or 429 MB (PyAV's frames, then joined).

Every way a file can be bad gets one line (ortpack.kernel.errors; a server answers the status in
brackets): empty (400), over `max_bytes` or `max_seconds` (413), not audio (400, with what the
bytes look like: text, a PNG image...), audio of a kind not taken (415: M4A/MP4, WebM, AAC, AIFF,
Ogg FLAC or Speex...; an odd sample rate), truncated or corrupt (400: libsndfile's reason, or a
header that counts more samples than the file holds), no samples (400).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ortpack.kernel.errors import InputError, InputTooLargeError, UnsupportedInputError

SAMPLING_RATE = 16_000  # Whisper's
RESAMPLE_QUALITY = "HQ"  # soxr's; see the module docstring for why not VHQ
TAKEN = ("WAV", "FLAC", "Ogg Vorbis", "Ogg Opus", "MP3")
SEND = "send WAV, FLAC, OGG (Vorbis or Opus) or MP3"
# Samples (frames x channels) decoded at a time: 0.5 MB of float32, whatever the channel count
BLOCK_SAMPLES = 1 << 17
# A header's sample count less what decoding gave, beyond which the file is truncated. Intact files
# of every format and rate measured 0 ms apart (libsndfile drops encoder delay and padding); an MP3
# cut inside its last frame loses up to one (24-72 ms).
TRUNCATION_TOLERANCE_S = 0.1
MIN_RATE, MAX_RATE = 1_000, 768_000

# (leading bytes, offset, name): what a file's first bytes say it is
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"fLaC", 0, "FLAC"),
    (b"\x1a\x45\xdf\xa3", 0, "WebM/Matroska"),
    (b"ftyp", 4, "M4A/MP4"),
    (b"caff", 0, "CAF"),
    (b".snd", 0, "AU"),
    (b"#!AMR", 0, "AMR"),
    (b"MThd", 0, "MIDI"),
    (b"\x89PNG", 0, "a PNG image"),
    (b"\xff\xd8\xff", 0, "a JPEG image"),
    (b"GIF8", 0, "a GIF image"),
    (b"%PDF", 0, "a PDF document"),
    (b"PK\x03\x04", 0, "a ZIP archive"),
    (b"\x1f\x8b", 0, "gzip data"),
)
_RIFF = {b"WAVE": "WAV", b"WEBP": "a WebP image", b"AVI ": "an AVI video"}
_OGG = {b"OpusHead": "Ogg Opus", b"\x01vorbis": "Ogg Vorbis", b"\x7fFLAC": "Ogg FLAC", b"Speex   ": "Ogg Speex"}
_OTHER_AUDIO = ("WebM/Matroska", "M4A/MP4", "CAF", "AU", "AMR", "MIDI", "AIFF", "AAC (ADTS)")


def held_bytes(seconds: float, sampling_rate: int = SAMPLING_RATE) -> int:
    """The most memory `decode_audio` holds for `seconds` of output: 4 bytes a sample, and 6 MiB for a
    block of input, its downmix, the resampler's and the decoder's buffers (bench/audio_decode.py
    measured 0.7-5.6 MiB over the output in a fresh process, first pages of the libraries included)."""
    return 4 * math.ceil(seconds * sampling_rate) + (6 << 20)


def decode_audio(
    data: bytes | bytearray | memoryview,
    *,
    sampling_rate: int = SAMPLING_RATE,
    max_seconds: float,
    max_bytes: int,
    where: str = "file",
    reserve: Callable[[int], None] | None = None,
) -> np.ndarray:
    """float32 mono samples at `sampling_rate` of an audio file's bytes. Refuses (InputError and its
    subclasses, one line that starts with `where`) what it cannot or will not decode. `reserve`,
    if given, is called once the header is read, before anything is decoded, with the bytes the
    decode will hold (`held_bytes` of the header's duration, or of `max_seconds` when the header
    does not count its samples); an exception from it stops the decode."""
    size = memoryview(data).nbytes
    if not size:
        raise InputError(f"{where} is empty")
    if size > max_bytes:
        raise InputTooLargeError(f"{where} is {size:,} bytes; the limit is {max_bytes:,}")
    kind = guess_format(data)
    if kind not in TAKEN:
        if kind in _OTHER_AUDIO or kind.startswith("Ogg"):
            raise UnsupportedInputError(f"{where} is {kind}; {SEND}")
        raise InputError(f"{where} is not audio: it looks like {kind}; {SEND}")
    soundfile, soxr = _libraries()
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as file:
            return _decode(file, soxr, kind, _counts_samples(kind, data), sampling_rate, max_seconds, where, reserve)
    except soundfile.SoundFileError as exc:
        reason = " ".join(str(getattr(exc, "error_string", "") or exc).split())
        raise InputError(f"{where} is {kind} but truncated or corrupt: {reason}") from None


def _decode(
    file: Any,
    soxr: Any,
    kind: str,
    counted: bool,
    sampling_rate: int,
    max_seconds: float,
    where: str,
    reserve: Callable[[int], None] | None,
) -> np.ndarray:
    rate, channels = int(file.samplerate), int(file.channels)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise UnsupportedInputError(f"{where} is sampled at {rate:,} Hz; send {MIN_RATE:,} to {MAX_RATE:,} Hz")
    limit = math.floor(max_seconds * rate)  # frames
    stated = int(file.frames) if counted and 0 < file.frames < 1 << 62 else None
    if stated is not None and stated > limit:
        raise InputTooLargeError(f"{where} lasts {stated / rate:.1f} s; the limit is {max_seconds:g} s")
    bound = _output_length(limit, rate, sampling_rate)  # the most samples a file within the limit gives
    expected = bound if stated is None else _output_length(stated, rate, sampling_rate)
    if reserve is not None:
        reserve(held_bytes(expected / sampling_rate))
    samples = _Samples(expected, bound)
    block = np.empty((max(BLOCK_SAMPLES // channels, 1024), channels), np.float32)
    resampler = None
    if rate != sampling_rate:
        resampler = soxr.ResampleStream(rate, sampling_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
    decoded = 0
    while True:
        # never more than one frame past the limit: a long file is refused, not decoded
        got = file.read(out=block[: min(len(block), limit + 1 - decoded)])
        if not len(got):
            break
        decoded += len(got)
        if decoded > limit:
            raise InputTooLargeError(f"{where} lasts longer than the limit of {max_seconds:g} s")
        mono = got[:, 0] if channels == 1 else _mean_of_channels(got)
        samples.append(mono if resampler is None else resampler.resample_chunk(mono))
    if resampler is not None:
        samples.append(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
    if stated is not None and decoded < stated - TRUNCATION_TOLERANCE_S * rate:
        raise InputError(
            f"{where} is {kind} but truncated or corrupt: its header says {stated / rate:.2f} s, "
            f"it holds {decoded / rate:.2f} s"
        )
    if not samples.size:
        raise InputError(f"{where} holds no audio: {kind} with no samples")
    return samples.result()


def _mean_of_channels(block: np.ndarray) -> np.ndarray:
    """The mean of a (frames, channels) block's columns, column by column: numpy's `mean(axis=1)`
    over two interleaved channels took 1 ms a block of 64k frames, this 0.04 ms (the same floats)."""
    mono = block[:, 0].copy()
    for channel in range(1, block.shape[1]):
        mono += block[:, channel]
    mono *= np.float32(1 / block.shape[1])
    return mono


def _output_length(frames: int, rate: int, sampling_rate: int) -> int:
    """Samples at `sampling_rate` of `frames` at `rate`: soxr streams give ceil(frames x ratio) at
    most (checked at 8 to 96 kHz and odd rates)."""
    return math.ceil(frames * sampling_rate / rate)


class _Samples:
    """float32 samples appended block by block into one array, allocated for what the header says
    the file holds (or for the limit when it does not count its samples): pages decoding never
    reaches are never touched, so never resident, and nothing is joined at the end (a list of
    blocks and `np.concatenate` held the output twice: 79 instead of 40 MB for 10 minutes). A
    file that holds more than its header says moves once to an array for the limit."""

    def __init__(self, expected: int, bound: int) -> None:
        self.array = np.empty(expected, np.float32)
        self.bound = bound
        self.size = 0

    def append(self, chunk: np.ndarray) -> None:
        end = self.size + len(chunk)
        if end > len(self.array):
            grown = np.empty(max(self.bound, end), np.float32)
            grown[: self.size] = self.array[: self.size]
            self.array = grown
        self.array[self.size : end] = chunk
        self.size = end

    def result(self) -> np.ndarray:
        """The samples: a view when they fill at least half the array, else a copy (a file without
        a count, far shorter than the limit, should not keep the limit's array alive)."""
        kept = self.array[: self.size]
        return kept if 2 * self.size >= len(self.array) else kept.copy()


def guess_format(data: bytes | bytearray | memoryview) -> str:
    """What a file's first bytes say it is: one of TAKEN, another audio format ("M4A/MP4", "Ogg
    FLAC", ...) or something else ("text", "a PNG image", "unrecognized bytes"). Only the formats
    taken reach libsndfile (which would try a dozen parsers, and mpg123 on any stray sync word)."""
    head = bytes(data[:64])
    if head[:3] == b"ID3" and len(head) >= 10:  # an ID3v2 tag: its size is 4 x 7 bits (syncsafe)
        end = 10 + int.from_bytes(bytes(b & 0x7F for b in head[6:10]), "big") + (10 if head[5] & 0x10 else 0)
        after = guess_format(data[end : end + 64]) if end < len(data) else "MP3"
        return after if after in ("FLAC", "AAC (ADTS)") else "MP3"
    if head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] in _RIFF:
        return _RIFF[head[8:12]]
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "AIFF"
    if head[:4] == b"OggS":
        return next((name for magic, name in _OGG.items() if head[28:].startswith(magic)), "Ogg without Vorbis or Opus")
    for magic, offset, name in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            return name
    if len(head) >= 4 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio frame's sync
        layer, version, bitrate, rate = (head[1] >> 1) & 3, (head[1] >> 3) & 3, head[2] >> 4, (head[2] >> 2) & 3
        if layer == 0 and head[1] & 0xF6 == 0xF0:
            return "AAC (ADTS)"
        if layer != 0 and version != 1 and bitrate != 15 and rate != 3:
            return "MP3"
    return "text" if _is_text(bytes(data[:512])) else "unrecognized bytes"


def _is_text(head: bytes) -> bool:
    for cut in range(4):  # the 512th byte may fall inside a UTF-8 character
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return all(c.isprintable() or c.isspace() for c in text)
    return False


def _counts_samples(kind: str, data: bytes | bytearray | memoryview) -> bool:
    """Whether libsndfile's frame count for this file is what the file says it holds, not an
    estimate: WAV (its sizes, or the file's where they are placeholders), FLAC (STREAMINFO), Ogg
    (the last page's granule position) and MP3 with a Xing, Info or VBRI frame first (LAME and
    FFmpeg write one). A bare MP3's length is the file's size over its first frame's bitrate."""
    if kind != "MP3":
        return True
    head = bytes(data[:10])
    start = 0
    if head[:3] == b"ID3" and len(head) == 10:
        start = 10 + int.from_bytes(bytes(b & 0x7F for b in head[6:10]), "big") + (10 if head[5] & 0x10 else 0)
    first = bytes(data[start : start + 192])
    return any(tag in first for tag in (b"Xing", b"Info", b"VBRI"))


def _libraries() -> tuple[Any, Any]:
    try:
        import soundfile
        import soxr
    except ImportError as exc:  # pragma: no cover - not installed with the serving extras yet
        raise RuntimeError(
            f"decoding audio needs soundfile and soxr ({exc.name} is missing): "
            "pip install 'soundfile>=0.13' 'soxr>=0.5'"
        ) from None
    return soundfile, soxr
