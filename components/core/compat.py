"""Will this bundle break my index? Compare the vector spaces of two embedding bundles.

`diff_bundles(old, new, spec)` opens both bundles the way the server does (any bundle URI the
server accepts, fetched by ortpack.kernel.sources and verified), runs paired variants (the same
precision by default, every pair with `all_pairs`) through ONNX Runtime with the task's own
engine (ortpack.kernel.engines: the server's tokenization or image decoding, session and model
call) on two sets of inputs:

- the probe set: the probe inputs both bundles carry;
- a retrieval set: the task family's (`TaskFamily.retrieval_set`; text: 400 shipped
  support-desk questions searching the shipped validation sentences), overridable.

Per pair it reports the cosine of old and new vectors of the same text (min/mean), neighbour
agreement@k (each text's k nearest neighbours within its set, old vs new), and **cross-space
retrieval**: the Recall@k of new-bundle queries against an index of old-bundle documents, where
the truth is the old bundle's own top-k documents per query (so the old bundle scores 1.0 on its
own; the ratio of the two is the verdict's number). It also gives the recall after re-indexing
(new queries, new documents) for comparison.

Verdicts: `drop-in` (every pair's ratio >= the budget: vectors from the new bundle can search an
index built with the old one), `re-index` (a pair below it), `incompatible` (dimensions or
normalisation differ: nothing is run). Two variants in the same embedding space
(ortpack.kernel.bundle.EmbeddingSpace) compute the same vectors, so each space is embedded once.

The pipeline's package step uses it through `check_baseline` (its `baseline_bundle` parameter):
a `BaselineCheck` carries the diff, its KFP metrics and whether it stops the build.

The task's contract says whether it has an embedding space and which output holds the vectors
(`TaskContract.space`); any such task is compared the same way.

What it does not do: judge which bundle is *better* (there are no relevance labels here, only
agreement with the old bundle), or compare tasks without an embedding space.

numpy, onnxruntime and the engines' tokenizers and decoders only (through the kernel): no torch.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortpack.components.core.errors import InvalidSpecError, OrtpackError, one_line
from ortpack.components.core.tasks import get_family
from ortpack.components.core.vectors import compare_rows, cross_space_recall
from ortpack.kernel.bundle import Manifest, Variant, embedding_space, read_verified, verify_bundle
from ortpack.kernel.contracts import get_contract, space_tasks
from ortpack.kernel.engine import stack
from ortpack.kernel.engines import open_engine
from ortpack.kernel.probe import Probe
from ortpack.kernel.runtime import create_session, plan_for
from ortpack.kernel.sources import fetch_bundle

log = logging.getLogger("ortpack.compat")

DROP_IN, RE_INDEX, INCOMPATIBLE = "drop-in", "re-index", "incompatible"
VERDICTS = (DROP_IN, RE_INDEX, INCOMPATIBLE)  # from best to worst
EXIT_CODES = {DROP_IN: 0, RE_INDEX: 3, INCOMPATIBLE: 4}
DEFAULT_BUDGET = 0.95
NEIGHBOURS = 10
BATCH = 16  # texts per model call for batch-invariant variants (not int8: see _embed)


@dataclass(frozen=True, kw_only=True)
class DiffSpec:
    """How to compare: the recall budget, the neighbourhood size, which variant pairs, which texts
    (empty: the shipped queries and documents), and ONNX Runtime threads (0: every core)."""

    budget: float = DEFAULT_BUDGET
    k: int = NEIGHBOURS
    all_pairs: bool = False
    queries: tuple[str, ...] = ()
    documents: tuple[str, ...] = ()
    threads: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.budget <= 1.0:
            raise InvalidSpecError(f"--budget must be in (0, 1], got {self.budget}")
        if self.k < 1:
            raise InvalidSpecError(f"-k must be >= 1, got {self.k}")
        if self.threads < 0:
            raise InvalidSpecError(f"--threads must be >= 0, got {self.threads}")


@dataclass(frozen=True, kw_only=True)
class PairDiff:
    """One old variant against one new variant."""

    old: str
    new: str
    old_space: str | None
    new_space: str | None
    verdict: str
    reason: str
    dimensions: tuple[int, int]
    normalize: tuple[bool, bool]
    probe: dict[str, float] = field(default_factory=dict)  # texts, min/mean_cosine, neighbour_agreement
    retrieval: dict[str, float] = field(default_factory=dict)  # the same, plus recall_* and recall_ratio

    @property
    def same_space(self) -> bool:
        return self.old_space is not None and self.old_space == self.new_space


@dataclass(frozen=True, kw_only=True)
class BundleDiff:
    """The comparison of two bundles: every pair, and the verdict (the worst pair's)."""

    old: dict[str, Any]  # uri, name, version, spaces {variant: id}
    new: dict[str, Any]
    budget: float
    k: int
    texts: dict[str, int]  # probe, queries, documents
    pairs: list[PairDiff]
    seconds: float

    @property
    def verdict(self) -> str:
        return max((p.verdict for p in self.pairs), key=VERDICTS.index)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pairs"] = [asdict(p) | {"same_space": p.same_space} for p in self.pairs]
        out.update(verdict=self.verdict, exit_code=self.exit_code)
        return out

    def table(self) -> str:
        """A compact table: one row per pair, then the verdict."""
        head = (
            f"old: {self.old['name']} {self.old['version']} ({self.old['uri']})\n"
            f"new: {self.new['name']} {self.new['version']} ({self.new['uri']})\n"
            f"texts: {self.texts['probe']} probe, {self.texts['queries']} queries x {self.texts['documents']} "
            f"documents; k={self.k}; budget {self.budget:g}"
        )
        nbr = f"nbr@{self.k}"
        columns: tuple[str, ...] = ("pair", "space", "probe cos min/mean", nbr, "set cos min/mean", nbr)
        columns += (f"cross R@{self.k}", "ratio", "verdict")
        rows = [columns]
        for p in self.pairs:
            space = "same" if p.same_space else "differs"
            if p.verdict == INCOMPATIBLE:
                rows.append((f"{p.old} -> {p.new}", space, "-", "-", "-", "-", "-", "-", p.verdict))
                continue
            pr, rt = p.probe, p.retrieval
            rows.append(
                (
                    f"{p.old} -> {p.new}",
                    space,
                    f"{pr['min_cosine']:.4f} / {pr['mean_cosine']:.4f}",
                    f"{pr['neighbour_agreement']:.3f}",
                    f"{rt['min_cosine']:.4f} / {rt['mean_cosine']:.4f}",
                    f"{rt['neighbour_agreement']:.3f}",
                    f"{rt['recall_cross']:.3f}",
                    f"{rt['recall_ratio']:.3f}",
                    p.verdict,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        worst = self.worst_pair()
        return "\n".join([head, *lines, f"verdict: {self.verdict}: {worst.old} -> {worst.new}: {worst.reason}"])

    def worst_pair(self) -> PairDiff:
        """The pair that decides the verdict: the worst verdict, then the lowest recall ratio."""
        return max(self.pairs, key=lambda p: (VERDICTS.index(p.verdict), -p.retrieval.get("recall_ratio", 0.0)))


def diff_bundles(old: str, new: str, spec: DiffSpec | None = None) -> BundleDiff:
    """Compare bundle `new` with bundle `old` (directories or any URI the server accepts)."""
    spec = spec or DiffSpec()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ortpack-diff-") as cache:
        a, b = _open(old, Path(cache) / "old"), _open(new, Path(cache) / "new")
        pairs = pair_variants(a.manifest, b.manifest, all_pairs=spec.all_pairs)
        probe = _unique([*a.probe_inputs(), *b.probe_inputs()])
        shipped = _retrieval_set(a.manifest.task) if not (spec.queries and spec.documents) else ((), ())
        queries = _unique(spec.queries or shipped[0])
        documents = _unique(spec.documents or shipped[1])
        if not queries or not documents:
            raise InvalidSpecError("the retrieval set needs at least one query and one document")
        texts = [*probe, *queries, *documents]
        embedded: dict[str, np.ndarray] = {}  # space id -> rows of `texts`
        results = []
        for vo, vn in pairs:
            reason = incompatibility(a.manifest, b.manifest)
            if reason:
                results.append(_pair(a, b, vo, vn, INCOMPATIBLE, reason))
                continue
            rows_old = _embed(a, vo, texts, embedded, spec.threads)
            rows_new = _embed(b, vn, texts, embedded, spec.threads)
            cut_q, cut_d = len(probe), len(probe) + len(queries)
            probe_numbers = compare_rows(rows_old[:cut_q], rows_new[:cut_q], spec.k) if probe else {}
            retrieval = compare_rows(rows_old[cut_q:], rows_new[cut_q:], spec.k)
            retrieval.update(
                cross_space_recall(
                    rows_old[cut_q:cut_d], rows_old[cut_d:], rows_new[cut_q:cut_d], rows_new[cut_d:], spec.k
                )
            )
            ratio = retrieval["recall_ratio"]
            verdict = DROP_IN if ratio >= spec.budget else RE_INDEX
            reason = (
                f"new queries find {ratio:.1%} of the old bundle's own top-{spec.k} documents in the old index "
                f"({'at least' if verdict == DROP_IN else 'below'} the {spec.budget:g} budget)"
            )
            results.append(_pair(a, b, vo, vn, verdict, reason, probe=probe_numbers, retrieval=retrieval))
        return BundleDiff(
            old=a.summary(),
            new=b.summary(),
            budget=spec.budget,
            k=spec.k,
            texts={"probe": len(probe), "queries": len(queries), "documents": len(documents)},
            pairs=results,
            seconds=round(time.perf_counter() - started, 3),
        )


# ---------------------------------------------------------------------------- a build against its baseline


@dataclass(frozen=True, kw_only=True)
class BaselineCheck:
    """A new build compared with the bundle it is to replace (the pipeline's `baseline_bundle`):
    the diff, and whether a verdict other than drop-in stops the build (`required`)."""

    baseline: str  # the URI or path as given
    diff: BundleDiff
    required: bool = False

    @property
    def drop_in(self) -> bool:
        return self.diff.verdict == DROP_IN

    @property
    def blocks(self) -> bool:
        """Nothing may ship: a drop-in was required and this is not one."""
        return self.required and not self.drop_in

    def summary(self) -> str:
        """One line: the verdict, the baseline, why (the pair that decides the verdict), and
        whether that stops the build."""
        worst = self.diff.worst_pair()
        line = f"{self.diff.verdict} against the baseline {self.baseline}: {worst.old} -> {worst.new}: {worst.reason}"
        return f"{line}; nothing ships (require_compatible)" if self.blocks else line

    def metrics(self) -> dict[str, float]:
        """KFP metrics, numbers only: the verdict (1/0, and its exit code 0/3/4), the budget, the
        deciding pair's retrieval-set numbers, then each pair's as `compat.OLD.NEW.<name>`."""
        names = ("recall_ratio", "min_cosine", "neighbour_agreement")
        worst = self.diff.worst_pair()
        out = {
            "compat.drop_in": float(self.drop_in),
            "compat.verdict_code": float(self.diff.exit_code),
            "compat.budget": float(self.diff.budget),
            "compat.required": float(self.required),
        }
        out.update({f"compat.{name}": worst.retrieval[name] for name in names if name in worst.retrieval})
        for pair in self.diff.pairs:  # an incompatible pair has no numbers
            out.update({f"compat.{pair.old}.{pair.new}.{n}": pair.retrieval[n] for n in names if n in pair.retrieval})
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "required": self.required, "summary": self.summary(), **self.diff.as_dict()}


def check_baseline(
    baseline: str, new_bundle: Path, *, budget: float = DEFAULT_BUDGET, required: bool = False
) -> BaselineCheck:
    """Compare a bundle a build just wrote (`new_bundle`, a directory) with `baseline` (a directory
    or any URI the server accepts). Anything that stops the comparison (the baseline missing,
    unreachable, tampered with, not a text-embedding bundle) is one `InvalidSpecError` line."""
    import dataclasses

    if not 0.0 < budget <= 1.0:
        raise InvalidSpecError(f"the compatibility budget must be in (0, 1], got {budget}")
    try:
        diff = diff_bundles(baseline, str(new_bundle), DiffSpec(budget=budget))
    except (OrtpackError, ValueError, OSError, RuntimeError) as exc:
        raise InvalidSpecError(f"cannot compare with the baseline bundle: {one_line(exc)}") from None
    # the new bundle was compared where the build wrote it for the purpose; name it by what it is
    diff = dataclasses.replace(diff, new={**diff.new, "uri": "this build"})
    return BaselineCheck(baseline=baseline, diff=diff, required=required)


# ---------------------------------------------------------------------------- the numbers


# ---------------------------------------------------------------------------- bundles and variants


@dataclass(frozen=True, kw_only=True)
class _Side:
    uri: str
    path: Path
    manifest: Manifest

    def probe_inputs(self) -> list[Any]:

        if self.manifest.probe is None:
            return []
        names = [o.name for o in self.manifest.signature.outputs]
        return Probe.from_bytes(read_verified(self.path, self.manifest, self.manifest.probe.file), names).inputs

    def summary(self) -> dict[str, Any]:
        spaces = {}
        for v in self.manifest.variants:
            space = embedding_space(self.manifest, v)
            spaces[v.id] = space.id if space is not None else None
        return {"uri": self.uri, "name": self.manifest.name, "version": self.manifest.version, "spaces": spaces}


def _open(uri: str, cache: Path) -> _Side:
    """Fetch (ortpack.kernel.sources: a directory is used in place) and verify every file's sha256."""

    cache.mkdir(parents=True, exist_ok=True)
    path = fetch_bundle(uri, cache)
    manifest = verify_bundle(path)
    if get_contract(manifest.task).space is None:
        raise InvalidSpecError(
            f"bundle diff compares embedding bundles ({', '.join(space_tasks())}); {uri} is a {manifest.task} bundle"
        )
    return _Side(uri=uri, path=path, manifest=manifest)


def pair_variants(old: Manifest, new: Manifest, *, all_pairs: bool = False) -> list[tuple[Variant, Variant]]:
    """(old variant, new variant) pairs: those of the same precision, or every pair with
    `all_pairs` (also when no precision is in both bundles)."""
    same = [(a, b) for a in old.variants for b in new.variants if a.precision == b.precision]
    if all_pairs or not same:
        if not same and not all_pairs:
            log.info("diff: no precision is in both bundles; comparing every pair")
        return [(a, b) for a in old.variants for b in new.variants]
    return same


def incompatibility(old: Manifest, new: Manifest) -> str:
    """Why vectors of the two bundles cannot share an index at all ("" when they could)."""
    if old.task != new.task:
        return f"tasks differ: {old.task} -> {new.task}"
    dims = (_width(old), _width(new))
    if dims[0] != dims[1]:
        return f"dimensions differ: {dims[0]} -> {dims[1]}"
    norms = (_normalized(old), _normalized(new))
    if norms[0] != norms[1]:
        return f"normalisation differs: {'on' if norms[0] else 'off'} -> {'on' if norms[1] else 'off'}"
    return ""


def _vectors(manifest: Manifest) -> str:
    """The output that holds the vectors (the task's space declaration)."""
    declared = get_contract(manifest.task).space
    if declared is None:
        raise InvalidSpecError(f"bundle {manifest.name} is a {manifest.task} bundle: it has no embedding space")
    return declared.output


def _width(manifest: Manifest) -> int:
    name = _vectors(manifest)
    shape = next((o.shape for o in manifest.outputs if o.name == name), [None])
    width = shape[-1]
    if not isinstance(width, int):
        raise InvalidSpecError(f"bundle {manifest.name} does not record its embedding width (output shape {shape!r})")
    return width


def _normalized(manifest: Manifest) -> bool:
    declared = get_contract(manifest.task).space
    facts = declared.facts(manifest.task_settings, manifest.files) if declared is not None else None
    return bool(facts and facts.get("normalize"))


def _pair(a: _Side, b: _Side, vo: Variant, vn: Variant, verdict: str, reason: str, **numbers: Any) -> PairDiff:
    so, sn = embedding_space(a.manifest, vo), embedding_space(b.manifest, vn)
    return PairDiff(
        old=vo.id,
        new=vn.id,
        old_space=so.id if so else None,
        new_space=sn.id if sn else None,
        verdict=verdict,
        reason=reason,
        dimensions=(_width(a.manifest), _width(b.manifest)),
        normalize=(_normalized(a.manifest), _normalized(b.manifest)),
        **numbers,
    )


def _embed(
    side: _Side, variant: Variant, inputs: Sequence[Any], cache: dict[str, np.ndarray], threads: int
) -> np.ndarray:
    """The variant's vectors for `inputs`, as a server computes them: the task's engine (the
    bundle's tokenizer at its max length, the server's image decoder), the verified model bytes in
    a session planned like the server's. int8 variants run at batch 1 (dynamic quantization picks
    its scales per call, so an input's vector depends on its batch: MiniLM, min cosine 0.949
    between batch 1 and length-sorted batches of 16), the others in cost-sorted batches of
    `BATCH` (batch-invariant, and 1.7x faster on MiniLM fp32); images of one size only share a
    batch. A space embedded already (the same model, tokenizer and settings) is reused."""

    space = embedding_space(side.manifest, variant)
    key = space.id if space is not None else f"{side.uri}#{variant.id}"
    if key in cache:
        return cache[key]
    started = time.perf_counter()
    manifest = side.manifest
    files = {name: read_verified(side.path, manifest, name) for name in manifest.task_settings.shared_files()}
    model = read_verified(side.path, manifest, variant.file)
    engine = open_engine(manifest, create_session(model, plan_for(variant), intra_op_threads=threads), files)
    payloads = engine.probe_payloads(list(inputs))
    name = _vectors(manifest)
    size = 1 if variant.precision == "int8" else BATCH
    rows = np.zeros((len(payloads), _width(manifest)), dtype=np.float32)
    for group in _batches(payloads, size):  # little padding in each batch
        rows[group] = stack(engine.run([payloads[i] for i in group]), name)
    log.info("diff: %s %s: %d inputs in %.1f s", manifest.name, variant.id, len(inputs), time.perf_counter() - started)
    cache[key] = rows
    return rows


def _batches(payloads: Sequence[Any], size: int) -> list[list[int]]:
    """Indices in batches of at most `size`, sorted by length so each batch pads little; payloads
    of several axes (images) share a batch only with payloads of their own shape."""

    def key(i: int) -> tuple[tuple[int, ...], int]:
        array = getattr(payloads[i], "ids", payloads[i])  # a TokenPair's ids
        shape = tuple(np.shape(array))
        return (shape if len(shape) > 1 else (), len(array))

    groups: list[list[int]] = []
    for i in sorted(range(len(payloads)), key=key):
        if groups and len(groups[-1]) < size and key(groups[-1][0])[0] == key(i)[0]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def read_texts(path: Path) -> tuple[str, ...]:
    """Texts from a file: one per line, or a `.jsonl` file of JSON strings (blank lines skipped)."""
    import json

    try:
        lines = Path(path).read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSpecError(f"cannot read texts from {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if Path(path).suffix != ".jsonl":
        return tuple(line for line in lines if line.strip())
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)
        except ValueError:
            text = None
        if not isinstance(text, str):
            raise InvalidSpecError(f"{path} line {number} is not a JSON string")
        texts.append(text)
    return tuple(texts)


def _unique(inputs: Sequence[Any]) -> list[Any]:
    """Inputs each once, in order; texts non-blank."""
    return list(dict.fromkeys(x for x in inputs if not isinstance(x, str) or x.strip()))


def _retrieval_set(task: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The task family's default retrieval set (queries, documents)."""

    shipped = get_family(task).retrieval_set
    return shipped() if shipped is not None else ((), ())
