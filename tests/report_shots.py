"""Reports from real step records, and screenshots of them in headless Chromium.

`tests/data/report_minilm/` holds the step records (export.json; optimize, parity and benchmark
JSON per variant, per-item lists shortened) of a real all-MiniLM-L6-v2 build on a 2-core AVX2
machine, and (missed-int8/) the parity record of all-mpnet-base-v2's int8 variant, which missed its gate. The
scenarios below derive the other cases from them: the int8 variant missed, the timings taken
under load, and a cuda variant this machine cannot run.

    python -m tests.report_shots [--report FILE.html ...] [--out build/report-shots]

renders every scenario's report.html (or takes the given ones) and writes a 1280x900 screenshot
of each first screen (`make report-shots`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from ortpack.components.core.artifacts import BenchmarkResult, ExportResult, ParityReport, VariantRecord
from ortpack.components.core.timing import LoadRecord, LoadSample

FIXTURE = Path(__file__).parent / "data" / "report_minilm"
Build = tuple[ExportResult, list[VariantRecord]]
WINDOW = "1280,900"


def recorded_build() -> Build:
    """The MiniLM build as recorded: cpu-fp32 and cpu-int8 both passed, int8 the faster."""
    variants = sorted((FIXTURE / "variants").iterdir())
    return ExportResult.load(FIXTURE / "export"), [VariantRecord.load(d) for d in variants]


def _with_parity(rec: VariantRecord, parity: ParityReport) -> VariantRecord:
    return replace(rec, parity=replace(parity, variant_id=rec.variant_id), benchmark=None)


def int8_missed() -> Build:
    """cpu-int8 with all-mpnet-base-v2's int8 numbers: it missed its gate and was not measured."""
    export, records = recorded_build()
    missed = ParityReport.load(FIXTURE / "missed-int8")
    return export, [_with_parity(r, missed) if r.built.precision == "int8" else r for r in records]


def nothing_passed() -> Build:
    """Every variant with all-mpnet-base-v2's int8 numbers: none passed, nothing ships."""
    export, records = recorded_build()
    missed = ParityReport.load(FIXTURE / "missed-int8")
    return export, [_with_parity(r, missed) for r in records]


def loaded(runnable: float = 6.0, cpus: int = 2) -> LoadRecord:
    """A measurement with `runnable` other tasks runnable before and after it."""
    sample = LoadSample(load_1min=runnable + 0.3, runnable=runnable)
    return LoadRecord(cpus=cpus, before=sample, after=sample)


def _measured_under(bench: BenchmarkResult, load: LoadRecord) -> BenchmarkResult:
    shapes = {shape: stats | load.as_stats() for shape, stats in bench.shapes.items()}
    return replace(bench, shapes=shapes)


def under_load() -> Build:
    """The recorded build, its variants timed with 3 other runnable tasks per core, PyTorch quiet."""
    export, records = recorded_build()
    quiet = loaded(runnable=0.0)
    torch = {shape: stats | quiet.as_stats() for shape, stats in export.torch_latency.items()}
    export = replace(export, torch_latency=torch)
    return export, [replace(r, benchmark=_measured_under(r.benchmark, loaded())) if r.benchmark else r for r in records]


def with_gpu_variant() -> Build:
    """The recorded build plus a cuda-fp16 variant that passed on the CPU provider (off target)."""
    export, records = recorded_build()
    fp32 = next(r for r in records if r.built.precision == "fp32")
    built = replace(
        fp32.built,
        variant_id="cuda-fp16",
        target="cuda",
        precision="fp16",
        execution_providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    parity = replace(fp32.parity, variant_id="cuda-fp16", off_target=True)
    return export, [*records, replace(fp32, built=built, parity=parity, benchmark=None)]


SCENARIOS = {
    "recorded": recorded_build,
    "int8-missed": int8_missed,
    "under-load": under_load,
    "gpu-variant": with_gpu_variant,
    "nothing-passed": nothing_passed,
}


def render(name: str, out_dir: Path) -> Path:
    """Write scenario `name`'s report.html into `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    from ortpack.components.core.report import render_html

    export, records = SCENARIOS[name]()
    path = out_dir / f"{name}.html"
    path.write_text(render_html(export, records, {**export.versions}), encoding="utf-8")
    return path


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise SystemExit("no chromium here: `make report-shots` installs it (apt-get install -y chromium)")
    return found


def screenshot(report: Path, png: Path) -> Path:
    """The first screen of `report` at 1280x900, as Chromium renders it."""
    subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",  # root in a container
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={png}",
            f"--window-size={WINDOW}",
            report.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="append", type=Path, help="a report.html to shoot (default: the scenarios)")
    parser.add_argument("--out", type=Path, default=Path("build/report-shots"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reports = args.report or [render(name, args.out) for name in SCENARIOS]
    for i, report in enumerate(reports):
        stem = report.stem if not args.report else f"{i}-{report.parent.name}-{report.stem}"
        print(screenshot(report, args.out / f"{stem}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
