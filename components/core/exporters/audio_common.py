"""What the exporters of speech tasks will share: Whisper's log-mel front end as an ONNX graph.

`whisper_log_mel_graph`: mono waveforms `audio` float32 `[batch, samples]` (any length) to
`input_features` float32 `[batch, n_mels, frames]` (80 or 128 mels, 3000 frames for 30 s), the
steps of transformers' `WhisperFeatureExtractor` with its defaults: zeros appended or the waveform
cut to the 30 s chunk, a centred STFT (periodic Hann window, reflect padding), the power spectrum
through the model's own mel filter bank, then log10, a floor 8 decades below each example's
loudest value, and `(x + 4) / 4`. The spectrum and the log are taken in float64, as the
extractor's numpy path takes them (`_dft_power` says why). Built node by node, like the image
tasks' preprocessing (image_common.py), so that a speech task can compose it with the encoder and
keep it out of the encoder's quantization.

Why the filter bank is a constant: ONNX's `MelWeightMatrix` makes unnormalised HTK triangles,
while Whisper's are Slaney-scaled and area-normalised (DESIGN.md section 7); the extractor's own
`mel_filters` is what the model was trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from ortpack.components.core.errors import InvalidSpecError

AUDIO_NAME = "audio"  # the graph's input: mono waveforms at the model's sampling rate
FEATURES_NAME = "input_features"  # its output, the name Whisper's encoder takes

MIN_OPSET = 17  # STFT (the "stft" variant) arrives in opset 17; one floor keeps the two variants alike
LOG_FLOOR = 1e-10  # the extractor's mel_floor: silence becomes log10(1e-10) = -10, not -inf
DYNAMIC_RANGE = 8.0  # decades of power kept below each example's maximum
OFFSET, SCALE = 4.0, 4.0  # (log10 + 4) / 4: Whisper's features sit roughly in [-1, 1]

# How the graph takes the short-time Fourier transform: "dft", the windowed DFT as a float64 matrix
# over the gathered frames (the default, see `_dft_power`), or "stft", ONNX's STFT operator (kept to
# compare: it misses the 1e-4 goal)
Fourier = Literal["dft", "stft"]
FOURIER: tuple[str, ...] = get_args(Fourier)


@dataclass(frozen=True, kw_only=True, eq=False)  # eq=False: an array field makes == and hash ambiguous
class LogMelSettings:
    """What the front end needs from a Whisper feature extractor; `mel_filters` is
    `[n_fft // 2 + 1, n_mels]`, the extractor's own (float64, as it keeps it)."""

    sampling_rate: int
    n_fft: int
    hop_length: int
    n_samples: int  # the chunk: chunk_length * sampling_rate (480000 for 30 s at 16 kHz)
    n_mels: int
    mel_filters: np.ndarray

    def __post_init__(self) -> None:
        bins = self.n_fft // 2 + 1
        if self.mel_filters.shape != (bins, self.n_mels):
            raise InvalidSpecError(
                f"mel_filters is {list(self.mel_filters.shape)}; n_fft {self.n_fft} and {self.n_mels} mels "
                f"need [{bins}, {self.n_mels}]"
            )
        if min(self.n_fft, self.hop_length, self.n_samples, self.sampling_rate) <= 0:
            raise InvalidSpecError("sampling_rate, n_fft, hop_length and n_samples must be positive")
        if self.n_samples <= self.n_fft // 2:
            raise InvalidSpecError(f"a chunk of {self.n_samples} samples is too short to reflect-pad by n_fft // 2")

    @property
    def frames(self) -> int:
        """Feature frames per chunk: the STFT's `n_samples // hop + 1`, less the last (the extractor drops it)."""
        return self.n_samples // self.hop_length


def log_mel_settings(feature_extractor: Any) -> LogMelSettings:
    """The settings of a transformers `WhisperFeatureExtractor`. Refuses what the graph does not
    reproduce: dithering (random noise added per call) and a padding value other than silence."""
    if float(getattr(feature_extractor, "dither", 0.0)) != 0.0:
        raise InvalidSpecError(f"the feature extractor dithers ({feature_extractor.dither}); the graph does not")
    if float(feature_extractor.padding_value) != 0.0:
        raise InvalidSpecError(
            f"the feature extractor pads with {feature_extractor.padding_value}; the graph pads with silence (0.0)"
        )
    return LogMelSettings(
        sampling_rate=int(feature_extractor.sampling_rate),
        n_fft=int(feature_extractor.n_fft),
        hop_length=int(feature_extractor.hop_length),
        n_samples=int(feature_extractor.n_samples),
        n_mels=int(feature_extractor.feature_size),
        mel_filters=np.asarray(feature_extractor.mel_filters),
    )


def hann_window(length: int) -> np.ndarray:
    """The periodic Hann window the extractor uses (`window_function(n_fft, "hann")`,
    `torch.hann_window`): numpy's symmetric window of `length + 1`, its last point dropped."""
    return np.hanning(length + 1)[:-1]


def whisper_log_mel_graph(settings: LogMelSettings, opset: int = MIN_OPSET, fourier: Fourier = "dft") -> Any:
    """`audio` float32 `[batch, samples]` -> `input_features` float32 `[batch, n_mels, frames]`.

    Each row is one example, as `WhisperFeatureExtractor()(row, sampling_rate=...)` with its
    defaults (padding "max_length", truncation, no normalisation) sees it. The batch contract: the
    caller pads shorter clips with zeros to the batch's length; trailing zeros do not change a
    row's features, because the extractor pads every clip with zeros to the chunk anyway (a row's
    features equal the extractor's on the clip without them). The floor is per row, as the
    extractor computes it example by example.

    Not covered: `do_normalize=True` (zero-mean unit-variance over the clip's unpadded samples,
    which would need each row's length), dithering, other padding values (`log_mel_settings`
    refuses them), resampling (the audio must be at `settings.sampling_rate`), and more than one
    chunk (audio past the chunk is dropped, as the extractor drops it).
    """
    import onnx
    from onnx import TensorProto, helper

    if fourier not in FOURIER:
        raise InvalidSpecError(f"unknown Fourier transform {fourier!r}; known: {', '.join(FOURIER)}")
    if opset < MIN_OPSET:
        raise InvalidSpecError(f"the log-mel graph needs opset {MIN_OPSET} or later (STFT); got {opset}")
    g = _Nodes(opset)
    half = settings.n_fft // 2

    # pad with silence or cut to the chunk: pad by max(0, n_samples - length), then slice to n_samples
    length = g.op(
        "Slice",
        g.op("Shape", AUDIO_NAME, name="audio_shape"),
        g.const("length_from", [1]),
        g.const("length_to", [2]),
        name="audio_length",
    )
    chunk = g.const("chunk_samples", [settings.n_samples])
    missing = g.op(
        "Max", g.op("Sub", chunk, length, name="chunk_minus_length"), g.const("zero", [0]), name="missing_samples"
    )
    pads = g.op("Concat", g.const("no_padding_before", [0, 0, 0]), missing, axis=0, name="chunk_pads")
    padded = g.op("Pad", AUDIO_NAME, pads, g.const("silence", np.float32(0.0), np.float32), name="pad_with_silence")
    waveform = g.op("Slice", padded, g.const("start", [0]), chunk, g.const("samples_axis", [1]), name="cut_to_chunk")

    # centred frames: frame t is centred on sample t * hop (reflect padding by n_fft // 2 each side)
    centred = g.op("Pad", waveform, g.const("centre_pads", [0, half, 0, half]), mode="reflect", name="centre")
    power = _dft_power(g, centred, settings) if fourier == "dft" else _stft_power(g, centred, settings)

    # mel filter bank and log10 of at least 1e-10, in float64 as the extractor's numpy path, then float32
    filters = g.const("mel_filters", settings.mel_filters, np.float64)  # [bins, n_mels]
    mel = g.op("MatMul", power, filters, name="mel")  # [batch, frames, n_mels]
    floored = g.op("Max", mel, g.const("log_floor", LOG_FLOOR, np.float64), name="mel_floor")
    ln = g.op("Log", floored, name="ln")
    log10 = g.op("Mul", ln, g.const("ln_to_log10", 1 / math.log(10), np.float64), name="log10")
    log10 = g.op("Cast", log10, to=TensorProto.FLOAT, name="to_float32")
    log10 = g.op("Transpose", log10, perm=[0, 2, 1], name="mels_by_frames")  # [batch, n_mels, frames]

    # keep 8 decades below each example's maximum, then (x + 4) / 4
    loudest = g.reduce("ReduceMax", log10, [1, 2], keepdims=1, name="loudest")  # [batch, 1, 1]
    floor = g.op("Sub", loudest, g.const("dynamic_range", np.float32(DYNAMIC_RANGE), np.float32), name="floor")
    clamped = g.op("Max", log10, floor, name="clamp")
    shifted = g.op("Add", clamped, g.const("offset", np.float32(OFFSET), np.float32), name="shift")
    g.op("Div", shifted, g.const("scale", np.float32(SCALE), np.float32), name="scale", output=FEATURES_NAME)

    graph = helper.make_graph(
        g.nodes,
        "whisper_log_mel",
        [helper.make_tensor_value_info(AUDIO_NAME, TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info(FEATURES_NAME, TensorProto.FLOAT, ["batch", settings.n_mels, settings.frames])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortpack")
    onnx.checker.check_model(model, full_check=True)
    return model


def dft_basis(n_fft: int, window: np.ndarray) -> np.ndarray:
    """The onesided DFT of a windowed frame, `[n_fft, 2 * bins]`: the real parts' columns (cos),
    then the imaginary parts' (-sin), each times the window; float64, angles reduced modulo n_fft
    in integers so every weight is exact to float64's rounding."""
    bins = n_fft // 2 + 1
    turns = np.outer(np.arange(n_fft), np.arange(bins)) % n_fft  # n * k mod N: the angle in 2π/N steps
    angle = 2.0 * np.pi * turns / n_fft
    return np.concatenate([np.cos(angle), -np.sin(angle)], axis=1) * window[:, None]


def _dft_power(g: _Nodes, centred: str, settings: LogMelSettings) -> str:
    """The power spectrum `[batch, frames, bins]` (float64) of the centred waveforms `[batch,
    samples]` (float32): the kept frames gathered (the extractor drops the last one: it is never
    computed), then one float64 matrix product with `dft_basis`.

    Why not ONNX's STFT (`fourier="stft"`): ONNX Runtime's CPU kernel (1.32) takes a length that
    is not a power of two (Whisper's 400) by a direct DFT whose angles `k * n * (-2π / N)` it
    computes in float32 without reducing them (~1253 rad at k * n = 200 * 399, so ~7e-5 rad off):
    each bin is off by ~2e-5 of its frame's magnitude (median, against numpy's rfft; torch's float32
    FFT 1.7e-7). Weak bins carry that into the log: features off by 1.5e-4 on white noise, 1.3e-3
    on 30 s of noise and 6.8e-3 on a sine sweep.

    Why float64: in float32 even an exact DFT loses weak bins beside a strong one (a pure tone's
    bins just above the 8-decade floor are sums of ~400 terms that cancel to 1e-4 of their size).
    Against the float64 numpy path, a float32 strided Conv over the same basis was 9.2e-5 off on a
    pure tone, and torch's float32 FFT (the extractor's own path when torch is installed) 7.3e-5
    on a sweep; in float64 the graph follows the numpy path to float32's rounding (1.2e-7). It
    costs n_fft * 2 * bins multiply-adds a frame (0.48 G for 30 s): the whole graph takes ~37 ms
    for 30 s on one core of a loaded machine, ~135 ms with the STFT operator (a float32 Conv DFT
    alone: 13 ms)."""
    from onnx import TensorProto

    frames, hop, n_fft = settings.frames, settings.hop_length, settings.n_fft
    starts = g.op(
        "Range",
        g.const("zero_samples", 0),
        g.const("frames_end", frames * hop),
        g.const("hop", hop),
        name="frame_starts",
    )
    offsets = g.op("Range", g.const("zero_offset", 0), g.const("n_fft", n_fft), g.const("one", 1), name="frame_offsets")
    starts = g.op("Unsqueeze", starts, g.const("frame_axis", [1]), name="frame_starts_column")
    indices = g.op("Add", starts, offsets, name="frame_indices")  # [frames, n_fft]
    signal = g.op("Cast", centred, to=TensorProto.DOUBLE, name="to_float64")
    framed = g.op("Gather", signal, indices, axis=1, name="frames")  # [batch, frames, n_fft]
    basis = g.const("windowed_dft_basis", dft_basis(n_fft, hann_window(n_fft)), np.float64)  # [n_fft, 2 * bins]
    spectrum = g.op("MatMul", framed, basis, name="windowed_dft")  # real parts, then imaginary parts
    squares = g.op("Mul", spectrum, spectrum, name="squares")
    parts = g.op("Reshape", squares, g.const("real_imaginary", [0, 0, 2, n_fft // 2 + 1]), name="split_parts")
    return g.reduce("ReduceSum", parts, [2], keepdims=0, name="power")


def _stft_power(g: _Nodes, centred: str, settings: LogMelSettings) -> str:
    """The power spectrum `[batch, frames, bins]` by ONNX's STFT operator (see `_dft_power` for
    why it is not the default)."""
    from onnx import TensorProto

    signal = g.op("Unsqueeze", centred, g.const("channel_axis", [2]), name="real_signal")  # [batch, samples, 1]
    window = g.const("hann_window", hann_window(settings.n_fft), np.float32)
    stft = g.op("STFT", signal, g.const("hop", np.int64(settings.hop_length)), window, onesided=1, name="stft")
    # [batch, frames + 1, bins, 2]: the extractor drops the last frame, so it goes before the squares
    kept = g.op(
        "Slice",
        stft,
        g.const("first_frame", [0]),
        g.const("frames", [settings.frames]),
        g.const("frames_axis", [1]),
        name="drop_last_frame",
    )
    power = g.reduce("ReduceSum", g.op("Mul", kept, kept, name="squares"), [-1], keepdims=0, name="power")
    return g.op("Cast", power, to=TensorProto.DOUBLE, name="power_float64")  # [batch, frames, bins]


class _Nodes:
    """Nodes and constants of the front end, each named for what it computes (a node and its output
    share the name). image_common's `GraphBuilder` numbers its names instead, and importing it
    would bring torch along."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def const(self, name: str, value: Any, dtype: Any = np.int64) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, name: str, output: str | None = None, **attributes: Any) -> str:
        from onnx import helper

        out = output or name
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attributes))
        return out

    def reduce(self, op_type: str, x: str, axes: list[int], *, keepdims: int, name: str) -> str:
        """A reduction over `axes`: an attribute up to opset 17 (ReduceMax; ReduceSum's is an
        input from 13), an input after."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, x, self.const(f"{name}_axes", axes), keepdims=keepdims, name=name)
        return self.op(op_type, x, axes=axes, keepdims=keepdims, name=name)
