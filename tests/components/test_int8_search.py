"""The int8 recipe search (components/core/quantization/int8_search.py): every candidate is measured, the rule
picks the winner from the recorded numbers, and the shipped graph is the winner's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortpack.components.core.artifacts import OptimizeResult
from ortpack.components.core.quantization.int8_search import TIE, choose, ranked
from ortpack.components.core.quantization.recipes import DYNAMIC_INT8_RECIPES


def test_rule_fastest_then_smallest_then_first() -> None:
    # within the tie, the smaller wins; outside it, speed does
    assert choose({"a": (10.0, 50.0), "b": (10.0 * TIE * 0.99, 20.0)}) == "b"
    assert choose({"a": (10.0, 50.0), "b": (10.0 * TIE * 1.01, 20.0)}) == "a"
    assert choose({"a": (10.0, 20.0), "b": (9.5, 20.0)}) == "a"  # a tie on both: the earlier
    assert choose({"slow": (30.0, 5.0), "fast": (10.0, 50.0), "fast-small": (10.5, 40.0)}) == "fast-small"
    # small models: half a millisecond is a tie whatever the ratio (timer noise)
    assert choose({"a": (1.8, 8.0), "b": (2.1, 2.0)}) == "b"
    assert choose({"a": (1.8, 8.0), "b": (2.4, 2.0)}) == "a"


def test_ranked_is_the_rule_applied_again_to_the_rest() -> None:
    measured = {"a": (10.0, 50.0), "b": (10.5, 20.0), "c": (30.0, 5.0), "d": (10.2, 20.0)}
    assert ranked(measured) == ["b", "d", "a", "c"]


def _rows(variant: Path) -> tuple[str, dict[str, dict]]:
    int8 = OptimizeResult.load(variant).metrics["int8"]
    return int8["recipe"], int8["candidates"]


def test_every_recipe_is_measured_and_the_rule_picks_the_winner(tiny_variants: dict[str, Path]) -> None:
    recipe, rows = _rows(tiny_variants["cpu-int8"])
    # the three weight recipes are always tried; each one within budget also with int8 embeddings
    assert {r.name for r in DYNAMIC_INT8_RECIPES} <= set(rows)
    for name, row in rows.items():
        assert row["passed"] == (not row["misses"])
        assert "probe_min_cosine" in row["quality"] and row["mb"] > 0
        if row["passed"]:
            assert {"recall_at_10", "neighbour_agreement", "min_cosine"} <= set(row["quality"])
            assert row["speed_ms"] > 0 and set(row["latency_ms"]) == {"b1_s16", "b16_s128"}
            assert f"{name}+int8-embeddings" in rows or name.endswith("+int8-embeddings")
    # within the subset's budget and timed: ranked by the rule; each one ranked before the winner
    # missed the whole gate (confirmation), and the winner passed it
    timed = {n: (r["speed_ms"], r["mb"]) for n, r in rows.items() if "speed_ms" in r}
    assert timed, rows
    order = ranked(timed)
    before = order[: order.index(recipe)]
    assert all(m.startswith("whole gate: ") for n in before for m in rows[n]["misses"]) and all(
        rows[n]["misses"] for n in before
    )
    assert rows[recipe]["passed"] and rows[recipe]["quality"]["gate_min_cosine"] >= 0.9
    passing = {n: timed[n] for n, r in rows.items() if r["passed"]}
    # an int8 embedding table makes the file smaller than the same recipe without it
    for name in passing:
        if name.endswith("+int8-embeddings"):
            assert rows[name]["mb"] < rows[name.removesuffix("+int8-embeddings")]["mb"]


def test_the_manifest_carries_the_search_and_reads_older_records(tiny_bundle: Path) -> None:
    from ortpack.kernel.bundle import Int8Recipe, verify_bundle

    int8 = verify_bundle(tiny_bundle).variant("cpu-int8").optimize.int8
    assert int8 is not None and int8.recipe in int8.candidates and int8.rule
    assert int8.candidates[int8.recipe].passed
    # a bundle from before the search: each candidate was its numbers alone
    old = Int8Recipe.model_validate({"recipe": "s7", "candidates": {"s7": {"top1_agreement": 0.9}}})
    assert old.candidates["s7"].quality == {"top1_agreement": 0.9} and old.candidates["s7"].passed is None


def test_the_report_shows_every_candidate(tiny_variants: dict[str, Path]) -> None:
    from ortpack.components.core.quantization.int8_search import table

    record = OptimizeResult.load(tiny_variants["cpu-int8"]).metrics["int8"]
    rows = table(record)
    assert rows[0][0] == "recipe" and rows[0][-1] == "outcome"
    assert [r[0] for r in rows[1:]] == list(record["candidates"])
    assert [r[-1] for r in rows[1:]].count("shipped") == 1


def test_winner_is_what_ships(tiny_variants: dict[str, Path]) -> None:
    recipe, _ = _rows(tiny_variants["cpu-int8"])
    ops = OptimizeResult.load(tiny_variants["cpu-int8"]).metrics["ops_after"]
    import onnx

    graph = onnx.load(str(tiny_variants["cpu-int8"] / "model.onnx")).graph
    quantized_embeddings = any(n.op_type == "QEmbedLayerNormalization" for n in graph.node)
    assert quantized_embeddings == recipe.endswith("+int8-embeddings"), (recipe, ops)


def test_no_candidate_within_budget_keeps_the_best_and_the_gate_reports_it(
    tiny_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget nothing meets (Recall@10 above 1): every candidate is measured and misses, the one
    with the best recall ships, and its record says why."""
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import text_embedding

    monkeypatch.setattr(text_embedding, "SEARCH_MIN_RECALL", 1.01)
    optimize_model(tiny_export, VariantSpec(target="cpu", precision="int8"), tmp_path / "int8")
    recipe, rows = _rows(tmp_path / "int8")
    assert rows and not any(r["passed"] for r in rows.values())
    assert all(any("recall_at_10" in m or "probe:" in m for m in r["misses"]) for r in rows.values())
    best = max(
        rows, key=lambda n: (rows[n]["quality"].get("recall_at_10", 0.0), rows[n]["quality"]["probe_min_cosine"])
    )
    assert recipe == best


@pytest.mark.slow
def test_a_pinned_recipe_is_built_alone_and_recorded(tiny_export: Path, tmp_path: Path) -> None:
    """`--int8-recipe NAME`: one graph, no search; optimize.json names it and says it was pinned.
    Pinning the recipe of an earlier search rebuilds that graph: the same bytes."""
    import onnx

    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.quantization.recipes import PINNED_RULE, dynamic_recipe_names
    from ortpack.components.core.specs import VariantSpec

    int8 = VariantSpec(target="cpu", precision="int8")
    built = {}
    for name in ("per-channel", "per-tensor+int8-embeddings"):
        assert name in dynamic_recipe_names()
        out = tmp_path / name
        optimize_model(tiny_export, int8, out, int8_recipe=name)
        record = OptimizeResult.load(out).metrics["int8"]
        assert (record["recipe"], record["rule"], record["candidates"]) == (name, PINNED_RULE, {})
        built[name] = onnx.load(str(out / "model.onnx"))

    # per tensor: every weight scale of the quantized MatMuls is one number; per channel: a row
    def scales(model: onnx.ModelProto) -> set[int]:
        return {len(i.dims) for i in model.graph.initializer if i.name.endswith("_scale") and "MatMul" in i.name}

    assert scales(built["per-channel"]) == {1} and scales(built["per-tensor+int8-embeddings"]) == {0}
    sizes = {name: (tmp_path / name / "model.onnx").stat().st_size for name in built}
    assert sizes["per-tensor+int8-embeddings"] < sizes["per-channel"] * 0.8  # 8-bit embedding tables

    searched = tmp_path / "searched"
    optimize_model(tiny_export, int8, searched)
    winner = OptimizeResult.load(searched).metrics["int8"]["recipe"]
    again = tmp_path / "again"
    optimize_model(tiny_export, int8, again, int8_recipe=winner)
    assert (again / "model.onnx").read_bytes() == (searched / "model.onnx").read_bytes()


def test_recipe_names_are_checked_per_task() -> None:
    from ortpack.components.core.errors import InvalidSpecError
    from ortpack.components.core.tasks import check_int8_recipe

    check_int8_recipe("image-classification", "s7")
    check_int8_recipe("text-classification", "per-channel+int8-embeddings")
    with pytest.raises(InvalidSpecError, match="unknown int8 recipe 'per-channel' for task 'image-classification'"):
        check_int8_recipe("image-classification", "per-channel")
