"""Frozen specs: what to export, which variants to build, and the parity thresholds.

Each spec checks its own values in `__post_init__`, the task's options against the task's
contract (kernel/contracts/<task>.py). What only the task family knows (its default gates, its
int8 recipes) is checked by `ortpack.components.core.tasks.check_build_spec`, which `build_bundle` and
the command line run before any heavy work: this module does not import the families. Nothing
here imports torch or onnxruntime.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from ortpack.components.core.errors import InvalidSpecError, and_list, did_you_mean
from ortpack.kernel.contracts import TaskOptions, UnknownTaskError, contract_names, get_contract
from ortpack.kernel.gates import GateTable, gate
from ortpack.kernel.targets import PRECISIONS, TARGETS, Target  # the target table; importable from here too


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise InvalidSpecError(
            f"unknown target {name!r} (known: {', '.join(TARGETS)}){did_you_mean(name, TARGETS)}"
        ) from None


def unknown_precision(name: str) -> str:
    return f"unknown precision {name!r} (known: {', '.join(PRECISIONS)}){did_you_mean(name, PRECISIONS)}"


@dataclass(frozen=True, kw_only=True)
class VariantSpec:
    """One target x precision to build, e.g. cpu/int8 (id `cpu-int8`)."""

    target: str
    precision: str

    def __post_init__(self) -> None:
        preset = get_target(self.target)
        if self.precision not in PRECISIONS:
            raise InvalidSpecError(unknown_precision(self.precision))
        if self.precision not in preset.precisions:
            raise InvalidSpecError(
                f"precision {self.precision!r} is not supported on target {self.target!r} "
                f"(supported: {', '.join(preset.precisions)})"
            )

    @property
    def id(self) -> str:
        return f"{self.target}-{self.precision}"


def variant_grid(targets: list[str], precisions: list[str]) -> list[VariantSpec]:
    """Every supported target x precision pair; a precision no target supports is an error."""
    if not targets:
        raise InvalidSpecError("no targets given")
    if not precisions:
        raise InvalidSpecError("no precisions given")
    for name in targets:
        get_target(name)
    for p in precisions:
        if p not in PRECISIONS:
            raise InvalidSpecError(unknown_precision(p))
    variants = [
        VariantSpec(target=t, precision=p)
        for t in dict.fromkeys(targets)
        for p in dict.fromkeys(precisions)
        if p in TARGETS[t].precisions
    ]
    unused = [p for p in precisions if all(v.precision != p for v in variants)]
    if unused:
        raise InvalidSpecError(
            f"precision {unused[0]!r} is not supported by any of the targets {targets} ("
            + "; ".join(f"{t}: {', '.join(TARGETS[t].precisions)}" for t in targets)
            + ")"
        )
    return variants


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
T = TypeVar("T", bound=TaskOptions)


def task_options(task: str, given: Mapping[str, Any] | TaskOptions) -> TaskOptions:
    """The task's typed options (its contract's model, kernel/contracts/<task>.py) from `given`;
    an unknown task, an option the task does not read or a bad value is one InvalidSpecError."""
    try:
        kind = get_contract(task).options
    except UnknownTaskError:
        raise InvalidSpecError(f"{unknown_task(task)}") from None
    if isinstance(given, kind):
        return given
    if isinstance(given, TaskOptions):
        given = given.given()
    foreign = [key for key in given if key not in kind.model_fields]
    if foreign:
        flags = and_list(["--" + key.replace("_", "-") for key in foreign])
        verb = "does" if len(foreign) == 1 else "do"
        raise InvalidSpecError(f"{flags} {verb} not apply to task {task!r}")
    try:
        return kind.model_validate(dict(given))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidSpecError(f"{where}: {err['msg']} (got {err.get('input')!r})") from None


def unknown_task(task: str) -> str:
    names = contract_names()
    return f"unknown task {task!r} (known: {', '.join(names)}){did_you_mean(task, names)}"


@dataclass(frozen=True, kw_only=True)
class ExportSpec:
    """What to export: a model source for a task, and the task's own options.

    `source` is a Hugging Face checkpoint directory for the text tasks, or for
    `image-classification` a torchvision model name, `PACKAGE.MODULE:FACTORY` or a `.pt2` file.
    `options` are the task's (`task_options`): a mapping is checked and typed here, so an option
    the task does not read, or a bad value, fails at construction.
    """

    source: str
    task: str
    name: str
    options: Mapping[str, Any] | TaskOptions = field(default_factory=dict)
    opset: int = 17
    seed: int = 0
    # Build even when the PyTorch reference barely varies (random weights): parity is then vacuous.
    allow_degenerate_reference: bool = False

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidSpecError(f"invalid bundle name {self.name!r}: use letters, digits, '.', '_' and '-'")
        if not 13 <= self.opset <= 23:
            raise InvalidSpecError(f"opset must be in 13..23, got {self.opset}")
        object.__setattr__(self, "options", task_options(self.task, self.options))

    def options_as(self, kind: type[T]) -> T:
        """The options as the task's own type (its exporter knows which)."""
        if not isinstance(self.options, kind):
            raise TypeError(
                f"the options of a {self.task} export are {type(self.options).__name__}, not {kind.__name__}"
            )
        return self.options


@dataclass(frozen=True)
class ParityThresholds:
    """The gate one variant must pass: a limit for some of its task's thresholds (`gates`, the
    task's table: kernel/contracts/<task>.py); a threshold without a limit is not gated (its
    metric is still logged). Each task family gives its defaults per precision
    (components/core/tasks/)."""

    gates: GateTable
    limits: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, gates: GateTable, **limits: float) -> ParityThresholds:
        return cls(gates, limits)

    def __post_init__(self) -> None:
        for name, value in self.limits.items():
            if name not in self.gates:
                raise InvalidSpecError(unknown_threshold(name, self.gates))
            if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
                raise InvalidSpecError(f"threshold {name} must be a number, got {value!r}")
            if self.gates[name].op == ">=":  # agreement and cosine floors live in [-1, 1]
                if not -1.0 <= value <= 1.0:
                    raise InvalidSpecError(f"threshold {name} must be in [-1, 1], got {value}")
            elif value < 0:
                raise InvalidSpecError(f"threshold {name} must be >= 0, got {value}")

    def as_dict(self) -> dict[str, float]:
        return dict(self.limits)

    def updated(self, **overrides: float | None) -> ParityThresholds:
        """These limits with `overrides` applied (None: the threshold is no longer gated)."""
        for key in overrides:
            if key not in self.gates:
                raise InvalidSpecError(unknown_threshold(key, self.gates))
        limits = {**self.limits, **overrides}
        return ParityThresholds(self.gates, {k: v for k, v in limits.items() if v is not None})

    def misses(self, values: Mapping[str, float]) -> list[str]:
        """Every limit `values` miss (ortpack.kernel.gates.gate)."""
        return gate(values, self.limits, self.gates)


def unknown_threshold(name: str, gates: GateTable) -> str:
    return f"unknown threshold {name!r} (known: {', '.join(sorted(gates))}){did_you_mean(name, gates)}"


def parse_threshold_overrides(items: list[str]) -> dict[str, dict[str, float]]:
    """Parse `PRECISION.NAME=VALUE` (or `NAME=VALUE` for every precision) options.

    Returns `{precision or "*": {name: value}}`; values are checked when applied.
    """
    out: dict[str, dict[str, float]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise InvalidSpecError(f"threshold override {item!r} must look like int8.min_cosine=0.95")
        precision, dot, name = key.strip().rpartition(".")
        precision = precision if dot else "*"
        if precision != "*" and precision not in PRECISIONS:
            raise InvalidSpecError(
                f"unknown precision {precision!r} in threshold override {item!r}{did_you_mean(precision, PRECISIONS)}"
            )
        try:
            value = float(raw)
        except ValueError:
            raise InvalidSpecError(f"threshold override {item!r}: {raw!r} is not a number") from None
        out.setdefault(precision, {})[name] = value
    return out


@dataclass(frozen=True, kw_only=True)
class BuildSpec:
    """A whole build: one export, a grid of variants, their gates, and where the bundle goes."""

    export: ExportSpec
    variants: tuple[VariantSpec, ...]
    threshold_overrides: dict[str, dict[str, float]] = field(default_factory=dict)
    version: str = "1"
    # ship variants validated on another execution provider than their target's (see parity.py)
    allow_off_target_validation: bool = False
    # build int8 variants with this recipe instead of searching (components/core/quantization/recipes.py)
    int8_recipe: str | None = None

    def __post_init__(self) -> None:
        # the int8 recipe and every variant's gate: ortpack.components.core.tasks.check_build_spec
        if not self.variants:
            raise InvalidSpecError("no variants to build")
        if self.int8_recipe and all(v.precision != "int8" for v in self.variants):
            raise InvalidSpecError("--int8-recipe applies only when int8 is among the precisions")
