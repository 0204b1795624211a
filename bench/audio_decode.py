"""Decoding uploaded audio for the speech endpoint: soundfile (libsndfile) against PyAV (FFmpeg),
and soxr's resampling to Whisper's 16 kHz, measured on the same files.

    python bench/audio_decode.py [--short 30] [--long 600] [--repeats 3] [--out bench/results/audio_decode.json]

The clips are espeak-ng speech (tests/speech.py: the four shipped sentences, 0.3 s apart, repeated
to `--short` and `--long` seconds), at 16 kHz mono, 44.1 kHz stereo (the right channel is the left
at 0.6x, delayed 5 ms) and 8 kHz mono, encoded into a temporary folder as WAV (16-bit PCM), FLAC,
OGG/Vorbis, OGG/Opus and MP3, and (short clips only, for coverage: what browsers record and what
OpenAI's endpoint takes besides) M4A/AAC and WebM/Opus. PyAV encodes all of them but Vorbis: its
FFmpeg build has only FFmpeg's experimental native Vorbis encoder, which writes stereo only, so
Vorbis is written by libsndfile's libvorbis. Opus takes 8/12/16/24/48 kHz: the 44.1 kHz clip is
resampled to 48 kHz first (what the ffmpeg command does).

Each (library, file) is decoded in a fresh process to float32 at the file's own rate and channel
count, nothing more: `soundfile.SoundFile.read(dtype="float32")`, and PyAV's frames converted to
float32 and concatenated; and, where ortpack.kernel.audio exists, by `decode_audio` end to end (to
16 kHz mono: read in blocks, downmixed, resampled, with its checks). Time: the best of `--repeats`
decodes (one for long clips), per second of audio. Peak: the process's peak resident memory during
the first decode over what it held before (Linux's VmHWM, reset through /proc/self/clear_refs),
against the decoded array's own size.
"stated - decoded" is what the container says the clip lasts less what decoding gave.

Then the resampling after the decode (the long 44.1 kHz stereo clip, downmixed to mono first):
soxr at "HQ" and "VHQ", in one call and streamed (ResampleStream, what a decoder that never holds
the whole clip at its own rate does) by 1152-frame MP3 frames and by 64k-frame blocks, against
FFmpeg's swresample inside PyAV's decode loop (faster-whisper's way); their accuracy on the left
channel taken back to 16 kHz against the original; and the weights FFmpeg's `-ac 1` gives stereo.
Prints tables and writes the JSON (about 2.5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATES = {"16k mono": (16_000, 1), "44.1k stereo": (44_100, 2), "8k mono": (8_000, 1)}
FORMATS = ("wav", "flac", "vorbis", "opus", "mp3")
COVERAGE_ONLY = ("m4a", "webm")
# format -> (PyAV container, codec, encoder options)
_PYAV_ENCODERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "wav": ("wav", "pcm_s16le", {}),
    "flac": ("flac", "flac", {}),
    "opus": ("ogg", "libopus", {"b": "32000"}),  # 32 kbit/s: a voice-message bitrate
    "mp3": ("mp3", "libmp3lame", {"b": "64000"}),
    "m4a": ("ipod", "aac", {"b": "64000"}),
    "webm": ("webm", "libopus", {"b": "32000"}),
}
SUFFIX = {"wav": "wav", "flac": "flac", "vorbis": "ogg", "opus": "opus", "mp3": "mp3", "m4a": "m4a", "webm": "webm"}
OPUS_RATES = (8_000, 12_000, 16_000, 24_000, 48_000)


# --- the clips ---------------------------------------------------------------------------------


def speech(seconds: float) -> np.ndarray:
    """espeak-ng's sentences, 0.3 s apart, repeated to `seconds`: float32 mono at 16 kHz."""
    from tests.speech import SAMPLE_RATE, SENTENCES, speak

    gap = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    once = np.concatenate([part for sentence in SENTENCES for part in (speak(sentence), gap)])
    n = int(seconds * SAMPLE_RATE)
    return np.tile(once, -(-n // len(once)))[:n]


def at_rate(mono16k: np.ndarray, rate: int, channels: int) -> np.ndarray:
    """(channels, samples) float32: resampled with soxr VHQ; a second channel is the first at 0.6x, 5 ms late."""
    import soxr

    mono = mono16k if rate == 16_000 else soxr.resample(mono16k, 16_000, rate, quality="VHQ").astype(np.float32)
    if channels == 1:
        return mono[None]
    delay = int(0.005 * rate)
    right = np.concatenate([np.zeros(delay, np.float32), 0.6 * mono[:-delay]])
    return np.stack([mono, right]).astype(np.float32)


def encode_pyav(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    """`audio` (channels, samples) float32 encoded by PyAV's FFmpeg as `fmt`."""
    import av

    container, codec, options = _PYAV_ENCODERS[fmt]
    if codec == "libopus" and rate not in OPUS_RATES:
        import soxr

        audio = np.ascontiguousarray(soxr.resample(audio.T, rate, 48_000, quality="VHQ").T, dtype=np.float32)
        rate = 48_000
    layout = "mono" if audio.shape[0] == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream: Any = out.add_stream(codec, rate=rate, layout=layout, options=options)
        names = [f.name for f in stream.codec_context.codec.audio_formats or []]
        sample_format = next((n for n in ("fltp", "flt", "s16") if n in names), names[0])
        hop = stream.codec_context.frame_size or 1024
        for start in range(0, audio.shape[1], hop):
            chunk = audio[:, start : start + hop]
            if sample_format == "s16":
                chunk = np.clip(np.round(chunk * 32767), -32768, 32767).astype(np.int16)
            if not sample_format.endswith("p"):
                chunk = chunk.T.reshape(1, -1)  # packed: interleaved channels
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format=sample_format, layout=layout)
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def encode(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    if fmt == "vorbis":  # libsndfile's libvorbis: FFmpeg's own encoder writes stereo only
        import soundfile

        buffer = io.BytesIO()
        # in blocks: libsndfile 1.2.2 crashes (SIGSEGV) writing minutes of Vorbis in one call
        with soundfile.SoundFile(buffer, "w", rate, audio.shape[0], format="OGG", subtype="VORBIS") as out:
            for start in range(0, audio.shape[1], 1 << 15):
                out.write(np.ascontiguousarray(audio[:, start : start + (1 << 15)].T))
        return buffer.getvalue()
    return encode_pyav(audio, rate, fmt)


# --- one decode, in its own process ------------------------------------------------------------


def _status(field: str) -> int:
    """VmRSS or VmHWM of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _float_planes(frame: Any) -> np.ndarray:
    """One PyAV audio frame as float32 (channels, samples), whatever its sample format."""
    a = frame.to_ndarray()
    if not frame.format.is_planar:
        a = a.reshape(-1, frame.layout.nb_channels).T
    if a.dtype == np.float32:
        return a
    if a.dtype == np.uint8:
        return (a.astype(np.float32) - 128) / 128
    if a.dtype.kind == "i":
        return a.astype(np.float32) / float(2 ** (8 * a.dtype.itemsize - 1))
    return a.astype(np.float32)


def decode_soundfile(data: bytes) -> tuple[np.ndarray, int, float | None]:
    import soundfile

    with soundfile.SoundFile(io.BytesIO(data)) as f:
        stated = f.frames / f.samplerate if 0 < f.frames < 2**62 else None
        return f.read(dtype="float32", always_2d=True), f.samplerate, stated


def decode_pyav(data: bytes) -> tuple[np.ndarray, int, float | None]:
    import av

    container: Any
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        stated = container.duration / 1e6 if container.duration else None
        planes = [_float_planes(frame) for frame in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    return np.concatenate(planes, axis=1), rate, stated


def decode_kernel(data: bytes) -> tuple[np.ndarray, int, float | None]:
    from ortpack.kernel.audio import decode_audio

    return decode_audio(data, max_seconds=1e6, max_bytes=1 << 34), 16_000, None


DECODERS: dict[str, Callable[[bytes], tuple[np.ndarray, int, float | None]]] = {
    "soundfile": decode_soundfile,
    "pyav": decode_pyav,
    "decode_audio": decode_kernel,
}


IMPORTS = {"soundfile": ["soundfile"], "pyav": ["av"], "decode_audio": ["soundfile", "soxr", "ortpack.kernel.audio"]}


def worker(library: str, path: Path, repeats: int) -> dict[str, Any]:
    """Decode `path` with `library` in this (fresh) process: peak memory on the first decode, then time."""
    started = time.perf_counter()
    for module in IMPORTS[library]:
        importlib.import_module(module)
    import_s = time.perf_counter() - started
    data = path.read_bytes()
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _status("VmRSS")
    try:
        audio, rate, stated = DECODERS[library](data)
    except Exception as exc:  # noqa: BLE001 - the point: which library decodes which format
        return {"ok": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split())[:200], "import_s": import_s}
    peak = _status("VmHWM") - before
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        DECODERS[library](data)
        times.append(time.perf_counter() - started)
    frames = audio.shape[1] if library == "pyav" else audio.shape[0]
    return {
        "ok": True,
        "import_s": import_s,
        "rate": rate,
        "channels": 1 if audio.ndim == 1 else min(audio.shape),
        "decoded_s": frames / rate,
        "stated_s": stated,
        "seconds": min(times),
        "peak_bytes": peak,
        "array_bytes": audio.nbytes,
    }


def run_worker(library: str, path: Path, repeats: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", library, str(path), str(repeats)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr.strip().splitlines()[-1][:200]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# --- resampling ---------------------------------------------------------------------------------


def _best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def soxr_streamed(audio: np.ndarray, rate: int, quality: str, block: int) -> np.ndarray:
    """(channels, samples) at `rate` -> mono 16 kHz: downmixed and resampled `block` frames at a time."""
    import soxr

    stream = soxr.ResampleStream(rate, 16_000, 1, dtype="float32", quality=quality)
    out = [stream.resample_chunk(audio[:, i : i + block].mean(axis=0)) for i in range(0, audio.shape[1], block)]
    out.append(stream.resample_chunk(np.zeros(0, np.float32), last=True))
    return np.concatenate(out)


def swr_resample(mono: np.ndarray, rate: int) -> np.ndarray:
    """FFmpeg's swresample (PyAV's AudioResampler, default options) on float32 mono frames of 1152."""
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=16_000)
    out = []
    for i in range(0, len(mono), 1152):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(mono[None, i : i + 1152]), format="flt", layout="mono")
        frame.sample_rate = rate
        frame.pts = i
        out += [f.to_ndarray()[0] for f in resampler.resample(frame)]
    out += [f.to_ndarray()[0] for f in resampler.resample(None)]
    return np.concatenate(out)


def snr_db(reference: np.ndarray, test: np.ndarray, below_hz: float = 7_000) -> float:
    """Signal to error in dB at 16 kHz, below `below_hz`: the band every resampler here keeps (their
    pass bands end at 91-95% of 8 kHz, where the error is the filters' roll-off, not accuracy)."""
    n = min(len(reference), len(test))
    keep = np.fft.rfftfreq(n, 1 / 16_000) < below_hz
    ref = np.fft.rfft(reference[:n].astype(np.float64))[keep]
    error = ref - np.fft.rfft(test[:n].astype(np.float64))[keep]
    return float(10 * np.log10(np.sum(np.abs(ref) ** 2) / max(np.sum(np.abs(error) ** 2), 1e-30)))


def resampling(original: np.ndarray, stereo: np.ndarray, rate: int, mp3: bytes, repeats: int) -> dict[str, Any]:
    """The cost of downmixing `stereo` ((2, samples) float32 at `rate`) and resampling it to 16 kHz:
    soxr HQ and VHQ in one call and streamed (by MP3-sized frames and by 64k-frame blocks), and
    FFmpeg's swresample inside PyAV's decode loop of `mp3` (the same clip) less the plain decode.
    Accuracy: the left channel (`original`, 16 kHz, upsampled with VHQ) resampled back to 16 kHz
    against `original`."""
    import soxr

    seconds = stereo.shape[1] / rate

    def swr_decode() -> None:
        import av

        container: Any
        with av.open(io.BytesIO(mp3)) as container:
            resampler = av.AudioResampler(format="flt", layout="mono", rate=16_000)
            for frame in container.decode(audio=0):
                for f in resampler.resample(frame):
                    f.to_ndarray()
            resampler.resample(None)

    ms: dict[str, float] = {"downmix (mean of 2 channels)": _best(lambda: stereo.mean(axis=0), repeats)}
    mono = stereo.mean(axis=0)
    for quality in ("HQ", "VHQ"):
        q = quality
        ms[f"soxr {q}, one call"] = _best(lambda q=q: soxr.resample(mono, rate, 16_000, quality=q), repeats)  # type: ignore[misc]
        for block in (1152, 65536):
            ms[f"soxr {q}, downmix + streamed by {block} frames"] = _best(
                lambda q=q, b=block: soxr_streamed(stereo, rate, q, b),  # type: ignore[misc]
                repeats,
            )
    ms["swresample in PyAV's MP3 decode loop, less the plain decode"] = _best(swr_decode, repeats) - _best(
        lambda: decode_pyav(mp3), repeats
    )
    left = stereo[0]
    back = {
        "soxr HQ": soxr.resample(left, rate, 16_000, quality="HQ"),
        "soxr VHQ": soxr.resample(left, rate, 16_000, quality="VHQ"),
        "swresample (default)": swr_resample(left, rate),
    }
    one = soxr.resample(mono, rate, 16_000, quality="HQ")
    return {
        "clip": f"{seconds:.0f} s at {rate} Hz stereo",
        "ms_per_audio_s": {k: 1e3 * v / seconds for k, v in ms.items()},
        "round_trip_snr_db_below_7khz": {k: snr_db(original, v) for k, v in back.items()},
        "round_trip_snr_db_full_band": {k: snr_db(original, v, 8_001) for k, v in back.items()},
        "round_trip_lengths": {k: len(v) for k, v in back.items()} | {"original": len(original)},
        "max_abs_diff": {
            "HQ vs VHQ": float(np.abs(back["soxr HQ"] - back["soxr VHQ"]).max()),
            "HQ streamed by 64k blocks vs one call": float(
                np.abs(soxr_streamed(stereo, rate, "HQ", 65536) - one).max()
            ),
        },
        "ffmpeg_downmix_weights": {fmt: ffmpeg_downmix(fmt) for fmt in ("flt", "s16")},
    }


def ffmpeg_downmix(sample_format: str) -> float:
    """The weight FFmpeg's `-ac 1` (swresample's default matrix) gives each channel of stereo, with
    `sample_format` out: `flt` is what transformers' ffmpeg_read asks for, `s16` whisper's and faster-whisper's."""
    import av

    frame = av.AudioFrame.from_ndarray(np.full((2, 4096), 0.25, np.float32), format="fltp", layout="stereo")
    frame.sample_rate = 16_000
    resampler = av.AudioResampler(format=sample_format, layout="mono", rate=16_000)
    out = np.concatenate([f.to_ndarray()[0] for f in [*resampler.resample(frame), *resampler.resample(None)]])
    value = float(np.median(out)) / (32768 if sample_format == "s16" else 1)
    return value / 0.5  # = left weight + right weight, halved (the matrix is symmetric)


# --- the report ---------------------------------------------------------------------------------


def table(rows: list[list[str]]) -> str:
    from bench.serve_load import table as markdown

    return markdown(rows)


def decode_table(runs: list[dict[str, Any]], libraries: list[str]) -> str:
    rows = [
        [
            "clip",
            "format",
            "bytes",
            *(f"{lib} ms/audio s" for lib in libraries),
            *(f"{lib} peak MB (x array)" for lib in libraries),
        ]
    ]
    for run in runs:
        if run["coverage_only"]:
            continue
        cells = [run["clip"], run["format"], f"{run['bytes']:,}"]
        results = [run["results"].get(lib, {"ok": False}) for lib in libraries]
        cells += [f"{1e3 * r['seconds'] / run['seconds']:.2f}" if r["ok"] else "fails" for r in results]
        cells += [
            f"{r['peak_bytes'] / 1e6:.1f} ({r['peak_bytes'] / max(r['array_bytes'], 1):.1f}x)" if r["ok"] else "-"
            for r in results
        ]
        rows.append(cells)
    return table(rows)


def coverage_table(runs: list[dict[str, Any]], libraries: list[str]) -> str:
    rows = [["format", "clip", *libraries, *(f"{lib} stated - decoded ms" for lib in libraries)]]
    for run in runs:
        if run["seconds"] != min(r["seconds"] for r in runs):
            continue
        results = [run["results"].get(lib, {"ok": False}) for lib in libraries]
        cells = [run["format"], run["clip"]]
        cells += [f"yes ({r['rate']} Hz out)" if r["ok"] else f"no: {r['error'][:60]}" for r in results]
        cells += [
            f"{1e3 * (r['stated_s'] - r['decoded_s']):+.1f}" if r["ok"] and r.get("stated_s") else "-" for r in results
        ]
        rows.append(cells)
    return table(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=float, default=30.0, help="seconds of the short clips")
    parser.add_argument("--long", type=float, default=600.0, help="seconds of the long clips")
    parser.add_argument("--repeats", type=int, default=3, help="timed decodes of each short clip (long: one)")
    parser.add_argument("--out", default="bench/results/audio_decode.json")
    parser.add_argument("--worker", nargs=3, metavar=("LIBRARY", "FILE", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        library, path, repeats = args.worker
        print(json.dumps(worker(library, Path(path), int(repeats))))
        return 0

    import av
    import soundfile

    from bench.serve_load import measured_on, write_results

    libraries = ["soundfile", "pyav"]
    try:
        import ortpack.kernel.audio  # noqa: F401

        libraries.append("decode_audio")
    except ImportError:
        pass
    voice = speech(args.long)
    runs: list[dict[str, Any]] = []
    resample: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seconds in (args.short, args.long):
            for clip, (rate, channels) in RATES.items():
                audio = at_rate(voice[: int(seconds * 16_000)], rate, channels)
                for fmt in FORMATS + (COVERAGE_ONLY if seconds == args.short else ()):
                    path = Path(tmp, f"{seconds:.0f}s-{rate}-{channels}.{SUFFIX[fmt]}")
                    path.write_bytes(encode(audio, rate, fmt))
                    repeats = args.repeats if seconds == args.short else 1
                    results = {lib: run_worker(lib, path, repeats) for lib in libraries}
                    runs.append(
                        {
                            "clip": f"{seconds:.0f} s {clip}",
                            "seconds": seconds,
                            "format": fmt,
                            "bytes": path.stat().st_size,
                            "coverage_only": fmt in COVERAGE_ONLY,
                            "results": results,
                        }
                    )
                    print(
                        f"{runs[-1]['clip']:>18} {fmt:6}",
                        "  ".join(f"{k}: {v.get('seconds', '-')}" for k, v in results.items()),
                        flush=True,
                    )
                    if seconds == args.long and clip == "44.1k stereo" and fmt == "mp3":
                        resample = resampling(
                            voice[: audio.shape[1] * 16_000 // rate], audio, rate, path.read_bytes(), 2
                        )
    print("\nDecode to float32 at the file's own rate (best of the timed decodes; peak over the process's RSS before):")
    print(decode_table(runs, libraries))
    print(
        "\nWhich library decodes which format (short clips), and the container's stated duration less the decoded one:"
    )
    print(coverage_table(runs, libraries))
    print(f"\nResampling ({resample['clip']}):")
    print(table([["step", "ms per audio second"]] + [[k, f"{v:.3f}"] for k, v in resample["ms_per_audio_s"].items()]))
    snr = resample["round_trip_snr_db_below_7khz"]
    full = resample["round_trip_snr_db_full_band"]
    print(
        table(
            [["44.1 kHz back to 16 kHz", "SNR below 7 kHz, dB", "SNR to 8 kHz, dB"]]
            + [[k, f"{v:.1f}", f"{full[k]:.1f}"] for k, v in snr.items()]
        )
    )
    print("max |difference|:", json.dumps(resample["max_abs_diff"]))
    print(
        "FFmpeg -ac 1 weight of each stereo channel, by output format:", json.dumps(resample["ffmpeg_downmix_weights"])
    )
    write_results(
        args.out,
        {
            **measured_on(),
            "versions": {
                "soundfile": soundfile.__version__,
                "libsndfile": soundfile.__libsndfile_version__,
                "av": av.__version__,
                "ffmpeg_libavcodec": ".".join(map(str, av.library_versions["libavcodec"])),
                "soxr": __import__("soxr").__version__,
            },
            "short_s": args.short,
            "long_s": args.long,
            "repeats": args.repeats,
            "runs": runs,
            "resampling": resample,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
