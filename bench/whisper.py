"""Whisper base transcribing on this CPU: ortpack's two graphs in the generation loop against
PyTorch's `generate` and faster-whisper (CTranslate2), on the same audio.

    python bench/whisper.py [--rounds 3] [--concurrent 8] [--out bench/results/whisper.json]

The checkpoint is the trained whisper-base `make trained` installs (tests/whispers.py: the same
weights as transformers' and as CTranslate2's files). The clips are espeak-ng speech
(tests/speech.py): each shipped sentence alone (2.5-5 s) and all four twice over, 0.3 s apart
(27 s: nearly a whole window). Every engine decodes greedily, English, transcribe, no timestamps,
one 30 s window per clip; faster-whisper gets the waveform padded to 30 s (its front end pads the
features otherwise; tests/end_to_end/trained/test_whisper_weights.py says why) with its voice
activity filter off and without the previous text as a prompt.

Engines: `pytorch` (transformers, fp32, the processor's features), `ortpack-fp32` (the exported
graphs, the log-mel front end in the encoder graph), `ortpack-int8` (what the task ships as
cpu-int8: the decoder's weights in int8, `MatMulNBits` in blocks of 128 with int8 compute, the
encoder fp32), `dynamic-int8` (ONNX Runtime's stock dynamic quantization of every MatMul of both
graphs: int8 weights per channel, activations quantized per call; the front end stays float;
`-encoder` and `-decoder`: one graph only), `faster-whisper-int8` and `-fp32`. All use 2
threads. Time: the best of `--rounds` per clip, audio decoding excluded (every engine gets the
samples). Then ortpack-fp32 with `--concurrent` clips submitted at once (the loop batches their
decoding) against the same clips one after another.

Prints tables and writes the JSON: per engine and clip the seconds, the real-time factor and the
transcript; per engine the word error rate against the spoken sentences and whether each
transcript equals PyTorch's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

THREADS = 2
WINDOW = 30 * 16_000


def clips() -> dict[str, tuple[np.ndarray, str]]:
    """name -> (16 kHz samples, what was said)."""
    from tests.speech import SENTENCES, speak

    out = {f"sentence-{i + 1}": (speak(s), s) for i, s in enumerate(SENTENCES)}
    gap = np.zeros(int(0.3 * 16_000), np.float32)
    parts = [p for _ in range(2) for name in out for p in (out[name][0], gap)]
    long = np.concatenate(parts)[:WINDOW]
    out["all-twice"] = (long, " ".join([*SENTENCES, *SENTENCES]))
    return out


def quantize_int8(encoder: Path, decoder: Path, front_nodes: set[str], out: Path) -> tuple[Path, Path]:
    """Both graphs with their MatMuls quantized dynamically (int8 weights per channel); the
    encoder's front end (`front_nodes`) stays float."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    names = {n.name for n in onnx.load(str(encoder), load_external_data=False).graph.node}
    kept = sorted(names & front_nodes)
    q_enc, q_dec = out / "encoder.int8.onnx", out / "decoder.int8.onnx"
    common = {"op_types_to_quantize": ["MatMul"], "per_channel": True, "weight_type": QuantType.QInt8}
    quantize_dynamic(str(encoder), str(q_enc), nodes_to_exclude=kept, **common)
    quantize_dynamic(str(decoder), str(q_dec), **common)
    return q_enc, q_dec


def ortpack_engine(encoder: Path, decoder: Path, model: Any, tokenizer: Any) -> tuple[Callable[..., str], Any]:
    import onnxruntime as ort

    from ortpack.components.core.exporters.speech_recognition import settings_of
    from ortpack.kernel.contracts.text_generation import DecoderSettings
    from ortpack.kernel.generation.decoder import Decoder
    from ortpack.kernel.generation.engine import Generator
    from ortpack.kernel.generation.scheduler import Limits
    from ortpack.kernel.generation.whisper import Encoder, Transcriber

    s = settings_of(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS

    def session(path: Path) -> Any:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    geometry = DecoderSettings(
        model_type="whisper", layers=s.layers, kv_heads=s.heads, head_dim=s.head_dim, vocab_size=s.vocab_size
    )
    generator = Generator(
        Decoder(session(decoder), geometry),
        tokenizer,
        [s.end_of_text],
        Limits(capacity=16 * s.max_target_positions, context=s.max_target_positions),
    )
    generator.warm_up()
    generator.start()
    transcriber = Transcriber(Encoder(session(encoder), s), generator, s)
    return (lambda audio: transcriber.transcribe(audio, language="en").text), generator


def torch_engine(model: Any, features: Any, tokenizer: Any) -> Callable[..., str]:
    import torch

    torch.set_num_threads(THREADS)

    def run(audio: np.ndarray) -> str:
        feats = features(audio, sampling_rate=16_000, return_tensors="pt").input_features
        with torch.inference_mode():
            ids = model.generate(feats, language="en", task="transcribe", return_timestamps=False, num_beams=1)
        return tokenizer.decode(ids[0], skip_special_tokens=True).strip()

    return run


def faster_whisper_engine(compute_type: str) -> Callable[..., str]:
    from faster_whisper import WhisperModel

    from tests.whispers import ctranslate2_whisper_dir

    model = WhisperModel(str(ctranslate2_whisper_dir()), device="cpu", compute_type=compute_type, cpu_threads=THREADS)

    def run(audio: np.ndarray) -> str:
        padded = np.zeros(max(WINDOW, len(audio)), np.float32)
        padded[: len(audio)] = audio
        segments, _ = model.transcribe(
            padded,
            language="en",
            task="transcribe",
            beam_size=1,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        return " ".join(s.text.strip() for s in segments).strip()

    return run


def timed(run: Callable[..., str], audio: np.ndarray, rounds: int) -> tuple[float, str]:
    best, text = float("inf"), ""
    for _ in range(rounds):
        started = time.perf_counter()
        text = run(audio)
        best = min(best, time.perf_counter() - started)
    return best, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--out", default="bench/results/whisper.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bench.serve_load import measured_on, write_results
    from ortpack.components.core.exporters.audio_common import log_mel_settings, whisper_log_mel_graph
    from ortpack.components.core.exporters.speech_recognition import export_decoder, export_encoder, load_whisper
    from ortpack.components.core.graph_files import save_graph
    from ortpack.components.core.quantization.weight_only import quantize_weight_only
    from ortpack.components.core.tasks.automatic_speech_recognition import INT8_CANDIDATES
    from tests.speech import word_error_rate
    from tests.whispers import whisper_dir

    tokenizer, features, model = load_whisper(whisper_dir())
    audio = clips()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ortpack-whisper-bench-") as tmp:
        work = Path(tmp)
        export_encoder(model, features, work / "encoder.onnx")
        export_decoder(model, work / "decoder.onnx")
        front = {n.name for n in whisper_log_mel_graph(log_mel_settings(features)).graph.node}
        q_enc, q_dec = quantize_int8(work / "encoder.onnx", work / "decoder.onnx", front, work)
        w_dec = work / "decoder.weights-int8.onnx"
        quantize_weight_only(work / "decoder.onnx", w_dec, INT8_CANDIDATES[0], save_graph)
        engines: dict[str, Callable[[], tuple[Callable[..., str], Any]]] = {
            "pytorch": lambda: (torch_engine(model, features, tokenizer), None),
            "ortpack-fp32": lambda: ortpack_engine(work / "encoder.onnx", work / "decoder.onnx", model, tokenizer),
            "ortpack-int8": lambda: ortpack_engine(work / "encoder.onnx", w_dec, model, tokenizer),
            "dynamic-int8": lambda: ortpack_engine(q_enc, q_dec, model, tokenizer),
            "dynamic-int8-encoder": lambda: ortpack_engine(q_enc, work / "decoder.onnx", model, tokenizer),
            "dynamic-int8-decoder": lambda: ortpack_engine(work / "encoder.onnx", q_dec, model, tokenizer),
            "faster-whisper-int8": lambda: (faster_whisper_engine("int8"), None),
            "faster-whisper-fp32": lambda: (faster_whisper_engine("float32"), None),
        }
        concurrency: dict[str, float] = {}
        for name, make in engines.items():
            run, generator = make()
            rows = {}
            for clip, (samples, _) in audio.items():
                seconds, text = timed(run, samples, args.rounds)
                rows[clip] = {"seconds": seconds, "rtf": seconds / (len(samples) / 16_000), "text": text}
            results[name] = rows
            if name == "ortpack-fp32":
                batch = [audio[c][0] for c in audio for _ in range(args.concurrent // len(audio) + 1)]
                batch = batch[: args.concurrent]
                started = time.perf_counter()
                for samples in batch:
                    run(samples)
                concurrency["one_after_another_s"] = time.perf_counter() - started
                started = time.perf_counter()
                with ThreadPoolExecutor(len(batch)) as pool:
                    list(pool.map(run, batch))
                concurrency["at_once_s"] = time.perf_counter() - started
                concurrency["clips"] = len(batch)
            if generator is not None:
                generator.stop()
    spoken = [text for _, text in audio.values()]
    reference = [results["pytorch"][c]["text"] for c in audio]
    summary = {}
    print(f"{'engine':<22}" + "".join(f"{c:>14}" for c in audio) + f"{'WER':>8}{'= PyTorch':>11}")
    for name, rows in results.items():
        texts = [rows[c]["text"] for c in audio]
        same = sum(t == r for t, r in zip(texts, reference, strict=True))
        summary[name] = {"wer": word_error_rate(spoken, texts), "equal_to_pytorch": same, "clips": len(texts)}
        cells = "".join(f"{rows[c]['seconds']:>13.2f}s" for c in audio)
        print(f"{name:<22}{cells}{summary[name]['wer']:>8.3f}{same:>8}/{len(texts)}")
    base = results["pytorch"]["all-twice"]["seconds"]
    print(
        "\nspeed-up over PyTorch on the 27 s clip: "
        + ", ".join(f"{n} {base / rows['all-twice']['seconds']:.2f}x" for n, rows in results.items() if n != "pytorch")
    )
    ratio = concurrency["one_after_another_s"] / concurrency["at_once_s"]
    print(
        f"ortpack-fp32, {concurrency['clips']} clips: one after another {concurrency['one_after_another_s']:.2f} s, "
        f"at once {concurrency['at_once_s']:.2f} s ({ratio:.2f}x)"
    )
    write_results(
        args.out,
        {
            **measured_on(),
            "checkpoint": "whisper-base (trained, tests/whispers.py)",
            "threads": THREADS,
            "rounds": args.rounds,
            "clips": {c: {"seconds": len(s) / 16_000, "spoken": t} for c, (s, t) in audio.items()},
            "results": results,
            "summary": summary,
            "concurrent": concurrency,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
