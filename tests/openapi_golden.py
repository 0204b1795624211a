"""The OpenAPI document each task's server registers, as golden files (tests/golden/openapi-<task>.json):
`python -m tests.openapi_golden` rewrites them; tests/serving/test_routes.py checks them.

Each document comes from the task's real runtime (its routes and schemas) opened on a synthetic
manifest (tests/golden/openapi-<case>.manifest.json) with a tiny tokenizer and no model session:
routes and schemas do not depend on weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"

_VARIANT = {
    "id": "cpu-fp32",
    "target": "cpu",
    "execution_providers": ["CPUExecutionProvider"],
    "precision": "fp32",
    "file": "variants/cpu-fp32/model.onnx",
    "ort_version": "1.0",
    "opset": 17,
    "offline_optimization_level": "extended",
    "optimize": {"nodes_before": 1, "nodes_after": 1, "mb": 0.0, "seconds": 0.0},
    "parity": {"passed": True, "validated_on": "CPUExecutionProvider", "samples": 1, "thresholds": {}, "values": {}},
}


def _cases() -> list[str]:
    """Every case with its manifest fields in tests/golden/openapi-<case>.manifest.json (the
    task's section, inputs and outputs): a task adds its own files, no list to edit."""
    return sorted(
        p.name.removeprefix("openapi-").removesuffix(".manifest.json") for p in GOLDEN.glob("*.manifest.json")
    )


# document name -> manifest fields (beyond the common ones)
CASES: dict[str, dict[str, Any]] = {
    case: json.loads((GOLDEN / f"openapi-{case}.manifest.json").read_text()) for case in _cases()
}


_TEMPLATE = b"{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _tokenizer_json() -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hello": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str().encode()


def document(case: str) -> dict[str, Any]:
    from ortpack.kernel.bundle import Manifest
    from ortpack.kernel.engines import open_engine
    from ortpack.serving.app import openapi_for
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.service import engine_options
    from ortpack.serving.tasks import LoadContext, get_task

    fields = {
        "schema_version": 3,
        "name": "model",
        "version": "1",
        "source": {"kind": "huggingface", "id": "model"},
        "variants": [_VARIANT],
        "created_at": "2026-01-01T00:00:00Z",
        **CASES[case],
    }
    manifest = Manifest.model_validate(fields)
    config = ServeConfig(bundle="golden")
    # the tokenizer, and any other shared file a task reads (a chat template)
    files = {name: _TEMPLATE for name in manifest.task_settings.shared_files()}
    files["tokenizer.json"] = _tokenizer_json()
    # routes and schemas do not need the model: an engine without a session
    engine = open_engine(manifest, None, files, variant=manifest.variants[0], options=engine_options(config))
    context = LoadContext(manifest=manifest, variant=manifest.variants[0], engine=engine, config=config)
    runtime = get_task(manifest.task).open(context)
    return openapi_for(runtime, manifest, manifest.name)


def path_of(case: str) -> Path:
    return GOLDEN / f"openapi-{case}.json"


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main() -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        path_of(case).write_text(render(document(case)))
        print(f"wrote {path_of(case).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
