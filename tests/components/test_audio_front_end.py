"""Whisper's log-mel front end as an ONNX graph (components/core/exporters/audio_common.py) against
transformers' `WhisperFeatureExtractor`, at 80 mels (the defaults) and 128 (large-v3's).

Two references: the extractor's public call (torch's float32 STFT where torch is installed, as
here), which the graph must match within `GOAL` (1e-4), and its float64 numpy path, which the graph
follows to float32's rounding (`EXACT`). What the graph differs from the call by is the call's own
float32 error (up to 7.3e-5 on a sine sweep, measured).

The batch contract: rows are clips padded with zeros by the caller to a common length; each row's
features are the extractor's on that clip alone (it zero-pads every clip to 30 s anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ortpack.components.core.errors import InvalidSpecError
from ortpack.components.core.exporters.audio_common import Fourier, log_mel_settings, whisper_log_mel_graph
from tests.speech import SAMPLE_RATE, SENTENCES, NoSynthesizer, speak

GOAL = 1e-4  # the graph against WhisperFeatureExtractor's call
EXACT = 1e-6  # against its float64 numpy path: a float32 rounding or two (measured 1.2e-7)
CHUNK = 30 * SAMPLE_RATE
MELS = (80, 128)


def white_noise() -> np.ndarray:
    return (0.1 * np.random.default_rng(0).standard_normal(5 * SAMPLE_RATE)).astype(np.float32)


def sine_sweep() -> np.ndarray:
    """50 Hz to 8 kHz in 10 s: the weak bins beside a pure tone are where float32 STFTs go wrong."""
    t = np.arange(10 * SAMPLE_RATE) / SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * (50 * t + (8000 - 50) / 20 * t**2))).astype(np.float32)


def silence() -> np.ndarray:
    """All zeros: every mel value is the 1e-10 floor, the clamp path."""
    return np.zeros(SAMPLE_RATE, np.float32)


def shorter_than_a_hop() -> np.ndarray:
    return (0.1 * np.random.default_rng(1).standard_normal(100)).astype(np.float32)


def exactly_30_s() -> np.ndarray:
    t = np.arange(CHUNK) / SAMPLE_RATE
    noise = 0.01 * np.random.default_rng(2).standard_normal(CHUNK)
    return (0.3 * np.sin(2 * np.pi * 440 * t) + noise).astype(np.float32)


def longer_than_30_s() -> np.ndarray:
    """35 s, cut to 30: the last 5 s must not count, also in the per-example maximum."""
    clip = (0.1 * np.random.default_rng(3).standard_normal(35 * SAMPLE_RATE)).astype(np.float32)
    clip[CHUNK:] *= 10.0
    return clip


def speech() -> np.ndarray:
    try:
        return speak(SENTENCES[1])
    except NoSynthesizer as exc:
        pytest.skip(str(exc))


CLIPS: dict[str, Callable[[], np.ndarray]] = {
    "speech": speech,
    "white_noise": white_noise,
    "sine_sweep": sine_sweep,
    "silence": silence,
    "shorter_than_a_hop": shorter_than_a_hop,
    "exactly_30_s": exactly_30_s,
    "longer_than_30_s": longer_than_30_s,
}


class FrontEnd:
    """One mel size's extractor and the graph built from it, in an ONNX Runtime CPU session."""

    def __init__(self, n_mels: int, fourier: Fourier = "dft") -> None:
        import onnxruntime as ort
        from transformers import WhisperFeatureExtractor

        self.extractor = WhisperFeatureExtractor(feature_size=n_mels)
        self.model = whisper_log_mel_graph(log_mel_settings(self.extractor), fourier=fourier)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(self.model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def graph(self, batch: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {"audio": batch})[0])

    def call(self, clips: np.ndarray | list[np.ndarray]) -> np.ndarray:
        """The extractor as users call it (torch's float32 path where torch is installed)."""
        return np.asarray(self.extractor(clips, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features)

    def numpy_path(self, clip: np.ndarray) -> np.ndarray:
        """Its float64 numpy path on the clip padded or cut to 30 s, as the call pads it."""
        chunk = np.zeros(CHUNK, np.float32)
        chunk[: min(len(clip), CHUNK)] = clip[:CHUNK]
        return np.asarray(self.extractor._np_extract_fbank_features(chunk[None], "cpu"))


@pytest.fixture(scope="module", params=MELS, ids=[f"{n}_mels" for n in MELS])
def front_end(request: pytest.FixtureRequest) -> FrontEnd:
    return FrontEnd(request.param)


def dims(value: Any) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def worst(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("name", list(CLIPS))
def test_graph_features_are_the_extractors(front_end: FrontEnd, name: str) -> None:
    """Each clip alone: within 1e-4 of the extractor's call, and within float32 rounding of its
    float64 numpy path."""
    clip = CLIPS[name]()
    features = front_end.graph(clip[None])
    n_mels = front_end.extractor.feature_size
    assert features.shape == (1, n_mels, 3000) and features.dtype == np.float32
    off_call, off_numpy = worst(features, front_end.call(clip)), worst(features, front_end.numpy_path(clip))
    assert off_call <= GOAL, f"{name}, {n_mels} mels: {off_call:.2e} off the extractor's call"
    assert off_numpy <= EXACT, f"{name}, {n_mels} mels: {off_numpy:.2e} off the extractor's numpy path"


def test_batch_rows_are_the_clips_alone(front_end: FrontEnd) -> None:
    """Two clips of different lengths, the shorter padded with zeros by the caller: each row of the
    graph's batch is the extractor's features of that clip (its batch call on the unpadded clips,
    and its call on the padded row: trailing zeros change nothing), with each row's own floor."""
    long, short = sine_sweep(), 0.01 * white_noise()  # the quiet row's floor must not be the loud one's
    batch = np.zeros((2, len(long)), np.float32)
    batch[0], batch[1, : len(short)] = long, short
    features = front_end.graph(batch)
    expected = front_end.call([long, short])  # the extractor pads each clip to 30 s itself
    assert worst(features, expected) <= GOAL
    assert worst(front_end.call(batch[1]), front_end.call(short)) == 0.0  # trailing zeros change nothing
    for row, clip in enumerate((long, short)):
        assert worst(features[row : row + 1], front_end.graph(clip[None])) <= EXACT


def test_graph_contract() -> None:
    """`audio` float32 `[batch, samples]`, both dynamic; `input_features` `[batch, 80, 3000]`."""
    from onnx import TensorProto

    model = FrontEnd(80).model
    (audio,), (features,) = model.graph.input, model.graph.output
    assert (audio.name, audio.type.tensor_type.elem_type, dims(audio)) == (
        "audio",
        TensorProto.FLOAT,
        ["batch", "samples"],
    )
    assert (features.name, features.type.tensor_type.elem_type) == ("input_features", TensorProto.FLOAT)
    assert dims(features) == ["batch", 80, 3000]
    assert {imp.domain: imp.version for imp in model.opset_import} == {"": 17}


def test_stft_operator_misses_the_goal() -> None:
    """Why the graph takes its own float64 DFT: ONNX Runtime's STFT kernel (1.32) computes a
    400-point DFT's angles in float32 unreduced, ~2e-5 off per bin, which the log carries far past
    1e-4 in the weak bins beside a tone (measured 6.8e-3 on the sweep; 1.5e-4 even on white noise).
    When this fails, the kernel was fixed: measure again and reconsider the default in
    audio_common.py."""
    stft = FrontEnd(80, fourier="stft")
    clip = sine_sweep()
    assert worst(stft.graph(clip[None]), stft.numpy_path(clip)) > GOAL


def test_refusals() -> None:
    from transformers import WhisperFeatureExtractor

    with pytest.raises(InvalidSpecError, match="dithers"):
        log_mel_settings(WhisperFeatureExtractor(dither=1e-4))
    with pytest.raises(InvalidSpecError, match="pads with 0.5"):
        log_mel_settings(WhisperFeatureExtractor(padding_value=0.5))
    settings = log_mel_settings(WhisperFeatureExtractor())
    with pytest.raises(InvalidSpecError, match="opset 17"):
        whisper_log_mel_graph(settings, opset=16)
    unknown: Any = "fft"
    with pytest.raises(InvalidSpecError, match="known: dft, stft"):
        whisper_log_mel_graph(settings, fourier=unknown)
