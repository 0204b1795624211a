"""The verdict: the variant a server on the build's machine picks (the server's own ranking,
`ortpack.kernel.selection.rank_variants`), on machines like it and unlike it, the alternatives and
why not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ortpack.components.core.artifacts import VariantRecord
from ortpack.components.core.package import variant_record
from ortpack.components.core.report.numbers import (
    BASELINE_FEATURES,
    CPU_PROVIDER,
    accuracy_cost,
    format_ms,
    format_ratio,
    miss_reason,
    shape_label,
)
from ortpack.kernel.bundle import Variant
from ortpack.kernel.hardware import HardwareInfo
from ortpack.kernel.selection import PREFERENCE, TARGET_PROVIDER, inexact_here, measured_p50, rank_variants
from ortpack.kernel.targets import TARGETS

if TYPE_CHECKING:
    from ortpack.kernel.bundle import Variant


# ---------------------------------------------------------------------------- the serving choice


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """A variant the server does not pick first, and why."""

    record: VariantRecord
    reason: str


@dataclass(frozen=True, kw_only=True)
class ServingChoice:
    """What `--variant auto` serves on one kind of machine, why, and why not each other variant."""

    where: str
    chosen: VariantRecord | None
    why: str
    alternatives: tuple[Alternative, ...]


def hardware_of(recorded: dict[str, Any]) -> HardwareInfo:
    fields = {k: v for k, v in recorded.items() if k != "int8_kernel"}
    return HardwareInfo(**fields | {"features": tuple(recorded["features"])})


def _as_variants(records: Sequence[VariantRecord]) -> list[Variant]:
    """The manifest entries the package step writes for these (passed) variants."""

    return [Variant.model_validate(variant_record(r.built, r.parity, r.benchmark)) for r in records]


def _ranked_by_speed(candidates: Sequence[Variant], hardware: HardwareInfo) -> bool:
    """True when the server ranks these by their benchmark: each was measured on this kind of CPU."""
    return all(measured_p50(v, hardware) is not None for v in candidates)


def p50(rec: VariantRecord, shape: str) -> str:
    return format_ms(rec.benchmark.shapes[shape]["p50_ms"]) if rec.benchmark and shape in rec.benchmark.shapes else "-"


def _speed(rec: VariantRecord, shape: str) -> str:
    """`3.35 ms at batch 1 × 16 tokens, 7.1× PyTorch`."""
    ratio = rec.benchmark.speedup_vs_torch.get(shape) if rec.benchmark else None
    return f"{p50(rec, shape)} at {shape_label(shape)}" + (f", {format_ratio(ratio)} PyTorch" if ratio else "")


@dataclass(frozen=True, kw_only=True)
class _Ranking:
    """The server's order over the passed variants on one machine, and what it ranked them by."""

    order: list[Variant]
    chosen: VariantRecord | None
    by_speed: bool  # by this build's benchmark (measured on this kind of CPU), else by preference
    shape: str  # the benchmark shape the server compares: the first
    hardware: HardwareInfo  # the machine it ranks for

    @property
    def preference(self) -> str:
        return ", then ".join(PREFERENCE[self.order[0].target]) if self.order else ""

    def why(self) -> str:
        if self.chosen is None:
            return "no variant that passed its gate runs here"
        target = self.chosen.built.target
        speed = _speed(self.chosen, self.shape) if self.by_speed and self.shape else ""
        if sum(v.target == target for v in self.order) == 1:
            return f"the only {target} variant that passed its gate" + (f" ({speed})" if speed else "")
        if self.by_speed:
            return f"the fastest here by this build's benchmark: {speed}"
        return f"first in the server's preference order ({self.preference}): no benchmark from this kind of CPU"

    def why_not(self, rec: VariantRecord) -> str:
        if not rec.passed:
            hint = (rec.built.metrics.get("int8") or {}).get("hint")
            return miss_reason(rec.parity) + (f"; {hint}" if hint else "")
        place = next((i for i, v in enumerate(self.order) if v.id == rec.variant_id), None)
        if inexact_here(_as_variants([rec])[0], self.hardware):
            return (
                "not on this CPU: its 8-bit int8 weights were proven where u8 x s8 products sum exactly "
                "(VNNI, AMX); this CPU's int8 kernels saturate"
            )
        if place is None or self.chosen is None:
            return f"not for this hardware: needs {TARGET_PROVIDER.get(rec.built.target, rec.built.target)} (none here)"
        first = self.chosen
        if rec.built.target != first.built.target:
            return f"fallback #{place}: a {rec.built.target} variant, tried after the {first.built.target} ones"
        if self.by_speed:
            return (
                f"slower here: {p50(rec, self.shape)} against {p50(first, self.shape)} at "
                f"{shape_label(self.shape)}; fallback #{place} if {first.variant_id} misses its probe check on the node"
            )
        return f"later in the preference order ({self.preference}); fallback #{place}"


def _rank(records: Sequence[VariantRecord], providers: Sequence[str], hardware: HardwareInfo) -> _Ranking:
    order = rank_variants(_as_variants([r for r in records if r.passed]), providers, hardware)
    if not order:
        return _Ranking(order=[], chosen=None, by_speed=False, shape="", hardware=hardware)
    first = order[0]
    return _Ranking(
        order=order,
        chosen=next(r for r in records if r.variant_id == first.id),
        by_speed=_ranked_by_speed([v for v in order if v.target == first.target], hardware),
        shape=next(iter(first.benchmark.shapes), ""),
        hardware=hardware,
    )


def serving_choice(
    records: Sequence[VariantRecord], providers: Sequence[str], hardware: HardwareInfo, where: str
) -> ServingChoice:
    """Apply the server's ranking (`ortpack.kernel.selection.rank_variants`) to this build's variants on a
    machine with `providers` and `hardware`, and say why each other variant comes later or never."""
    ranking = _rank(records, providers, hardware)
    alternatives = tuple(Alternative(record=r, reason=ranking.why_not(r)) for r in records if r is not ranking.chosen)
    return ServingChoice(where=where, chosen=ranking.chosen, why=ranking.why(), alternatives=alternatives)


def build_machine(records: Sequence[VariantRecord]) -> tuple[list[str], HardwareInfo | None]:
    """The providers and CPU this build's gates ran with: a server here has the same."""
    providers = sorted({CPU_PROVIDER, *(r.parity.validated_on for r in records)})
    recorded = next((r.parity.hardware for r in records if r.parity.hardware), None)
    return providers, hardware_of(recorded) if recorded else None


def choice_here(records: Sequence[VariantRecord]) -> ServingChoice:
    """What a server on this build's machine serves."""
    providers, here = build_machine(records)
    if here is None:
        unknown = HardwareInfo(machine="", cpu_model="unknown", features=(), cores=1)
        return serving_choice(records, providers, unknown, "this build's machine")
    return serving_choice(records, providers, here, f"this build's machine, {here.summary()}")


def choices_elsewhere(records: Sequence[VariantRecord]) -> list[ServingChoice]:
    """The same ranking on the other machines this build's variants may meet: a GPU node (when a
    cuda variant passed and this machine has no CUDA provider), a CPU with fewer ISA features."""
    providers, here = build_machine(records)
    out = []
    cuda = TARGETS["cuda"]
    if cuda.provider not in providers and any(r.passed and r.built.target == cuda.name for r in records):
        gpu = list(cuda.execution_providers)
        out.append(
            serving_choice(
                records, gpu, here or HardwareInfo(machine="", cpu_model="", features=(), cores=1), "a GPU node"
            )
        )
    if here is not None and not set(here.features) <= set(BASELINE_FEATURES):
        baseline = HardwareInfo(machine=here.machine, cpu_model="", features=BASELINE_FEATURES, cores=here.cores)
        out.append(serving_choice(records, [CPU_PROVIDER], baseline, "a CPU with fewer ISA features (AVX2 only)"))
    return out


def verdict(records: Sequence[VariantRecord]) -> list[str]:
    """The verdict as text lines: what a server here serves and why, why not each other variant,
    and what other machines serve."""
    if not any(r.passed for r in records):
        return ["No variant passed its gate: nothing ships."]
    here = choice_here(records)
    chosen = here.chosen.variant_id if here.chosen else "nothing"
    lines = [f"Verdict: on {here.where}, --variant auto serves {chosen}: {here.why}."]
    if here.chosen:
        lines.append(f"  against PyTorch: {accuracy_cost(here.chosen)}.")
    lines += [f"  not {a.record.variant_id}: {a.reason}." for a in here.alternatives]
    for other in choices_elsewhere(records):
        lines.append(f"  on {other.where}: {other.chosen.variant_id if other.chosen else 'nothing'} ({other.why}).")
    return lines
