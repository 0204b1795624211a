"""A quality policy at admission: `--require EXPR`, checked against what a bundle records before
any model is loaded.

Two kinds of expression:

- `SELECTOR.METRIC OP NUMBER`, e.g. `int8.min_cosine>=0.95`: SELECTOR is a variant id
  (`cpu-int8`) or a precision (`fp32`, `fp16`, `int8`), METRIC a value the variant's parity gate
  recorded at build time (`variants[].parity.values` in the manifest: `min_cosine`,
  `neighbour_agreement`, `b1.min_cosine`...; the first `.` ends the selector), OP one of
  `>= <= > < ==`. It applies to the variants the selector names; a variant that records no such
  metric misses it (nothing proves it).
- `space=ID`, e.g. `space=sha256:2841aa86124a86b7`: the variant's embedding space
  (ortpack.kernel.bundle.EmbeddingSpace) must be ID; it applies to every variant.

A variant that misses any expression that applies to it is excluded from selection; when none is
left the bundle is refused with one line naming the expression and what the bundle recorded. A
selector that is neither a precision nor one of the bundle's variant ids refuses the bundle too (a
typo must not pass silently). The manifest read is the one the signature pinned (with
--trust-key), so the numbers checked are the signed ones. Standard library only.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ortpack.kernel.bundle import BundleError, Manifest, Variant, embedding_space
from ortpack.kernel.targets import PRECISIONS

ENV_SEPARATOR = ";"  # ORTPACK_REQUIRE holds several expressions: `a>=1;b<=2`

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_METRIC = re.compile(
    rf"^(?P<selector>[A-Za-z0-9][A-Za-z0-9_-]*)\.(?P<metric>[A-Za-z0-9_][A-Za-z0-9_.]*?)\s*"
    rf"(?P<op>>=|<=|==|>|<)\s*(?P<value>{_NUMBER})$"
)
_SPACE = re.compile(r"^space\s*==?\s*(?P<value>\S+)$")
_SPACE_ID = re.compile(r"^sha256:[0-9a-f]{16}$")


class PolicyError(ValueError):
    """An expression that does not parse (a usage error)."""


class PolicyRefusedError(BundleError):
    """No variant of the bundle meets the policy (or it names a variant the bundle lacks)."""


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """One parsed `--require` expression."""

    text: str
    selector: str  # a variant id or precision; "" for a space requirement
    metric: str  # a parity value name, or "space"
    op: str
    value: float | str

    def applies_to(self, variant: Variant) -> bool:
        return not self.selector or self.selector in (variant.id, variant.precision)

    def miss(self, manifest: Manifest, variant: Variant) -> str | None:
        """Why `variant` misses this requirement (naming what it recorded), or None."""
        if self.metric == "space":
            space = embedding_space(manifest, variant)
            if space is None:
                return f"'{self.text}': {variant.id} has no embedding space (not a text-embedding variant)"
            return None if space.id == self.value else f"'{self.text}': {variant.id} serves space {space.id}"
        recorded = variant.parity.values.get(self.metric)
        if recorded is None:
            known = ", ".join(sorted(variant.parity.values)) or "none"
            return f"'{self.text}': {variant.id} records no {self.metric} (it records: {known})"
        assert isinstance(self.value, float)
        if math.isnan(recorded) or not _OPS[self.op](float(recorded), self.value):
            shown = f"{recorded:.6g}"
            if float(shown) == self.value:  # rounding hides the gap: show enough digits to see it
                shown = repr(float(recorded))
            return f"'{self.text}': {variant.id} recorded {self.metric} {shown}"
        return None


def parse_requirement(text: str) -> Requirement:
    """Parse one expression; raises PolicyError with one line saying what is expected."""
    cleaned = text.strip()
    space = _SPACE.match(cleaned)
    if space:
        value = space.group("value")
        if not _SPACE_ID.match(value):
            raise PolicyError(
                f"--require {text!r}: a space id is sha256: and 16 hex digits (GET /v2/models/NAME shows it)"
            )
        return Requirement(text=cleaned, selector="", metric="space", op="==", value=value)
    match = _METRIC.match(cleaned)
    if not match:
        raise PolicyError(
            f"--require {text!r} is not VARIANT_OR_PRECISION.METRIC OP NUMBER (e.g. int8.min_cosine>=0.95; "
            "OP one of >= <= > < ==) or space=ID"
        )
    return Requirement(
        text=cleaned,
        selector=match.group("selector"),
        metric=match.group("metric"),
        op=match.group("op"),
        value=float(match.group("value")),
    )


def parse_requirements(texts: Iterable[str]) -> tuple[Requirement, ...]:
    return tuple(parse_requirement(t) for t in texts if t.strip())


def split_expressions(value: str) -> list[str]:
    """The expressions in an ORTPACK_REQUIRE value (`;`-separated; blanks dropped)."""
    return [part.strip() for part in value.split(ENV_SEPARATOR) if part.strip()]


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What a policy admits of a bundle's variants, and why it excluded the others."""

    admitted: list[Variant]
    excluded: dict[str, list[str]]  # variant id -> its misses


def admit(manifest: Manifest, variants: Sequence[Variant], policy: Sequence[Requirement]) -> Admission:
    """The variants (in order) that meet every requirement that applies to them. Raises
    PolicyRefusedError, one line, when a selector names nothing the bundle has or when none is left."""
    ids = {v.id for v in manifest.variants}
    for requirement in policy:
        if requirement.selector and requirement.selector not in ids and requirement.selector not in PRECISIONS:
            raise PolicyRefusedError(
                f"bundle {manifest.name} {manifest.version} refused by policy: '{requirement.text}' names "
                f"{requirement.selector!r}, neither a precision ({', '.join(PRECISIONS)}) nor one of its variants "
                f"({', '.join(sorted(ids))})"
            )
    admitted, excluded = [], {}
    for variant in variants:
        misses = [m for r in policy if r.applies_to(variant) and (m := r.miss(manifest, variant)) is not None]
        if misses:
            excluded[variant.id] = misses
        else:
            admitted.append(variant)
    if not admitted:
        reasons = "; ".join(m for misses in excluded.values() for m in misses)
        raise PolicyRefusedError(
            f"bundle {manifest.name} {manifest.version} refused by policy: no variant meets it: {reasons}"
        )
    return Admission(admitted=admitted, excluded=excluded)
