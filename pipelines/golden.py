"""Compile the pipeline, and regenerate the golden files that guard its interface:
`python -m ortpack.pipelines.golden` (`make golden`).

- `pipelines/package_model.yaml`: the compiled pipeline with the default graph options (the cpu
  target only: cuda is off by default; CI checks that compiling gives these exact bytes);
- `tests/golden/component_io.json`: each component's inputs and outputs (names and types).

`compile_pipeline` is what `ortpack compile` and `ortpack submit` both call, so a submitted run
is exactly the YAML `compile` writes for the same options.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "pipelines" / "package_model.yaml"
COMPONENT_IO = ROOT / "tests" / "golden" / "component_io.json"


@dataclass(frozen=True, kw_only=True)
class GraphOptions:
    """What shapes the compiled YAML (everything else is a run-time parameter)."""

    targets: tuple[str, ...] = ("cpu",)
    image: str | None = None  # None: ortpack.components.container_images.COMPONENT_IMAGE
    gpu_image: str | None = None  # None: ortpack.components.container_images.GPU_COMPONENT_IMAGE
    steps_image: str | None = None  # None: ortpack.components.container_images.steps_image_for(image)
    model_pvc: str | None = None
    gpu_timeout_s: int = 2 * 3600  # ortpack.pipelines.package_model.GPU_TIMEOUT_S
    cache: bool = True  # False: no step is served from cache (--no-cache)


def component_io() -> dict[str, Any]:
    from ortpack.components.benchmark import benchmark_variant
    from ortpack.components.export import export_model
    from ortpack.components.optimize import optimize_variant
    from ortpack.components.package import check_gate, package_bundle, publish_bundle
    from ortpack.components.source import resolve_source
    from ortpack.components.validate import validate_variant

    out: dict[str, Any] = {}
    components = (
        resolve_source,
        export_model,
        optimize_variant,
        validate_variant,
        benchmark_variant,
        package_bundle,
        check_gate,
        publish_bundle,
    )
    for component in components:
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


def build_pipeline(options: GraphOptions | None = None) -> Any:
    from ortpack.pipelines.package_model import make_pipeline

    o = options or GraphOptions()
    return make_pipeline(
        o.targets,
        image=o.image,
        gpu_image=o.gpu_image,
        steps_image=o.steps_image,
        model_pvc=o.model_pvc,
        gpu_timeout_s=o.gpu_timeout_s,
        cache=o.cache,
    )


def compile_pipeline(path: Path, options: GraphOptions | tuple[str, ...] | None = None) -> None:
    """Compile the pipeline for `options` (or just a tuple of targets) to `path`."""
    from kfp import compiler

    if isinstance(options, tuple):
        options = GraphOptions(targets=options)
    compiler.Compiler().compile(build_pipeline(options), str(path))


def pipeline_parameters(options: GraphOptions | None = None) -> set[str]:
    """The run-time parameters of the pipeline these options compile."""
    return set(build_pipeline(options).component_spec.inputs or {})


def main() -> int:
    compile_pipeline(COMPILED)
    COMPONENT_IO.parent.mkdir(parents=True, exist_ok=True)
    COMPONENT_IO.write_text(json.dumps(component_io(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {COMPILED.relative_to(ROOT)} and {COMPONENT_IO.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
