"""Which variant of a bundle a server loads: `--variant auto`'s order over the variants on this
machine (the targets in `ortpack.kernel.targets.TRY_ORDER` whose provider onnxruntime has; within a
target, fastest first by the bundle's own benchmark when it was measured on this kind of CPU, else
by the target's `preference`). The server (serving/service.py) tries the candidates in this order;
the build report (components/core/report.py) applies the same ranking to say what a server would
serve. Torch- and onnxruntime-free."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ortpack.kernel.bundle import BundleError, Manifest, Variant
from ortpack.kernel.hardware import HardwareInfo, this_machine
from ortpack.kernel.targets import TARGETS, TRY_ORDER

# For `--variant auto` without benchmark numbers from this kind of CPU: per target, the precisions
# to prefer, best first (fp32 last: the most faithful, the fallback when a variant misses here).
PREFERENCE = {name: t.preference for name, t in TARGETS.items()}
TARGET_PROVIDER = {name: t.provider for name, t in TARGETS.items()}


def measured_p50(variant: Variant, hardware: HardwareInfo) -> float | None:
    """The bundle's first benchmark shape, if it was measured on a CPU with no feature this one
    lacks (a VNNI machine's int8 numbers say nothing about an AVX2-only one)."""
    bench = variant.benchmark
    first = next(iter(bench.shapes.values()), None)
    if first is None or bench.hardware is None:
        return None
    if bench.hardware.machine != hardware.machine or not hardware.has_features(bench.hardware.features):
        return None
    return float(first["p50_ms"])


def _ranking(
    candidates: list[Variant], preference: tuple[str, ...], hardware: HardwareInfo
) -> Callable[[Variant], tuple[float, str]]:
    """Sort key: by measured p50 when every candidate was measured on this kind of CPU, else by
    precision preference (fp32 last)."""
    measured = {v.id: p50 for v in candidates if (p50 := measured_p50(v, hardware)) is not None}
    by_speed = len(measured) == len(candidates)

    def key(v: Variant) -> tuple[float, str]:
        if by_speed:
            return (measured[v.id], v.id)
        return (float(preference.index(v.precision) if v.precision in preference else 99), v.id)

    return key


def inexact_here(variant: Variant, hardware: HardwareInfo) -> bool:
    """An int8 variant with 8-bit weights on a CPU whose u8 x s8 kernels saturate (AVX2 without
    VNNI): its numbers were proven where products sum exactly and would differ here."""
    int8 = variant.optimize.int8
    return variant.target == "cpu" and int8 is not None and int8.needs_exact_int8_dot and not hardware.exact_int8_dot


def rank_variants(
    variants: Sequence[Variant], available_providers: Sequence[str], hardware: HardwareInfo
) -> list[Variant]:
    """`auto`'s order over these variants on this machine (see `candidate_variants`); int8
    variants that would not compute their proven numbers here (`inexact_here`) are left out."""
    ordered: list[Variant] = []
    for target in TRY_ORDER:
        if TARGET_PROVIDER[target] not in available_providers:
            continue
        candidates = [v for v in variants if v.target == target and not inexact_here(v, hardware)]
        ordered += sorted(candidates, key=_ranking(candidates, PREFERENCE[target], hardware))
    return ordered


def candidate_variants(
    manifest: Manifest, requested: str, available_providers: Sequence[str], hardware: HardwareInfo
) -> list[Variant]:
    """The variants to try, in order: the one asked for, or for `auto`, the variants of the first
    target whose execution provider this onnxruntime has (cuda before cpu), fastest first by the
    bundle's own benchmark when it was measured on this kind of CPU (int8 is not always faster: a
    static-int8 MobileNetV3 ran slower than fp32), else by `PREFERENCE` (fp32 last); then the
    other targets."""
    if requested != "auto":
        return [manifest.variant(requested)]
    ordered = rank_variants(manifest.variants, available_providers, hardware)
    if not ordered:
        raise BundleError(
            f"no variant of {manifest.name} runs on this machine (providers {list(available_providers)}; "
            f"variants {[v.id for v in manifest.variants]})"
        )
    return ordered


def choose_variant(
    manifest: Manifest, requested: str, available_providers: Sequence[str], hardware: HardwareInfo | None = None
) -> Variant:
    """The first candidate (see `candidate_variants`), before any probe check."""
    return candidate_variants(manifest, requested, available_providers, hardware or this_machine())[0]
