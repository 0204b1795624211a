"""Every supported encoder family, from a raw tiny random-weight checkpoint (no sentence-transformers
config, so the exporter's defaults apply): export, the fp32 gate, one embedding through the real
server; int8 for two families; and what cannot work refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from ortpack.components.core.exporters.families import FAMILIES, supported_model_types
from tests.servers import running_server

MAX_POSITION = 128  # the tiny checkpoints' max_position_embeddings
# int8 is built for one family of each exporter + fuser pair (fp32 for every family)
INT8_FAMILIES = ("roberta", "modernbert")


@dataclass(frozen=True)
class Built:
    model_type: str
    checkpoint: Path
    export: Path
    variants: dict[str, Path]


def _build(model_type: str, root: Path) -> Built:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for
    from tests.models import make_tiny_encoder

    checkpoint = make_tiny_encoder(model_type, root / "checkpoint", max_position=MAX_POSITION)
    name = f"tiny-{model_type.replace('_', '-')}"
    export_model(ExportSpec(source=str(checkpoint), task="text-embedding", name=name), root / "export")
    variants = {}
    for precision in ("fp32", "int8") if model_type in INT8_FAMILIES else ("fp32",):
        variant = VariantSpec(target="cpu", precision=precision)
        optimize_model(root / "export", variant, root / variant.id)
        validate_variant(root / variant.id, root / "export", thresholds_for("text-embedding", precision))
        variants[precision] = root / variant.id
    return Built(model_type=model_type, checkpoint=checkpoint, export=root / "export", variants=variants)


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.slow) for f in supported_model_types()])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """One family's export and cpu-fp32 variant, shared by the tests of that family (pytest runs
    a module-scoped parameter's tests together, so one family's files exist at a time)."""
    root = tmp_path_factory.mktemp(str(request.param))
    yield _build(str(request.param), root)
    shutil.rmtree(root, ignore_errors=True)


def test_export_follows_the_family_config(built: Built) -> None:
    import onnx
    from transformers import AutoConfig

    from ortpack.components.core.artifacts import ExportResult

    family = FAMILIES[built.model_type]
    config = AutoConfig.from_pretrained(built.checkpoint, trust_remote_code=False)
    export = ExportResult.load(built.export)
    assert export.task_settings["tokenizer"] is not None
    # the length the family's positions allow: RoBERTa-style ids start at pad_token_id + 1
    offset = int(config.pad_token_id) + 1 if family.positions == "padding-offset" else 0
    assert export.task_settings["tokenizer"]["max_length"] == MAX_POSITION - offset
    # inputs: exactly what the graph takes, token types only where the model reads them
    graph = onnx.load(str(built.export / "model.onnx"), load_external_data=False)
    graph_inputs = [i.name for i in graph.graph.input]
    expected = ["input_ids", "attention_mask"] + (["token_type_ids"] if family.takes_token_type_ids(config) else [])
    assert graph_inputs == expected
    assert export.task_settings["tokenizer"]["model_input_names"] == expected
    assert export.model_info["exporter"] == family.exporter
    # the pooling block is named as fp16 conversion expects, whichever exporter wrote it
    assert any(node.name.startswith("/pooling/") for node in graph.graph.node)
    assert export.opset == (17 if family.exporter == "torchscript" else 18)
    ref = np.load(built.export / "reference.npz")
    # the validation set's long paragraphs are truncated at exactly the family's limit
    assert int(ref["lengths"].max()) == export.task_settings["tokenizer"]["max_length"]
    out = ref["outputs"]
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    sims = out @ out.T
    assert sims[np.triu_indices(len(out), 1)].min() < 0.9, "random-weight model collapsed: every sentence alike"
    assert len(np.unique(out.round(4), axis=0)) >= 0.95 * len(np.unique(ref["input_ids"], axis=0))


def test_variants_are_fused_and_pass_their_gates(built: Built) -> None:
    from ortpack.components.core.artifacts import OptimizeResult, ParityReport

    family = FAMILIES[built.model_type]
    for precision, vdir in built.variants.items():
        optimized = OptimizeResult.load(vdir)
        report = ParityReport.load(vdir)
        assert report.misses == [], (precision, report.misses)
        assert optimized.metrics["fuser"] == family.fuser
        assert optimized.metrics["fusions"], f"{family.fuser} fused nothing"
        assert optimized.metrics["nodes_after"] < optimized.metrics["nodes_before"]
    assert ParityReport.load(built.variants["fp32"]).values["max_abs_diff"] < 1e-5
    if "int8" in built.variants:
        ops = OptimizeResult.load(built.variants["int8"]).metrics["ops_after"]
        assert sum(ops.get(op, 0) for op in ("MatMulInteger", "DynamicQuantizeMatMul", "QAttention")) > 0


def test_serves_one_embedding(built: Built, tmp_path: Path) -> None:
    from ortpack.components.core.benchmark import benchmark_variant
    from ortpack.components.core.package import package_dirs

    benchmark_variant(built.variants["fp32"], built.export, budget_s=0.05)
    bundle = tmp_path / "bundle"
    manifest = package_dirs(built.export, [built.variants["fp32"]], bundle)
    ref = np.load(built.export / "reference.npz")
    texts = [str(t) for t in ref["texts"]]
    i = next(k for k, t in enumerate(texts) if len(t.split()) > 12 and not t.isascii())  # a longer, non-ASCII one
    with running_server(bundle, "--variant", "cpu-fp32", "--warmup", "false", log_dir=tmp_path) as server:
        response = httpx.post(
            f"{server.url}/v1/embeddings",
            json={"model": manifest.name, "input": texts[i], "encoding_format": "float"},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    embedding = np.array(response.json()["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(embedding, ref["outputs"][i], atol=1e-4)  # PyTorch's, through HTTP


# --- what cannot work is refused in one line, through the CLI ---


def _export_cli(model: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", "export", "--model", str(model), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ortpack: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow
def test_encoder_decoder_is_refused(tmp_path: Path) -> None:
    from tests.models import make_tiny_bert

    t5 = make_tiny_bert(tmp_path / "tiny-t5", model_type="t5")
    line = _assert_refused(_export_cli(t5, tmp_path / "out"), "t5 is an encoder-decoder model")
    assert all(f in line for f in supported_model_types())  # names every supported family
    assert not (tmp_path / "out" / "model.onnx").exists()


@pytest.mark.slow
def test_unknown_model_type_is_refused(tiny_bert: Path, tmp_path: Path) -> None:
    model = tmp_path / "unknown"
    shutil.copytree(tiny_bert, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "made_up_encoder"}))
    _assert_refused(_export_cli(model, tmp_path / "out"), "unsupported architecture 'made_up_encoder'", "bert")


@pytest.mark.parametrize(
    ("model_type", "fragments"),
    [
        # a model_type transformers does not ship: only its own code could load it
        ("custom_bert", ("auto_map", "never runs")),
        # nomic-bert style: custom code under a model_type transformers now ships natively; the
        # native class is used, and weights written for the custom code do not fit it
        ("nomic_bert", ("does not match the nomic_bert architecture",)),
    ],
)
@pytest.mark.slow
def test_custom_code_is_never_run(model_type: str, fragments: tuple[str, ...], tiny_bert: Path, tmp_path: Path) -> None:
    """A checkpoint that brings its own modeling code (auto_map): refused in one line, and its
    code is never imported."""
    model = tmp_path / "custom"
    shutil.copytree(tiny_bert, model)
    marker = tmp_path / "custom-code-ran"
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    for name in ("configuration_custom.py", "modeling_custom.py"):
        (model / name).write_text(code)
    config = json.loads((model / "config.json").read_text())
    config.update(
        model_type=model_type,
        auto_map={"AutoConfig": "configuration_custom.Config", "AutoModel": "modeling_custom.Model"},
    )
    (model / "config.json").write_text(json.dumps(config))
    _assert_refused(_export_cli(model, tmp_path / "out"), *fragments)
    assert not marker.exists()


def test_weights_of_another_architecture_are_refused(tiny_bert: Path, tmp_path: Path) -> None:
    """Weights that do not fit the config's architecture would load as random values: refused."""
    from ortpack.components.core.errors import ModelLoadError
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec
    from tests.models import make_tiny_encoder

    model = tmp_path / "mismatch"
    shutil.copytree(tiny_bert, model)
    other = make_tiny_encoder("distilbert", tmp_path / "distilbert")
    shutil.copyfile(other / "config.json", model / "config.json")  # distilbert config, BERT weights
    with pytest.raises(ModelLoadError, match=r"does not match the distilbert architecture: \d+ weights missing"):
        export_model(ExportSpec(source=str(model), task="text-embedding", name="mismatch"), tmp_path / "out")
