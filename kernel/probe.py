"""The probe set: a few validation inputs with their PyTorch reference outputs, carried in every
bundle (`probe/probe.npz`) and replayed through a variant on the node that will serve it.

A quantized graph's numbers depend on the CPU that runs it (kernel/hardware.py), and an
optimized graph's on the ONNX Runtime build and execution provider: a gate passed on the build
machine proves nothing about another. So before a server turns ready it runs the probe through
the variant it is about to serve, the way it serves (the bundle's tokenizer, the server's image
decoder, its engine at batch 1), and applies that variant's own thresholds. The validate step
runs the same code on the build machine and records the result in the manifest, so a probe miss
on a node means this node computes differently, not that the probe is too small.

Text probes hold the sentences; image probes hold encoded JPEG/PNG files (the decoder is part of
the checked path); generation probes hold token sequences, each a prompt and PyTorch's greedy
continuation of it. numpy only, plus what the engine needs.
"""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ortpack.kernel.engine import Engine, Item, ProbeMetrics
from ortpack.kernel.errors import one_line
from ortpack.kernel.gates import GateTable, gate

PROBE_FILE = "probe/probe.npz"
FORMAT = 2  # outputs by name, per item (1: one unnamed output row per input, read as the task's first output)
Kind = Literal["texts", "pairs", "files", "sequences"]


@dataclass(frozen=True, kw_only=True)
class Probe:
    """Inputs (`kind`: texts, (query, document) pairs, encoded image files, or (prompt ids,
    continuation ids) sequences as int64 arrays) and PyTorch's
    outputs for each, by the task's declared output names: one row of each per-item output, and
    the item's own rows (perhaps none) of each output named in `varying` (a detector's boxes)."""

    task: str
    kind: Kind
    inputs: list[Any]
    outputs: list[Item]
    varying: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"probe has {len(self.inputs)} inputs but {len(self.outputs)} reference outputs")

    def to_bytes(self) -> bytes:
        """npz: the inputs by kind, and per output name its items' rows end to end (`out.<name>`)
        with each item's end (`end.<name>`)."""
        arrays: dict[str, np.ndarray] = {"task": np.array(self.task), "format": np.array(FORMAT)}
        arrays["kind"] = np.array(self.kind)
        arrays["varying"] = np.array(list(self.varying), dtype=str)
        if self.kind == "files":
            sizes = np.array([len(b) for b in self.inputs], dtype=np.int64)
            arrays["offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            arrays["data"] = np.frombuffer(b"".join(self.inputs), dtype=np.uint8)
        elif self.kind == "sequences":
            for part, name in ((0, "prompt"), (1, "continuation")):
                rows = [np.asarray(seq[part], dtype=np.int64) for seq in self.inputs]
                arrays[f"{name}_ids"] = np.concatenate(rows) if rows else np.zeros(0, np.int64)
                arrays[f"{name}_ends"] = np.cumsum([len(r) for r in rows]).astype(np.int64)
        elif self.kind == "pairs":
            arrays["texts"] = np.array([str(a) for a, _ in self.inputs])
            arrays["texts_pair"] = np.array([str(b) for _, b in self.inputs])
        else:
            arrays["texts"] = np.array([str(t) for t in self.inputs])
        for name in self.outputs[0] if self.outputs else {}:
            rows = [
                np.asarray(item[name]) if name in self.varying else np.asarray(item[name])[None]
                for item in self.outputs
            ]
            arrays[f"out.{name}"] = np.concatenate(rows)
            arrays[f"end.{name}"] = np.cumsum([len(r) for r in rows]).astype(np.int64)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, names: Sequence[str] = ()) -> Probe:
        """`names`: the task's output names, for a format-1 probe (its one unnamed output is the first)."""
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            task = str(npz["task"])
            kind: Kind
            if "texts_pair" in npz:
                kind = "pairs"
                inputs: list[Any] = [(str(a), str(b)) for a, b in zip(npz["texts"], npz["texts_pair"], strict=True)]
            elif "texts" in npz:
                kind, inputs = "texts", [str(t) for t in npz["texts"]]
            elif "prompt_ids" in npz:
                kind = "sequences"
                parts = [np.split(npz[f"{name}_ids"], npz[f"{name}_ends"][:-1]) for name in ("prompt", "continuation")]
                inputs = list(zip(*parts, strict=True)) if len(npz["prompt_ends"]) else []
            else:
                kind = "files"
                offsets, blob = npz["offsets"], npz["data"].tobytes()
                inputs = [blob[int(a) : int(b)] for a, b in itertools.pairwise(offsets)]
            if "format" not in npz:  # format 1: one unnamed output, a row per input
                rows = npz["outputs"].astype(np.float32)
                if len(inputs) != len(rows):
                    raise ValueError(f"probe has {len(inputs)} inputs but {len(rows)} reference outputs")
                name = names[0] if names else "output"
                return cls(task=task, kind=kind, inputs=inputs, outputs=[{name: row} for row in rows])
            varying = tuple(str(v) for v in npz["varying"])
            outputs: list[Item] = [{} for _ in inputs]
            for key in npz.files:
                if not key.startswith("out."):
                    continue
                name = key[4:]
                values, ends = npz[key], npz[f"end.{name}"]
                if len(ends) != len(inputs):
                    raise ValueError(f"probe has {len(inputs)} inputs but {len(ends)} reference outputs")
                for item, start, end in zip(outputs, [0, *ends[:-1]], ends, strict=True):
                    item[name] = values[start:end] if name in varying else values[start]
        return cls(task=task, kind=kind, inputs=inputs, outputs=outputs, varying=varying)


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """One variant's probe check on one machine."""

    variant_id: str
    values: dict[str, float]
    misses: list[str]
    samples: int
    seconds: float
    provider: str  # the execution provider that actually ran
    hardware: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.misses

    def summary(self) -> str:
        return "passed" if self.passed else "; ".join(self.misses)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "values": self.values,
            "misses": self.misses,
            "samples": self.samples,
            "seconds": round(self.seconds, 4),
            "provider": self.provider,
            "hardware": self.hardware,
        }


def run_probe(probe: Probe, engine: Engine, threads: int = 1, payloads: Sequence[Any] | None = None) -> list[Item]:
    """The variant's outputs for the probe: the engine turns inputs into payloads the way a server
    does (tokenize, decode) and runs each at batch 1, from `threads` threads at once (a server's
    workers: each item is what one call alone gives). `payloads`: the inputs already turned into
    this engine's payloads (a server does it while the session opens)."""
    if payloads is None:
        payloads = engine.probe_payloads(probe.inputs)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ortpack-probe") as pool:
        return [items[0] for items in pool.map(lambda payload: engine.run([payload]), payloads)]


def check_probe(
    probe: Probe,
    engine: Engine,
    thresholds: Mapping[str, float | None],
    metrics: ProbeMetrics,
    *,
    gates: GateTable,
    variant_id: str,
    provider: str,
    hardware: dict[str, Any] | None = None,
    threads: int = 1,
    payloads: Sequence[Any] | None = None,
) -> ProbeResult:
    """Run the probe through the engine and gate its numbers (`metrics`: the task's comparison of
    PyTorch's items and the variant's) with the variant's thresholds (`gates`: its task's table),
    those it can measure: the preprocessing pixel check needs the build's graphs and is not
    repeated here. `threads`, `payloads`: see `run_probe`."""
    started = time.perf_counter()

    def result(values: dict[str, float], misses: list[str]) -> ProbeResult:
        return ProbeResult(
            variant_id=variant_id,
            values=values,
            misses=misses,
            samples=len(probe.inputs),
            seconds=time.perf_counter() - started,
            provider=provider,
            hardware=hardware or {},
        )

    try:
        outputs = run_probe(probe, engine, threads, payloads)
    except Exception as exc:  # noqa: BLE001 - a variant that cannot run here misses, with the reason
        return result({}, [f"cannot run the probe: {type(exc).__name__}: {one_line(exc, 200)}"])
    misses: list[str] = []
    nonfinite = sum(not all(np.isfinite(a).all() for a in item.values() if a.dtype.kind == "f") for item in outputs)
    if nonfinite:
        misses.append(f"{nonfinite} outputs contain NaN or inf")
        outputs = [{k: np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0) for k, a in item.items()} for item in outputs]
    values = metrics(probe.outputs, outputs, probe.inputs)
    return result(values, misses + gate(values, thresholds, gates))
