"""The container images, measured: size (installed, and what a registry stores and a node pulls:
the compressed layers), what a node pulls for one pipeline run, and each serving image's cold
start (`run` to /v2/health/ready answering 200, every check on) for each bundle.

    python bench/container_images.py --bundle dist/mobilenet_v3_small --bundle dist/all-MiniLM-L6-v2
        [--before localhost/before/ortpack-serve:0.1.0] [--runs 5] [--engine podman]

Needs the images (`make images`) and the bundles (`make run`, `ortpack run --model
mobilenet_v3_small`). `--before TAG` adds an older serving image (e.g. one built from an earlier
commit and tagged so) to the sizes and the starts. The compressed size comes from `save` piped
through gzip (what `push` uploads for these layers, within a few per cent). The starts are
bench/cold_start.py's container mode (deploy/'s options, the images' starts interleaved, the
server's own phases). Prints tables, writes bench/results/images.json.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.cold_start import medians, one_container_start, phase_table  # noqa: E402
from bench.serve_load import table, write_results  # noqa: E402
from ortpack import __version__  # noqa: E402
from ortpack.components.core.timing import LoadWatch  # noqa: E402
from ortpack.kernel.hardware import this_machine  # noqa: E402

CONF = ROOT / "images" / "containers.conf"


def engine_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONF))}


def image_sizes(engine: str, tag: str) -> dict[str, float]:
    """Installed bytes (as the engine reports them) and gzip-compressed bytes of `save`, in MB."""
    inspected = subprocess.run(
        [engine, "image", "inspect", "--format", "{{.Size}}", tag], check=True, capture_output=True, text=True,
        env=engine_env(),
    )  # fmt: skip
    save = subprocess.Popen([engine, "save", tag], stdout=subprocess.PIPE, env=engine_env())
    assert save.stdout is not None
    sink = _Counter()
    with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=6) as out:
        for block in iter(lambda: save.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
            out.write(block)
    if save.wait() != 0:
        raise SystemExit(f"{engine} save {tag} failed")
    return {"installed_mb": int(inspected.stdout.strip()) / 1e6, "compressed_mb": sink.count / 1e6}


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", action="append", help="bundle to start (repeatable; default dist/all-MiniLM-L6-v2)")
    parser.add_argument("--before", action="append", default=[], help="an older serving image to compare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine", default="podman")
    parser.add_argument("--repo", default="ghcr.io/ortpack")
    parser.add_argument("--skip-component", action="store_true", help="do not size the component image (~2 min)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "images.json"))
    args = parser.parse_args()
    bundles = [Path(b) for b in args.bundle or [ROOT / "dist" / "all-MiniLM-L6-v2"]]

    tag = f"{args.repo}/ortpack-%s:{__version__}"
    serving = {**{f"before {i or ''}".strip(): t for i, t in enumerate(args.before)},
               "serve": tag % "serve", "serve-slim": tag % "serve" + "-slim"}  # fmt: skip
    images = {**serving, "steps": tag % "steps"}
    if not args.skip_component:
        images["component"] = tag % "component"
    sizes = {}
    for name, image in images.items():
        sizes[name] = {"image": image, **image_sizes(args.engine, image)}
        print(
            f"{name}: {sizes[name]['installed_mb']:.1f} MB installed, {sizes[name]['compressed_mb']:.1f} MB compressed"
        )

    starts: dict[str, dict[str, list[dict[str, Any]]]] = {b.name: {n: [] for n in serving} for b in bundles}
    with LoadWatch() as load:
        for _ in range(args.runs):
            for bundle in bundles:
                for name, image in serving.items():
                    starts[bundle.name][name].append(one_container_start(args.engine, image, bundle, None))

    rows = [["image", "installed MB", "compressed MB (pulled)"]]
    rows += [[n, f"{s['installed_mb']:.1f}", f"{s['compressed_mb']:.1f}"] for n, s in sizes.items()]
    print("\n" + table(rows))
    pulls = {}
    if "component" in sizes:
        component, steps = sizes["component"]["compressed_mb"], sizes["steps"]["compressed_mb"]
        pulls = {
            "one image for every step (before)": component,
            "one node running every step (after: both images)": component + steps,
            "a node running only torch-free steps (after)": steps,
        }
        print("\nwhat a node pulls for one cpu pipeline run, MB compressed:")
        print(table([["case", "MB"], *([k, f"{v:.0f}"] for k, v in pulls.items())]))
    results: dict[str, Any] = {
        "cpu": this_machine().summary(),
        "engine": args.engine,
        "sizes": sizes,
        "pull_per_run_mb": pulls,
        "load": load.record.as_stats(),
        "cold_start": {},
    }
    for bundle in bundles:
        per = {
            name: {
                "median": {**medians(runs), "run_returned_s": statistics.median(r["run_returned_s"] for r in runs)},
                "runs": runs,
            }
            for name, runs in starts[bundle.name].items()
        }
        results["cold_start"][bundle.name] = per
        print(f"\ncold start of {bundle.name}, median of {args.runs}, `run` to ready:")
        print(phase_table({"servers": per}))
    print(f"\n{this_machine().summary()}; {load.record.describe()}")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
