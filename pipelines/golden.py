"""Regenerate the golden files that guard the pipeline interface: `python -m pipelines.golden`.

- `pipelines/package_model.yaml`: the compiled pipeline for every target (CI checks that
  compiling gives these exact bytes);
- `tests/golden/component_io.json`: each component's inputs and outputs (names and types).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "pipelines" / "package_model.yaml"
COMPONENT_IO = ROOT / "tests" / "golden" / "component_io.json"


def component_io() -> dict[str, Any]:
    from components.benchmark import benchmark_variant
    from components.export import export_model
    from components.optimize import optimize_variant
    from components.package import package_bundle
    from components.validate import validate_variant

    out: dict[str, Any] = {}
    for component in (export_model, optimize_variant, validate_variant, benchmark_variant, package_bundle):
        spec = component.component_spec
        out[spec.name] = {
            "inputs": {
                k: {"type": v.type, "optional": v.optional, "default": v.default}
                for k, v in sorted((spec.inputs or {}).items())
            },
            "outputs": {k: v.type for k, v in sorted((spec.outputs or {}).items())},
            "image": spec.implementation.container.image if spec.implementation.container else None,
        }
    return out


def compile_pipeline(path: Path, targets: tuple[str, ...] | None = None) -> None:
    from kfp import compiler

    from pipelines.package_model import ALL_TARGETS, make_pipeline

    compiler.Compiler().compile(make_pipeline(targets or ALL_TARGETS), str(path))


def main() -> int:
    compile_pipeline(COMPILED)
    COMPONENT_IO.parent.mkdir(parents=True, exist_ok=True)
    COMPONENT_IO.write_text(json.dumps(component_io(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {COMPILED.relative_to(ROOT)} and {COMPONENT_IO.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
