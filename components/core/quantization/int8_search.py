"""Choose an int8 recipe by measuring the candidates, not by a fixed rule.

A task hands `search` its candidates (a name and a function that writes the quantized graph), a
`judge` that measures one candidate's quality and says what it misses of the parity budget, and
the benchmark feeds. Every candidate is built and judged; those within budget are then timed
together (interleaved, `ortpack.components.core.timing.measure_interleaved`, so a busy machine slows
them alike; each one's fastest call per shape, the geometric mean over the shapes), and the
winner is:

    the fastest, where any candidate within `TIE` (10 %) or `TIE_MS` (0.5 ms) of the fastest
    counts as fast, then the smallest file among those, then the earlier candidate.

The tie keeps the choice stable from run to run and machine to machine when two recipes run at
the same speed (the smaller one wins, not the noise). When no candidate is within budget the one
the task's `fallback` key ranks best is kept and the validate step reports its miss. The rule is
the same on every CPU kind; candidates whose numbers depend on the CPU (8-bit s8 weights without
VNNI) are not offered. The budget is judged on a subset (cheap); before a candidate wins, the
task's whole parity gate (`confirm`: every validation input, at batch 1 and in padded batches, as
the validate step runs it) must pass too, else the next in the rule's order is confirmed. The
validate step then gates the shipped graph again, and the node probe re-checks it where served.

`search` returns what the optimize step records as `metrics["int8"]`: the recipe, the rule, and
every candidate's numbers, which the report shows as a table.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpack.components.core.timing import measure_interleaved, timed
from ortpack.kernel.runtime import DISABLED_OPTIMIZERS

log = logging.getLogger("ortpack.int8")

TIE = 1.10  # latencies within 10 % of the fastest count as equally fast,
TIE_MS = 0.5  # and so do those within half a millisecond (small models: a tiny BERT's 0.25 vs
# 0.31 ms at b1 was timer noise, and flipped the choice between two runs of one build)
RULE = "fastest within the parity budget (within 10 % or 0.5 ms counts as a tie), then smallest"


@dataclass(frozen=True)
class Candidate:
    name: str
    build: Callable[[Path], None]  # writes the quantized graph to the path


@dataclass(frozen=True)
class Judged:
    quality: dict[str, float]
    misses: list[str]


def search(
    candidates: Sequence[Candidate],
    dst: Path,
    *,
    judge: Callable[[Path], Judged],
    feeds: dict[str, dict[str, Any]],
    fallback: Callable[[dict[str, Any]], Any],
    expand: Callable[[str], Sequence[Candidate]] = lambda name: (),
    confirm: Callable[[Path], Judged] | None = None,
    precision: str = "int8",
) -> dict[str, Any]:
    """Build and judge `candidates`, then, for each one within budget, the candidates `expand`
    derives from it (a recipe plus one more saving); time the passing ones on `feeds` ({shape:
    session feeds}); take them in the rule's order and keep the first that `confirm` (the task's
    whole parity gate) passes; copy the winner to `dst`. Returns the record for `metrics["int8"]`."""
    work = dst.parent
    table: dict[str, dict[str, Any]] = {}
    paths: dict[str, Path] = {}

    def try_one(candidate: Candidate) -> bool:
        path = work / f"{dst.stem}.{candidate.name}.onnx"
        candidate.build(path)
        judged = judge(path)
        paths[candidate.name] = path
        table[candidate.name] = {
            "quality": {k: round(v, 6) for k, v in judged.quality.items()},
            "mb": round(path.stat().st_size / 1e6, 2),
            "passed": not judged.misses,
            "misses": judged.misses,
        }
        log.info(
            "%s candidate %s: %.1f MB, %s",
            precision,
            candidate.name,
            table[candidate.name]["mb"],
            "; ".join(judged.misses) if judged.misses else "within budget",
        )
        return not judged.misses

    for candidate in candidates:
        if try_one(candidate):
            for derived in expand(candidate.name):
                try_one(derived)
    passing = [name for name, row in table.items() if row["passed"]]
    winner: str | None = None
    if passing:
        speeds = time_candidates({name: paths[name] for name in passing}, feeds)
        for name, shapes in speeds.items():
            table[name]["latency_ms"] = shapes
            table[name]["speed_ms"] = round(_geomean(shapes.values()), 4)
        winner = None
        for name in ranked({name: (table[name]["speed_ms"], table[name]["mb"]) for name in passing}):
            if confirm is None:
                winner = name
                break
            confirmed = confirm(paths[name])
            table[name]["quality"].update({k: round(v, 6) for k, v in confirmed.quality.items()})
            if not confirmed.misses:
                winner = name
                break
            table[name].update(passed=False, misses=[f"whole gate: {m}" for m in confirmed.misses])
            log.info("%s candidate %s misses the whole gate: %s", precision, name, "; ".join(confirmed.misses))
    if winner is None:
        winner = max(table, key=lambda name: fallback(table[name]["quality"]))
        log.warning(
            "%s: no candidate is within the parity budget; keeping %s (the validate step reports it)", precision, winner
        )
    shutil.copyfile(paths[winner], dst)
    log.info("%s recipe: %s (%s)", precision, winner, RULE)
    return {"recipe": winner, "rule": RULE, "candidates": table}


def ranked(measured: dict[str, tuple[float, float]]) -> list[str]:
    """Every candidate in the rule's order: the winner, then the winner of the rest, ..."""
    left, order = dict(measured), []
    while left:
        order.append(choose(left))
        del left[order[-1]]
    return order


def choose(measured: dict[str, tuple[float, float]]) -> str:
    """The winner among {name: (speed ms, MB)} in insertion order: within TIE (or TIE_MS) of the
    fastest, then the smallest, then the first."""
    fastest = min(speed for speed, _ in measured.values())
    fast = [name for name, (speed, _) in measured.items() if speed <= max(TIE * fastest, fastest + TIE_MS)]
    return min(fast, key=lambda name: (measured[name][1], list(measured).index(name)))


def time_candidates(paths: dict[str, Path], feeds: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each graph's fastest call in ms per feed shape, the candidates measured interleaved on one
    thread each (the server's one-thread-per-core workers). The fastest call, not the median: it
    is the least disturbed by whatever else runs, and the search compares recipes, not loads."""
    from functools import partial

    sessions = {name: session(path, threads=1) for name, path in paths.items()}
    out: dict[str, dict[str, float]] = {name: {} for name in paths}
    for shape, feed in feeds.items():
        calls = {name: timed(partial(graph.run, None, feed)) for name, graph in sessions.items()}
        # not shortened by ORTPACK_TIMING=quick: the choice of what ships rests on it (a small
        # model gets many rounds in the budget; a large one's calls are long and steadier)
        stats = measure_interleaved(calls, warmup=1, min_iters=3, max_iters=50, budget_s=0.5, honour_quick=False)
        for name in paths:
            out[name][shape] = round(stats[name]["min_ms"], 4)
    return out


def session(path: Path, threads: int = 0) -> Any:
    """A CPU session of a candidate graph, with the server's disabled optimizers (`threads` 0:
    ONNX Runtime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_OPTIMIZERS
    )


def _geomean(values: Any) -> float:
    values = list(values)
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def table(record: dict[str, Any]) -> list[list[str]]:
    """The search as rows (a header first) for the report: every candidate with its size, its
    numbers, its latency per shape, and whether it shipped, was within budget or what it missed.
    `record` is the optimize step's `metrics["int8"]` (or the manifest's, as a dict)."""
    rows = record.get("candidates") or {}
    if not rows:
        return []
    quality = list(dict.fromkeys(k for row in rows.values() for k in row.get("quality", {})))
    shapes = list(dict.fromkeys(s for row in rows.values() for s in row.get("latency_ms") or {}))
    sized = any(row.get("mb") is not None for row in rows.values())
    mixed = any(row.get("float_layers") for row in rows.values())  # image int8 with layers kept in float
    header = [
        "recipe",
        *(["MB"] if sized else []),
        *(["float layers"] if mixed else []),
        *quality,
        *(f"{s} ms" for s in shapes),
        "outcome",
    ]
    out = [header]
    for name, row in rows.items():
        numbers, latency = row.get("quality", {}), row.get("latency_ms") or {}
        if name == (record.get("candidate") or record.get("recipe")):
            outcome = "shipped"
        elif row.get("passed") is not False and not row.get("misses"):
            outcome = "within budget"
        else:
            outcome = "; ".join(row.get("misses") or []) or "missed"
        out.append(
            [
                name,
                *([f"{row['mb']:.1f}" if row.get("mb") is not None else "-"] if sized else []),
                *([str(row.get("float_layers", 0))] if mixed else []),
                *(f"{numbers[k]:.4f}" if k in numbers else "-" for k in quality),
                *(f"{latency[s]:.2f}" if s in latency else "-" for s in shapes),
                outcome,
            ]
        )
    return out
