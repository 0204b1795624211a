"""The report opens with the verdict: which variant a server here serves, why, at what accuracy
cost, where it was proven, and why not each alternative; built from a real build's step records
(tests/data/report_minilm, scenarios in tests/report_shots.py). Content only, never timings."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import pytest

from ortpack.components.core.report import format_summary, render_html
from ortpack.components.core.report.numbers import format_metric, format_ms, format_ratio, shape_label
from ortpack.components.core.report.page import parity_tables, verdict_box
from tests.report_shots import Build, int8_missed, nothing_passed, recorded_build, under_load, with_gpu_variant


def _text(fragment: str) -> str:
    """The words a reader sees in an HTML fragment."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def test_numbers_carry_units_and_sensible_precision() -> None:
    assert [format_ms(v) for v in (3.3512, 23.83, 590.95, 8271.8)] == ["3.35 ms", "23.8 ms", "591 ms", "8.27 s"]
    assert [format_ratio(v) for v in (4.06, 1.0, 12.4)] == ["4.1×", "1.0×", "12×"]
    assert format_metric("min_cosine", 0.949189) == "0.9492"
    assert format_metric("b32.neighbour_agreement", 0.914191) == "0.914"
    assert format_metric("max_abs_diff", 3.0547e-07) == "3.1e-07"
    assert format_metric("min_cosine", 0.9999999, 0.99999) == "1.00000"  # as many decimals as the gate
    assert format_metric("min_cosine", 0.999994, 0.99999) == "0.99999400"  # never seemingly equal to it
    assert shape_label("b16_s128") == "batch 16 × 128 tokens" and shape_label("b8_480x640") == "batch 8 × 480x640"


def test_the_verdict_names_the_variant_the_server_picks_why_and_at_what_cost() -> None:
    export, records = recorded_build()
    box = _text(verdict_box(export, records))
    assert box.startswith("Serves cpu-int8 — --variant auto on this build's machine, AMD EPYC")
    assert "Why the fastest here by this build's benchmark: 3.35 ms at batch 1 × 16 tokens, 7.1× PyTorch" in box
    assert (
        "Accuracy cost min cosine 0.9492 (gate ≥ 0.9) · mean cosine 0.9897 (gate ≥ 0.98) · "
        "neighbour agreement 0.914 (gate ≥ 0.8)"
    ) in box
    assert (
        "Proven on AMD EPYC (x86_64, avx2 int8 kernels, 2 cores), CPUExecutionProvider; "
        "its probe set (48 sentences) passed there"
    ) in box
    assert "cpu-fp32 slower here: 5.83 ms against 3.35 ms at batch 1 × 16 tokens; fallback #1" in box
    assert "min cosine 1.00000 (gate ≥ 0.99999)" in box  # the alternative's cost in its own gate
    assert "Load was not recorded per measurement" in box  # these records predate the load record


def test_a_variant_that_missed_its_gate_is_an_alternative_with_its_reason() -> None:
    export, records = int8_missed()
    box = verdict_box(export, records)
    words = _text(box)
    assert words.startswith("Serves cpu-fp32") and "Why the only cpu variant that passed its gate" in words
    assert (
        "cpu-int8 missed its gate on min cosine, mean cosine and neighbour agreement; its probe set missed too" in words
    )
    assert "<span class='miss'>min cosine 0.5761 (gate ≥ 0.9)</span>" in box


def test_a_missed_int8_variant_says_what_would_help() -> None:
    """When no int8 recipe was within budget and the calibration was on generated images, the
    summary says that static int8 needs real photos and how to pass them."""
    from dataclasses import replace

    from ortpack.components.core.tasks.image_classification import CALIBRATION_HINT

    export, records = int8_missed()
    hinted = [
        replace(
            r, built=replace(r.built, metrics={**r.built.metrics, "int8": {"recipe": "x", "hint": CALIBRATION_HINT}})
        )
        if r.built.precision == "int8"
        else r
        for r in records
    ]
    summary = format_summary(export, hinted)
    assert "--calibration-images DIR" in summary and "real photos" in summary
    assert "--calibration-images" not in format_summary(export, records)


def test_a_variant_for_other_hardware_says_so_and_where_it_would_serve() -> None:
    export, records = with_gpu_variant()
    words = _text(verdict_box(export, records))
    assert words.startswith("Serves cpu-int8")
    assert "cuda-fp16 not for this hardware: needs CUDAExecutionProvider (none here)" in words
    assert "Elsewhere: on a GPU node: cuda-fp16 (the only cuda variant that passed its gate)" in words


def test_timings_under_load_are_flagged_in_the_report_and_the_run_summary() -> None:
    export, records = under_load()
    flag = "measured under load: 3.0 runnable tasks per core; speed-ups are unreliable"
    box = verdict_box(export, records)
    assert f"<dd class='warn'>{flag.capitalize()} (cpu-fp32, cpu-int8).</dd>" in box
    summary = format_summary(export, records)
    assert f"WARNING: {flag.capitalize()} (cpu-fp32, cpu-int8)." in summary.splitlines()
    table = summary.splitlines()[:5]
    assert table[0].split()[-1] == "load" and table[2].endswith("0.0/core")  # PyTorch timed quietly
    assert all(row.endswith("3.0/core LOADED") for row in table[3:5])


def test_quiet_timings_are_not_flagged() -> None:
    export, records = recorded_build()
    assert "unreliable" not in format_summary(export, records)


def test_gated_rows_stand_out_and_diagnostics_are_collapsed() -> None:
    _, records = recorded_build()
    tables = parity_tables(records)
    gated, _, diagnostic = tables.partition("<details>")
    rows = re.findall(r"<tr class='gated'>(.*?)</tr>", gated)
    cells = [[_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in rows]
    assert [(c[1], c[2]) for c in cells] == [
        ("cpu-fp32", "max_abs_diff"),
        ("cpu-fp32", "min_cosine"),
        ("cpu-fp32", "neighbour_agreement"),
        ("cpu-int8", "min_cosine"),
        ("cpu-int8", "mean_cosine"),
        ("cpu-int8", "neighbour_agreement"),
    ]
    assert all(c[0] == "gated" for c in cells) and cells[3][3:5] == ["0.9492", "≥ 0.9"]
    assert diagnostic.startswith("<summary>Diagnostic numbers, not gated")
    assert "b32.min_cosine" in diagnostic and "b32.min_cosine" not in gated


@pytest.mark.parametrize("scenario", [recorded_build, int8_missed])
def test_the_report_opens_with_the_verdict(scenario: Callable[[], Build]) -> None:
    export, records = scenario()
    page = render_html(export, records, export.versions)
    assert page.index("<section class='verdict'>") < page.index("<h2>Summary</h2>") < page.index("<img")
    assert "<tr class='gated'>" in page and "<details>" in page


def test_no_variant_passed_says_nothing_ships() -> None:
    export, records = nothing_passed()
    words = _text(verdict_box(export, records))
    assert words.startswith("No variant passed its gate: nothing ships")
    assert "cpu-fp32 missed its gate on" in words and "cpu-int8 missed its gate on" in words


def test_a_static_int8_variant_says_what_it_is_made_of_and_where_it_cannot_serve() -> None:
    """An image int8 record (components/core/quantization/static_int8.py): the report names its weight width,
    calibration, bias correction, the kernels ONNX Runtime runs, the layers kept in float with their
    cost and the speed-up over fp32; 8-bit weights are not served where int8 kernels saturate."""
    from dataclasses import replace

    from ortpack.components.core.report.page import int8_search_sections

    export, records = recorded_build()
    static = {
        "recipe": "s8",
        "candidate": "s8+1fp32",
        "rule": "the first candidate within the int8 gate, in order of fewest layers kept in float",
        "candidates": {
            "s8": {"quality": {"top1_agreement": 0.8}, "passed": False, "misses": ["top1 0.8"], "float_layers": 0},
            "s8+1fp32": {"quality": {"top1_agreement": 0.9}, "passed": True, "misses": [], "float_layers": 1},
        },
        "weight_bits": 8,
        "bias_correction": True,
        "calibration": "min/max over 32 images",
        "float_layers": {"net/stem/Conv": 0.0081},
        "kernels": {"int8": {"QLinearConv": 52}, "float": {"Conv": 1}, "dequantized_float": []},
    }
    records = [
        replace(r, built=replace(r.built, metrics={**r.built.metrics, "int8": static}))
        if r.built.precision == "int8"
        else r
        for r in records
    ]
    words = _text(" ".join(int8_search_sections(records)))
    assert "8-bit weights (exact where the CPU sums u8 x s8 without saturation: VNNI, AMX" in words
    assert "activations uint8, min/max over 32 images; biases corrected" in words
    assert "int8 kernels 52 QLinearConv; float compute 1 Conv; float compute fed by dequantized weights: 0" in words
    assert "Kept in float (1, the most sensitive first" in words and "net/stem/Conv (0.0081)" in words
    assert re.search(r"Speed-up over the fp32 variant \(p50\): [0-9.]+× at batch 1 × 16 tokens", words)
    # the shipped candidate, its float layers, its number
    assert "s8 0 0.8000 top1 0.8 s8+1fp32 1 0.9000 shipped" in words
    avx2 = _text(verdict_box(export, records))
    assert "cpu-int8 not on this CPU: its 8-bit int8 weights were proven where u8 x s8 products sum exactly" in avx2
