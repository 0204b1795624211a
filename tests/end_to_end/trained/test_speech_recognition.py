"""The automatic-speech-recognition task on trained whisper-base (slow): built into a bundle by the
Kubeflow pipeline run locally (`ortpack run`, kfp.local: export, the int8 search, the gate on the
shipped speech, the probe, benchmark, packaging), then served and called with the official
`openai` client and plain multipart requests on 127.0.0.1.

What is checked against PyTorch: the served transcript of a file, decoded by the server as an
upload (WAV at 44.1 kHz stereo, MP3), equals PyTorch's greedy transcript of the same decoded
samples, token for token (verbose_json carries the tokens). Every response format, two windows,
concurrent requests, and the refusals (not audio, an unknown language, a language on a translation,
another model's name, the v2 infer route) with the server's one JSON error shape; a loop too small
for the requests at once answers 429 with Retry-After and loses none.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.servers import running_server
from tests.speech import SAMPLE_RATE, SENTENCES, NoSynthesizer, speak
from tests.whispers import NotInstalled, whisper_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("soundfile")
pytest.importorskip("soxr")

TASK = "automatic-speech-recognition"


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    try:
        return whisper_dir()
    except NotInstalled as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def run(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(the working folder, the finished `ortpack run`) of the pipeline on whisper-base, fp32 and int8."""
    from tests.cli import ortpack

    cwd = tmp_path_factory.mktemp("whisper-run")
    result = ortpack("run", "--pipeline-root", str(cwd / "runs"), "--model", str(checkpoint), "--task", TASK, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd, result


@pytest.fixture(scope="module")
def bundle(run: tuple[Path, Any]) -> Path:
    return run[0] / "dist" / "whisper-base"


@pytest.fixture(scope="module")
def server(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    # fp32: the transcripts compared token for token with PyTorch's (int8's kernels differ by CPU)
    with running_server(bundle, "--variant", "cpu-fp32", log_dir=tmp_path_factory.mktemp("logs")) as running:
        yield running


@pytest.fixture(scope="module")
def sentence() -> np.ndarray:
    try:
        return speak(SENTENCES[1])
    except NoSynthesizer as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def torch_model(checkpoint: Path) -> tuple[Any, Any, Any]:
    from ortpack.components.core.exporters.speech_recognition import load_whisper

    return load_whisper(checkpoint)


def torch_transcript(model: tuple[Any, Any, Any], samples: np.ndarray) -> list[int]:
    from ortpack.components.core.exporters.speech_recognition import greedy_reference

    _, features, whisper = model
    return greedy_reference(whisper, features, [samples], "en")[0]


def files_of(sentence: np.ndarray) -> dict[str, bytes]:
    from bench.audio_decode import at_rate, encode

    return {
        "speech.wav": encode(at_rate(sentence, 44_100, 2), 44_100, "wav"),
        "speech.mp3": encode(at_rate(sentence, SAMPLE_RATE, 1), SAMPLE_RATE, "mp3"),
    }


def post(server: Any, files: dict[str, Any], data: dict[str, Any] | None = None, route: str = "transcriptions") -> Any:
    return httpx.post(f"{server.url}/v1/audio/{route}", files=files, data=data or {}, timeout=120)


def test_the_pipeline_logged_the_gate_as_kfp_metrics(run: tuple[Path, Any]) -> None:
    cwd, result = run
    assert "cpu-int8  pass" in result.stdout and "step 10 of 10: check-gate" in result.stderr
    found = [
        json.loads(path.read_text())["artifacts"]["metrics"]["artifacts"][0]["metadata"]
        for path in sorted((cwd / "runs").glob("**/validate-variant/executor_output.json"))
    ]
    assert len(found) == 2 and all(m["parity.exact_match"] >= 0.6 for m in found), found


def test_the_bundle_passed_its_gate_and_probe(bundle: Path) -> None:
    from ortpack.kernel.bundle import verify_bundle

    manifest = verify_bundle(bundle)
    assert manifest.task == TASK
    assert [v.id for v in manifest.variants] == ["cpu-fp32", "cpu-int8"]
    fp32, int8 = manifest.variants
    for variant in (fp32, int8):
        assert variant.parity.passed and variant.parity.probe is not None and variant.parity.probe.passed
    values = fp32.parity.values
    assert values["single.exact_match"] == values["batched.exact_match"] == 1.0
    assert values["word_error_rate"] == 0.0
    # int8: the decoder's weights only (MatMulNBits), gated on words (measured: every transcript equal)
    assert int8.optimize.ops_after.get("MatMulNBits", 0) > 0 and int8.optimize.int8 is not None
    assert int8.parity.values["word_error_rate"] <= 0.05
    assert {"encoder.onnx", "tokenizer.json"} <= set(manifest.files)


def test_a_served_file_is_pytorchs_transcript_of_the_samples_the_server_decodes(
    server: Any, sentence: np.ndarray, torch_model: tuple[Any, Any, Any]
) -> None:
    from openai import OpenAI

    from ortpack.kernel.audio import decode_audio

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    tokenizer = torch_model[0]
    for name, data in files_of(sentence).items():
        samples = decode_audio(data, max_seconds=60.0, max_bytes=len(data) + 1)
        expected = torch_transcript(torch_model, samples)
        answer = client.audio.transcriptions.create(
            model="whisper-base",
            file=(name, data),
            response_format="verbose_json",
            timestamp_granularities=["segment"],
        )
        (segment,) = answer.segments or []
        assert segment.tokens == expected, name
        assert answer.text == tokenizer.decode(expected, skip_special_tokens=True).strip()
        assert segment.start == 0.0 and segment.end == pytest.approx(len(samples) / SAMPLE_RATE)
        assert answer.language == "english" and answer.duration == pytest.approx(len(samples) / SAMPLE_RATE)
        assert segment.avg_logprob is not None and segment.avg_logprob < 0
        plain = client.audio.transcriptions.create(model="whisper-base", file=(name, data), language="en")
        assert plain.text == answer.text


def test_a_multilingual_model_detects_the_language_as_pytorch_does(
    server: Any, torch_model: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    """German speech with no language named: detected on the first window (the language token
    likeliest after start of transcript), transcribed as PyTorch's `generate` does when it detects."""
    from tests.speech import write_wav

    try:
        german = speak("Guten Morgen, wie geht es Ihnen heute? Das Wetter ist schön.", voice="de")
    except NoSynthesizer as exc:
        pytest.skip(str(exc))
    data = write_wav(tmp_path / "german.wav", german).read_bytes()
    answer = post(server, {"file": ("german.wav", data)}, {"response_format": "verbose_json"}).json()
    assert answer["language"] == "german"
    _, features, whisper = torch_model
    from ortpack.components.core.exporters.speech_recognition import greedy_reference

    expected = greedy_reference(whisper, features, [german], None)[0]
    eot = whisper.generation_config.eos_token_id
    assert answer["segments"][0]["tokens"] == [t for t in expected if t < eot]
    named = post(server, {"file": ("german.wav", data)}, {"response_format": "verbose_json", "language": "de"}).json()
    assert named["language"] == "german" and named["text"] == answer["text"]


def test_every_response_format(server: Any, sentence: np.ndarray) -> None:
    data = files_of(sentence)["speech.wav"]
    text = post(server, {"file": ("a.wav", data)}).json()["text"]
    answers = {fmt: post(server, {"file": ("a.wav", data)}, {"response_format": fmt}) for fmt in ("text", "srt", "vtt")}
    assert all(a.status_code == 200 for a in answers.values())
    assert answers["text"].text == text + "\n"
    assert answers["text"].headers["content-type"].startswith("text/plain")
    assert answers["srt"].text.startswith("1\n00:00:00,000 --> 00:00:0") and text in answers["srt"].text
    assert answers["vtt"].text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:0") and text in answers["vtt"].text


def test_two_windows_are_two_segments(server: Any, sentence: np.ndarray, tmp_path: Path) -> None:
    from tests.speech import write_wav

    window = 30 * SAMPLE_RATE
    recording = np.zeros(window + len(sentence), np.float32)
    recording[: len(sentence)] = sentence
    recording[window:] = sentence
    data = write_wav(tmp_path / "long.wav", recording).read_bytes()
    answer = post(server, {"file": ("long.wav", data)}, {"response_format": "verbose_json"}).json()
    first, second = answer["segments"]
    assert (first["start"], first["end"], second["start"]) == (0.0, 30.0, 30.0)
    assert first["text"] == second["text"] and answer["text"] == f"{first['text']} {second['text']}"
    assert answer["duration"] == pytest.approx(len(recording) / SAMPLE_RATE)


def test_requests_at_once_all_get_the_same_transcript(server: Any, sentence: np.ndarray) -> None:
    data = files_of(sentence)["speech.mp3"]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: post(server, {"file": ("a.mp3", data)}), range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert len({a.json()["text"] for a in answers}) == 1


@pytest.mark.parametrize(
    ("files", "data", "route", "status", "says"),
    [
        ({"file": ("a.wav", b"this is not audio at all")}, {}, "transcriptions", 400, "not audio"),
        ({"file": ("a.wav", b"RIFF")}, {"language": "xx"}, "transcriptions", 400, "language"),
        ({"file": ("a.wav", b"RIFF")}, {"language": "de"}, "translations", 400, "language"),
        ({"file": ("a.wav", b"RIFF")}, {"model": "another-model"}, "transcriptions", 404, "another-model"),
        ({"other": ("a.wav", b"RIFF")}, {}, "transcriptions", 400, "file"),
    ],
)
def test_refusals_have_one_json_shape(
    server: Any, sentence: np.ndarray, files: dict[str, Any], data: dict[str, str], route: str, status: int, says: str
) -> None:
    if data.get("language") == "xx":  # a real file, so the language is what is refused
        files = {"file": ("a.wav", files_of(sentence)["speech.wav"])}
    answer = post(server, files, data, route)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert says in error["message"] and error["code"] == status


def test_a_json_body_is_415_and_v2_infer_is_refused(server: Any) -> None:
    answer = httpx.post(f"{server.url}/v1/audio/transcriptions", json={"file": "x"}, timeout=30)
    assert answer.status_code == 415 and "multipart/form-data" in answer.json()["error"]["message"]
    infer = httpx.post(
        f"{server.url}/v2/models/whisper-base/infer",
        json={"inputs": [{"name": "audio", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]},
        timeout=30,
    )
    assert infer.status_code == 400 and "/v1/audio/transcriptions" in infer.json()["error"]["message"]


def test_a_full_loop_answers_429_and_loses_nothing(bundle: Path, sentence: np.ndarray, tmp_path: Path) -> None:
    """A loop that holds one window: bursts of 6 recordings of 3 windows each (one window at a time
    each, so a recording never waits on itself) until one finds the loop full (whether two
    overlap depends on timing; 4 bursts at most). Every answer is 200 or 429 with Retry-After and
    the JSON error, and the server then serves a recording whole."""
    from tests.speech import write_wav

    gap = np.zeros(SAMPLE_RATE // 2, np.float32)
    speech = np.tile(np.concatenate([sentence, gap]), 20)[: 75 * SAMPLE_RATE]
    data = write_wav(tmp_path / "long.wav", speech).read_bytes()
    args = ("--variant", "cpu-fp32", "--max-running-sequences", "1", "--max-waiting-sequences", "1")
    statuses: list[int] = []
    with running_server(bundle, *args, log_dir=tmp_path) as small:
        for _ in range(4):
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(lambda _: post(small, {"file": ("a.wav", data)}), range(6)))
            for answer in answers:
                statuses.append(answer.status_code)
                if answer.status_code == 429:
                    assert int(answer.headers["retry-after"]) >= 1
                    assert "overloaded" in json.loads(answer.text)["error"]["message"]
            if 429 in statuses:
                break
        alone = post(small, {"file": ("a.wav", data)})  # once the bursts are over, the loop is whole again
    assert alone.status_code == 200 and len(alone.json()["text"]) > 100
    assert set(statuses) <= {200, 429} and 429 in statuses, statuses
