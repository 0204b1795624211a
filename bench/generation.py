"""Generation speed on a ~0.5B-parameter decoder: ortpack's variants, PyTorch eager `generate` and
ONNX Runtime GenAI (its model builder and its own loop) on the same checkpoint, in one process, in
alternate rounds.

    python bench/generation.py [--checkpoint DIR] [--prompt 128] [--new 64] [--rounds 3] \
        [--engines ortpack-fp32,ortpack-int4-b128-a4,...] [--out bench/results/generation.json]

The checkpoint (default: made once under build/bench-generation/) has Qwen2-0.5B's shape (24
layers, hidden 896, 14 heads, 2 key/value heads, a 151,936-token vocabulary, tied embeddings:
494M parameters) and random weights: this measures speed only. ortpack's graphs come from its own
steps (the export, then the weight-only quantizer with each pinned recipe and ONNX Runtime's
offline optimization, as the optimize step writes them); the int4 search itself is not run: its
choice depends on the gate, which random weights cannot pass, so every candidate is timed.

Each engine answers a prompt of `--prompt` random token ids with `--new` tokens (end-of-sequence
ignored): time to first token (the prompt's prefill and the first token) and decode tokens/s
after it; at batch 1 and, for decode, 8 sequences at once. ortpack is measured through its
generation loop (kernel/generation/engine.py: the server's code, sampling and detokenizing
included) on a session as the server opens it; PyTorch through `generate` (sdpa attention, 2
threads); GenAI through `og.Generator`. Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORK = ROOT / "build" / "bench-generation"
QWEN2_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
RECIPES = ("int4-b128-a4", "int4-b128-a4-emb", "int4-b32-a4", "int4-b128-a0", "int8-b128-a4")


def make_word_tokenizer(out: Path, vocab: int) -> None:
    """A tokenizer with a word for every id (the shipped texts' words, then `w123`...), so that
    whatever a random model generates decodes to text, as a trained model's tokens do (a small BPE
    vocabulary would leave most of a 152k-token model's ids without text, and a stream without
    events); ids 0-2 are <|endoftext|>, <|im_start|>, <|im_end|>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.causal_lms import training_texts

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    shipped = sorted({word for text in training_texts() for word in text.split()})  # the prompts' words too
    tokens = [*specials, *shipped]
    tokens += [f"w{i}" for i in range(len(tokens), vocab)]
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out)


def make_checkpoint(out: Path) -> Path:
    """Qwen2-0.5B's shape with random weights (a ~2 GB safetensors file) and a word per id."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    make_word_tokenizer(out, QWEN2_05B["vocab_size"])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B, eos_token_id=2, bos_token_id=None)).eval()
    model.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_ortpack(checkpoint: Path, work: Path) -> dict[str, Path]:
    """The export (once) and each variant's graph: fp32 by the optimize step, the weight-only
    recipes pinned; {engine name: model.onnx}."""
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.export import export_model
    from ortpack.components.core.graph_files import save_graph
    from ortpack.components.core.optimize import optimize_model, ort_offline_optimize
    from ortpack.components.core.quantization.weight_only import WeightOnly, quantize_weight_only
    from ortpack.components.core.specs import ExportSpec, VariantSpec

    export_dir = work / "export"
    if not (export_dir / ExportResult.FILE).is_file():
        spec = ExportSpec(
            source=str(checkpoint), task="text-generation", name="qwen2-0.5b", allow_degenerate_reference=True
        )
        export_model(spec, export_dir)
    graphs = {}
    fp32 = work / "ortpack-fp32"
    if not (fp32 / "model.onnx").is_file():
        optimize_model(export_dir, VariantSpec(target="cpu", precision="fp32"), fp32)
    graphs["ortpack-fp32"] = fp32 / "model.onnx"
    for name in RECIPES:
        out = work / f"ortpack-{name}" / "model.onnx"
        if not out.is_file():
            bits, block, level, *embeddings = name.split("-")
            recipe = WeightOnly(
                bits=int(bits[3:]),
                block_size=int(block[1:]),
                accuracy_level=int(level[1:]),
                embeddings=bool(embeddings),
            )
            staged = out.parent / "staged.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            quantize_weight_only(export_dir / "model.onnx", staged, recipe, save_graph)
            ort_offline_optimize(staged, out, "extended", ["CPUExecutionProvider"])
            for leftover in out.parent.glob("staged.onnx*"):
                leftover.unlink()
        graphs[f"ortpack-{name}"] = out
    return graphs


def build_genai(checkpoint: Path, work: Path, precision: str) -> Path | None:
    """ONNX Runtime GenAI's builder on the same checkpoint (None where onnxruntime-genai is missing)."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return None
    out = work / f"genai-{precision}"
    if not (out / "genai_config.json").is_file():
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out)]
        command += ["-p", precision, "-e", "cpu", "-c", str(work / "genai-cache")]
        subprocess.run(command, check=True, capture_output=True, timeout=3600)
    return out


# ---------------------------------------------------------------- one measurement per engine


def prompts(length: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(100, 150000, length).tolist() for _ in range(count)]


def ortpack_runner(model: Path, export_dir: Path) -> Callable[[list[list[int]], int], dict[str, float]]:
    """Sequences through ortpack's generation loop, on a session as the server opens it."""
    from tokenizers import Tokenizer

    from ortpack.components.core.artifacts import ExportResult
    from ortpack.kernel.generation.decoder import Decoder
    from ortpack.kernel.generation.engine import Event, GenerationRequest, Generator
    from ortpack.kernel.generation.sampling import SamplingParams
    from ortpack.kernel.generation.scheduler import Limits
    from ortpack.kernel.runtime import SessionPlan, create_session

    settings: Any = ExportResult.load(export_dir).settings()
    plan = SessionPlan(providers=["CPUExecutionProvider"], online_optimization=True, reason="bench")
    session = create_session(model, plan, intra_op_threads=os.cpu_count() or 1, allow_spinning=True)
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    limits = Limits(capacity=1 << 20, context=settings.tokenizer.max_length, max_running=32)
    generator = Generator(Decoder(session, settings.decoder), tokenizer, settings.generation.eos_token_ids, limits)
    generator.warm_up()
    generator.start()

    def run(batch: list[list[int]], new: int) -> dict[str, float]:
        stamps: list[list[float]] = [[] for _ in batch]
        done = threading.Semaphore(0)

        def sink(i: int) -> Callable[[Event], None]:
            def put(event: Event) -> None:
                stamps[i].extend([time.perf_counter()] * len(event.tokens))
                if event.finish_reason is not None:
                    done.release()

            return put

        started = time.perf_counter()
        for i, prompt in enumerate(batch):
            request = GenerationRequest(
                prompt=prompt, max_tokens=new, sampling=SamplingParams(temperature=0), ignore_eos=True
            )
            generator.submit(request, sink(i))
        for _ in batch:
            done.acquire()
        return _rates(started, stamps)

    return run


def torch_runner(checkpoint: Path) -> Callable[[list[list[int]], int], dict[str, float]]:
    """PyTorch eager `generate` (sdpa attention, one thread per core): the time to one token, and
    to all of them."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def run(batch: list[list[int]], new: int) -> dict[str, float]:
        ids = torch.tensor(batch)
        with torch.inference_mode():
            started = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=[], pad_token_id=0)
            first = time.perf_counter() - started
            started = time.perf_counter()
            model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=[], pad_token_id=0)
            whole = time.perf_counter() - started
        return {"ttft_s": first, "decode_tok_s": len(batch) * (new - 1) / max(whole - first, 1e-9)}

    return run


def genai_runner(model_dir: Path) -> Callable[[list[list[int]], int], dict[str, float]]:
    """ONNX Runtime GenAI's own loop over its builder's graph (greedy)."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))

    def run(batch: list[list[int]], new: int) -> dict[str, float]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(batch[0]) + new, do_sample=False, batch_size=len(batch))
        generator = og.Generator(model, params)
        stamps: list[list[float]] = [[] for _ in batch]
        started = time.perf_counter()
        generator.append_tokens(np.array(batch, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
            now = time.perf_counter()
            for row in stamps:
                row.append(now)
        return _rates(started, [row[:new] for row in stamps])

    return run


def _rates(started: float, stamps: list[list[float]]) -> dict[str, float]:
    """Time to each sequence's first token (the mean) and decode tokens/s after the first tokens
    (every sequence's tokens over the span from the last first token to the last token)."""
    firsts = [row[0] for row in stamps]
    last = max(row[-1] for row in stamps)
    tokens = sum(len(row) - 1 for row in stamps)
    return {"ttft_s": float(np.mean(firsts)) - started, "decode_tok_s": tokens / max(last - max(firsts), 1e-9)}


# ---------------------------------------------------------------- the run


def measure(engines: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Every engine, in alternate rounds: batch 1 (time to first token, decode) and batch 8 (decode)."""
    single, eight = prompts(args.prompt, 1), prompts(args.prompt, 8)
    out: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    for round_ in range(args.rounds):
        order = list(engines)[round_ % len(engines) :] + list(engines)[: round_ % len(engines)]
        for name in order:
            one = engines[name](single, args.new)
            many = engines[name](eight, args.new)
            for key, value in (("ttft_s", one["ttft_s"]), ("decode_b1", one["decode_tok_s"])):
                out[name].setdefault(key, []).append(value)
            out[name].setdefault("decode_b8", []).append(many["decode_tok_s"])
            print(f"round {round_ + 1} {name}: {one} {many}", flush=True)
    return out


def sizes(graphs: dict[str, Path]) -> dict[str, float]:
    """Megabytes of each engine's weights on disk (graph and data files)."""
    return {
        name: sum(
            f.stat().st_size for f in path.parent.iterdir() if f.name.startswith(path.name) or f.suffix == ".data"
        )
        / 1e6
        for name, path in graphs.items()
    }


def report(results: dict[str, dict[str, list[float]]], megabytes: dict[str, float], kv_per_token: int) -> None:
    base = {k: statistics.median(v) for k, v in results.get("ortpack-fp32", {}).items()}
    eager = {k: statistics.median(v) for k, v in results.get("pytorch-eager", {}).items()}
    print(f"\nkey/value cache per token: {kv_per_token / 1024:.1f} KiB (fp32)")
    header = "engine                  weights MB  TTFT ms  decode b1 tok/s  decode b8 tok/s  b1 vs fp32  b1 vs eager"
    print(header)
    print("-" * len(header))
    for name, stats in results.items():
        med = {k: statistics.median(v) for k, v in stats.items()}
        ratio = med["decode_b1"] / base["decode_b1"] if base else float("nan")
        versus = med["decode_b1"] / eager["decode_b1"] if eager else float("nan")
        print(
            f"{name:<22}  {megabytes.get(name, float('nan')):>10.0f}  {med['ttft_s'] * 1000:>7.0f}  "
            f"{med['decode_b1']:>15.1f}  {med['decode_b8']:>15.1f}  {ratio:>9.2f}x  {versus:>10.2f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a causal-LM checkpoint (default: Qwen2-0.5B's shape, random)")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", help="comma-separated engine names to measure (default: all)")
    parser.add_argument("--out", default="bench/results/generation.json")
    args = parser.parse_args()
    from bench.serve_load import measured_on, write_results

    WORK.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint or make_checkpoint(WORK / "qwen2-0.5b")
    graphs = build_ortpack(checkpoint, WORK)
    export_dir = WORK / "export"
    engines: dict[str, Any] = {}
    wanted = set(args.engines.split(",")) if args.engines else None
    for name, path in graphs.items():
        if wanted is None or name in wanted:
            engines[name] = ortpack_runner(path, export_dir)
    for precision in ("int4", "fp32"):
        genai = build_genai(checkpoint, WORK, precision)
        name = f"genai-{precision}"
        if genai is not None and (wanted is None or name in wanted):
            engines[name] = genai_runner(genai)
            graphs[name] = genai / "model.onnx"
    if wanted is None or "pytorch-eager" in wanted:
        engines["pytorch-eager"] = torch_runner(checkpoint)
        graphs["pytorch-eager"] = checkpoint / "model.safetensors"
    results = measure(engines, args)
    settings = json.loads((export_dir / "export.json").read_text())["task_settings"]["decoder"]
    kv = settings["layers"] * 2 * settings["kv_heads"] * settings["head_dim"] * 4
    megabytes = sizes(graphs)
    report(results, megabytes, kv)
    write_results(
        args.out,
        {
            **measured_on(),
            "checkpoint": "Qwen2-0.5B shape, random weights" if args.checkpoint is None else str(args.checkpoint),
            "prompt_tokens": args.prompt,
            "new_tokens": args.new,
            "rounds": args.rounds,
            "kv_bytes_per_token": kv,
            "weights_mb": megabytes,
            "results": results,
            "medians": {n: {k: statistics.median(v) for k, v in s.items()} for n, s in results.items()},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
