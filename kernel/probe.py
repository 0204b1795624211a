"""The probe set: a few validation inputs with their PyTorch reference outputs, carried in every
bundle (`probe/probe.npz`) and replayed through a variant on the node that will serve it.

A quantized graph's numbers depend on the CPU that runs it (kernel/hardware.py), and an
optimized graph's on the ONNX Runtime build and execution provider: a gate passed on the build
machine proves nothing about another. So before a server turns ready it runs the probe through
the variant it is about to serve, the way it serves (the bundle's tokenizer, the server's image
decoder, its backend at batch 1), and applies that variant's own thresholds. The validate step
runs the same code on the build machine and records the result in the manifest, so a probe miss
on a node means this node computes differently, not that the probe is too small.

Text probes hold the sentences; image probes hold encoded JPEG/PNG files (the decoder is part of
the checked path). numpy only, plus what the backend needs.
"""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpack.kernel.gates import GateTable, gate

PROBE_FILE = "probe/probe.npz"


@dataclass(frozen=True, kw_only=True)
class Probe:
    """Inputs (texts, (query, document) pairs, or encoded image files) and the reference output
    row of each."""

    task: str
    inputs: list[Any]
    outputs: np.ndarray

    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {"task": np.array(self.task), "outputs": self.outputs.astype(np.float32)}
        if self.inputs and isinstance(self.inputs[0], bytes):
            sizes = np.array([len(b) for b in self.inputs], dtype=np.int64)
            arrays["offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            arrays["data"] = np.frombuffer(b"".join(self.inputs), dtype=np.uint8)
        elif self.inputs and isinstance(self.inputs[0], tuple):  # (query, document) pairs
            arrays["texts"] = np.array([str(a) for a, _ in self.inputs])
            arrays["texts_pair"] = np.array([str(b) for _, b in self.inputs])
        else:
            arrays["texts"] = np.array([str(t) for t in self.inputs])
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Probe:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            task = str(npz["task"])
            outputs = npz["outputs"].astype(np.float32)
            if "texts_pair" in npz:
                inputs: list[Any] = [(str(a), str(b)) for a, b in zip(npz["texts"], npz["texts_pair"], strict=True)]
            elif "texts" in npz:
                inputs = [str(t) for t in npz["texts"]]
            else:
                offsets, blob = npz["offsets"], npz["data"].tobytes()
                inputs = [blob[int(a) : int(b)] for a, b in itertools.pairwise(offsets)]
        if len(inputs) != len(outputs):
            raise ValueError(f"probe has {len(inputs)} inputs but {len(outputs)} reference outputs")
        return cls(task=task, inputs=inputs, outputs=outputs)


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


def run_probe(
    probe: Probe,
    prepare: Callable[[Sequence[Any]], list[Any]],
    run: Callable[[Sequence[Any]], np.ndarray],
    threads: int = 1,
) -> np.ndarray:
    """The variant's output rows for the probe: `prepare` turns inputs into payloads the way the
    server does (tokenize, decode), `run` is the backend's batch call, used at batch 1, from
    `threads` threads at once (the server's workers: each row is what one call alone gives)."""
    payloads = prepare(probe.inputs)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ortpack-probe") as pool:
        rows = list(pool.map(lambda payload: np.asarray(run([payload])), payloads))
    return np.concatenate(rows).astype(np.float32)


def check_probe(
    probe: Probe,
    prepare: Callable[[Sequence[Any]], list[Any]],
    run: Callable[[Sequence[Any]], np.ndarray],
    thresholds: Mapping[str, float | None],
    metrics: Callable[[np.ndarray, np.ndarray, Sequence[Any]], dict[str, float]],
    *,
    gates: GateTable,
    variant_id: str,
    provider: str,
    hardware: dict[str, Any] | None = None,
    threads: int = 1,
) -> ProbeResult:
    """Run the probe and gate its numbers (`metrics`: the task's comparison of reference and
    candidate rows) with the variant's thresholds (`gates`: its task's table), those it can
    measure: the preprocessing pixel check needs the build's graphs and is not repeated here.
    `threads`: see `run_probe`."""
    started = time.perf_counter()
    try:
        outputs = run_probe(probe, prepare, run, threads)
    except Exception as exc:  # noqa: BLE001 - a variant that cannot run here misses, with the reason
        return ProbeResult(
            variant_id=variant_id,
            values={},
            misses=[f"cannot run the probe: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"],
            samples=len(probe.inputs),
            seconds=time.perf_counter() - started,
            provider=provider,
            hardware=hardware or {},
        )
    misses: list[str] = []
    nonfinite = int((~np.isfinite(outputs)).any(axis=1).sum())
    if nonfinite:
        misses.append(f"{nonfinite} outputs contain NaN or inf")
        outputs = np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0)
    values = metrics(probe.outputs, outputs, probe.inputs)
    misses += gate(values, thresholds, gates)
    return ProbeResult(
        variant_id=variant_id,
        values=values,
        misses=misses,
        samples=len(probe.inputs),
        seconds=time.perf_counter() - started,
        provider=provider,
        hardware=hardware or {},
    )
