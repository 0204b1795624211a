"""What hardware this process runs on, in the terms that change ONNX Runtime's numerics and speed.

ONNX Runtime picks its int8 kernels by instruction set: with AVX-512 VNNI (or AVX-VNNI, AMX) the
u8 x s8 products are summed exactly in int32; with only AVX2 or AVX-512 without VNNI, pairs of
products are first added in saturating int16 (`vpmaddubsw`), so a quantized graph can give other
numbers on another CPU. A parity result or a benchmark is therefore recorded with the CPU it was
measured on (`HardwareInfo`), and compared by feature set before it is trusted elsewhere.

Reads /proc/cpuinfo (Linux); elsewhere the features are unknown (an empty set) and the model
name comes from `platform`. Nothing is read at import time.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

# The CPU flags that select ONNX Runtime's (MLAS) kernels: x86-64, then ARM64.
ISA_FEATURES = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "i8mm",
    "sve",
)
# Features with an exact int32 u8 x s8 dot product: int8 numerics do not depend on saturation.
_EXACT_INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp")


@dataclass(frozen=True, kw_only=True)
class HardwareInfo:
    """One machine as ONNX Runtime sees it: CPU model, the ISA features that matter, cores."""

    machine: str  # x86_64, aarch64, ...
    cpu_model: str
    features: tuple[str, ...]  # the subset of ISA_FEATURES this CPU has, in ISA_FEATURES order
    cores: int  # CPUs this process may run on (affinity), what ORT's thread pool sizes itself by

    @property
    def int8_kernel(self) -> str:
        """The family of int8 GEMM kernel ONNX Runtime will pick here (coarse, for humans and for
        comparing machines): amx, avx512_vnni, avx_vnni, avx512, avx2, neon_dot, or generic."""
        has = set(self.features)
        for feature, name in (
            ("amx_int8", "amx"),
            ("avx512_vnni", "avx512_vnni"),
            ("avx_vnni", "avx_vnni"),
            ("avx512bw", "avx512"),
            ("avx2", "avx2"),
            ("asimddp", "neon_dot"),
        ):
            if feature in has:
                return name
        return "generic"

    @property
    def exact_int8_dot(self) -> bool:
        """True when u8 x s8 products are summed exactly (no int16 saturation) on this CPU."""
        return any(f in self.features for f in _EXACT_INT8_DOT)

    def has_features(self, required: list[str] | tuple[str, ...]) -> bool:
        return set(required) <= set(self.features)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["features"] = list(self.features)
        out["int8_kernel"] = self.int8_kernel
        return out

    def summary(self) -> str:
        """`Intel Xeon ... (x86_64, avx512_vnni int8 kernels, 2 cores)`."""
        return f"{self.cpu_model} ({self.machine}, {self.int8_kernel} int8 kernels, {self.cores} cores)"


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, ISA features) from /proc/cpuinfo text: `flags` on x86, `Features` on ARM."""
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, tuple(f for f in ISA_FEATURES if f in flags)


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def describe(cpuinfo_text: str | None = None) -> HardwareInfo:
    """This machine, or the one whose /proc/cpuinfo text is given (tests)."""
    if cpuinfo_text is None:
        return this_machine()
    model, features = parse_cpuinfo(cpuinfo_text)
    return HardwareInfo(machine=platform.machine(), cpu_model=model or "unknown", features=features, cores=_cores())


@cache
def this_machine() -> HardwareInfo:
    path = Path("/proc/cpuinfo")
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    model, features = parse_cpuinfo(text)
    return HardwareInfo(
        machine=platform.machine(),
        cpu_model=model or platform.processor() or "unknown",
        features=features,
        cores=_cores(),
    )
