"""The text-generation task's build side on tiny random decoders (tests/causal_lms.py): each family
exported, built cpu fp32 and gated against PyTorch; GPT-2's Conv1D layers quantized; the layer
groups the int4 search returns to float; the reference, the probe; and what is refused, in one line.

fp32 must match PyTorch's greedy continuations token for token (all 16 prompts x 64 tokens) on every
path the gate runs: prefilled at once, in chunks, and decoded in one left-padded batch. A random
model's greedy continuation is as deterministic as a trained one's, so this proves the cache,
positions, masks and windows of each family, not its quality. bench/generation_coverage.py runs
the same steps over all 17 families, with int4.

Each family is exported once for the module, on first use (`Built`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, InvalidSpecError, ModelLoadError

pytestmark = pytest.mark.slow  # exports, builds and gates a decoder per family

# family -> (key/value heads of the exported cache, whether the graph takes position ids): what the
# family brings that the others do not
COVERED = {
    "llama": (2, True),  # rotary, grouped-query attention (4 query heads share 2)
    "qwen2": (2, True),  # q/k/v biases, a 16-token window on its second layer
    "qwen3": (2, True),  # q/k norms, a head width apart from hidden / heads
    "mistral": (2, True),  # a 16-token window on every layer
    "phi3": (2, True),  # fused qkv and gate/up projections
    "gemma2": (2, True),  # scaled tied embeddings, logit softcapping, alternating windows
    "gpt2": (4, True),  # learned positions, Conv1D layers (Gemm), tied embeddings
    "bloom": (4, False),  # ALiBi: positions come from the mask, the graph takes none
    "granite": (2, True),  # embedding, attention, residual and logit multipliers
    "falcon": (1, True),  # multi-query attention: one key/value head
}
GREEDY_PATHS = ("single", "chunked", "batched")
FAMILY_PARAMS = list(COVERED)


class Built:
    """Each family's tiny checkpoint and raw export, made once per module on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.checkpoints: dict[str, Path] = {}
        self.exports: dict[str, Path] = {}

    def checkpoint(self, model_type: str) -> Path:
        from tests.causal_lms import make_tiny_causal_lm

        if model_type not in self.checkpoints:
            self.checkpoints[model_type] = make_tiny_causal_lm(model_type, self.root / model_type / "checkpoint")
        return self.checkpoints[model_type]

    def export(self, model_type: str) -> Path:
        from ortpack.components.core.export import export_model
        from ortpack.components.core.specs import ExportSpec

        if model_type not in self.exports:
            out = self.root / model_type / "export"
            spec = ExportSpec(
                source=str(self.checkpoint(model_type)), task="text-generation", name=f"tiny-{model_type}"
            )
            export_model(spec, out)
            self.exports[model_type] = out
        return self.exports[model_type]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("decoders"))


def export_with_template(built: Built, template: str, work: Path) -> ExportResult:
    """Export a copy of the tiny Llama whose chat_template.jinja is `template`."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    checkpoint = shutil.copytree(built.checkpoint("llama"), work / "checkpoint")
    (checkpoint / "chat_template.jinja").write_text(template)
    return export_model(ExportSpec(source=str(checkpoint), task="text-generation", name="templated"), work / "export")


# ---------------------------------------------------------------- every family, fp32


@pytest.mark.parametrize("model_type", FAMILY_PARAMS)
def test_each_family_builds_fp32_matching_pytorchs_greedy_continuations(
    built: Built, model_type: str, tmp_path: Path
) -> None:
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    export_dir = built.export(model_type)
    decoder = ExportResult.load(export_dir).task_settings["decoder"]
    assert (decoder["kv_heads"], decoder["position_ids"]) == COVERED[model_type]
    optimize_model(export_dir, VariantSpec(target="cpu", precision="fp32"), tmp_path / "cpu-fp32")
    report = validate_variant(tmp_path / "cpu-fp32", export_dir, thresholds_for("text-generation", "fp32"))
    assert report.passed, report.misses
    assert report.values["greedy_match"] == 1.0
    assert {path: report.values[f"{path}.greedy_match"] for path in GREEDY_PATHS} == dict.fromkeys(GREEDY_PATHS, 1.0)


# ---------------------------------------------------------------- weight-only quantization


def test_gpt2s_gemm_layers_are_rewritten_and_quantized_to_matmulnbits(built: Built, tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort

    from ortpack.components.core.quantization.weight_only import WeightOnly, gemm_to_matmul, quantize_weight_only
    from ortpack.kernel.contracts.text_generation import TextGenerationSettings
    from ortpack.kernel.generation.decoder import Decoder

    raw = built.export("gpt2") / "model.onnx"
    model = onnx.load(str(raw))
    gemms = sum(node.op_type == "Gemm" for node in model.graph.node)
    assert gemms == 8  # c_attn, attn.c_proj, c_fc, mlp.c_proj in each of 2 layers
    assert gemm_to_matmul(model) == gemms
    assert not any(node.op_type == "Gemm" for node in model.graph.node)

    def save(graph: onnx.ModelProto, path: Path) -> None:  # a tiny graph: no data file
        onnx.save(graph, str(path))

    counts = quantize_weight_only(raw, tmp_path / "int4.onnx", WeightOnly(bits=4, block_size=32), save)
    assert counts["gemm_rewritten"] == 8
    assert counts["MatMulNBits"] == 9  # the 8 rewritten layers and the head
    settings = ExportResult.load(built.export("gpt2")).settings()
    assert isinstance(settings, TextGenerationSettings)
    session = ort.InferenceSession(str(tmp_path / "int4.onnx"), providers=["CPUExecutionProvider"])
    assert len(Decoder(session, settings.decoder).greedy([5, 17, 200, 31], 8)) == 8


def test_layer_groups_are_the_head_the_embeddings_and_one_per_block(built: Built) -> None:
    import onnx

    from ortpack.components.core.quantization.weight_only import EMBEDDINGS, HEAD, layer_groups

    model = onnx.load(str(built.export("llama") / "model.onnx"), load_external_data=False)
    groups = layer_groups(model)
    assert set(groups) == {HEAD, EMBEDDINGS, "block 0", "block 1"}
    assert [len(groups[HEAD]), len(groups[EMBEDDINGS])] == [1, 1]
    assert groups[HEAD][0].endswith("lm_head/MatMul")
    for block in ("block 0", "block 1"):  # q, k, v, o, gate, up, down
        assert len(groups[block]) == 7
        assert all(f"/layers.{block[-1]}/" in name for name in groups[block])


# ---------------------------------------------------------------- refusals, one line each


def test_an_encoder_decoder_is_refused(tmp_path: Path) -> None:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec
    from tests.models import make_tiny_bert

    t5 = make_tiny_bert(tmp_path / "t5", model_type="t5")
    with pytest.raises(
        ModelLoadError, match=r"is an encoder-decoder \(t5\); text-generation takes a decoder-only"
    ) as e:
        export_model(ExportSpec(source=str(t5), task="text-generation", name="t5"), tmp_path / "out")
    assert "\n" not in str(e.value)


# transformers loads a BERT checkpoint as BertLMHeadModel (AutoModelForCausalLM maps bert to it; its
# head random), which keeps no key/value cache: refused by what it does, not by its name
def test_an_encoder_is_refused(tmp_path: Path) -> None:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec
    from tests.models import make_tiny_bert

    bert = make_tiny_bert(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match="bert keeps no key/value cache") as e:
        export_model(ExportSpec(source=str(bert), task="text-generation", name="bert"), tmp_path / "out")
    assert "\n" not in str(e.value)


def test_a_checkpoint_asking_for_remote_code_is_refused(built: Built, tmp_path: Path) -> None:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    checkpoint = shutil.copytree(built.checkpoint("llama"), tmp_path / "remote")
    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelLoadError, match=r"asks for remote code \(auto_map in config.json\); ortpack never runs it"
    ):
        export_model(ExportSpec(source=str(checkpoint), task="text-generation", name="remote"), tmp_path / "out")
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_int4_is_refused_for_another_task_naming_it() -> None:
    from ortpack.components.core.specs import BuildSpec, ExportSpec, VariantSpec
    from ortpack.components.core.tasks import check_build_spec

    spec = BuildSpec(
        export=ExportSpec(source="sentence-transformers/all-MiniLM-L6-v2", task="text-embedding", name="minilm"),
        variants=(VariantSpec(target="cpu", precision="fp32"), VariantSpec(target="cpu", precision="int4")),
    )
    with pytest.raises(InvalidSpecError, match=r"task 'text-embedding' has no int4 variant \(it builds fp32"):
        check_build_spec(spec)


# ---------------------------------------------------------------- the reference and the probe


def test_the_reference_holds_16_prompts_and_the_probe_8_of_them_with_32_tokens(built: Built) -> None:
    from ortpack.components.core.reference import Reference
    from ortpack.components.core.tasks.text_generation import GenerationReference, select_probe
    from ortpack.kernel.engines.text_generation import CONTINUATION
    from ortpack.kernel.probe import PROBE_FILE, Probe

    export_dir = built.export("llama")
    export = ExportResult.load(export_dir)
    reference = GenerationReference(Reference.load(export_dir / export.reference_file))
    assert len(reference.prompts) == 16
    assert np.stack(reference.continuations).shape == (16, 64)
    assert reference.top_ids.shape[:2] == reference.top_logp.shape[:2] == (16, 64)

    probe = select_probe(export, export_dir)
    assert (probe.task, probe.kind, len(probe.inputs)) == ("text-generation", "sequences", 8)
    assert len({len(prompt) for prompt, _ in probe.inputs}) > 1  # prompts of different lengths
    for (prompt, continuation), output in zip(probe.inputs, probe.outputs, strict=True):
        row = reference.prompts.index(prompt.tolist())
        np.testing.assert_array_equal(continuation, reference.continuations[row][:32])
        np.testing.assert_array_equal(output[CONTINUATION], continuation)

    for again in (Probe.from_bytes(probe.to_bytes()), Probe.from_bytes((export_dir / PROBE_FILE).read_bytes())):
        assert (again.task, again.kind) == (probe.task, probe.kind)
        for (p, c), (p2, c2) in zip(probe.inputs, again.inputs, strict=True):
            np.testing.assert_array_equal(p, p2)
            np.testing.assert_array_equal(c, c2)
            assert p2.dtype == c2.dtype == np.int64
        for o, o2 in zip(probe.outputs, again.outputs, strict=True):
            np.testing.assert_array_equal(o[CONTINUATION], o2[CONTINUATION])


# ---------------------------------------------------------------- the chat template check

# A template whose text is not a function of the conversation: jinja's `random` filter draws 32
# digits anew at each rendering, so transformers' text is one the kernel cannot give (the odds of
# the same draw are 1e-32). Llama 3's templates are the real-world cousin: they write today's date
# (`strftime_now`), which differs between the two renderings only across midnight.
DRAWN = (
    "{% for _ in range(32) %}{{ '0123456789' | random }}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
REFUSING = "{{ raise_exception('this template takes no conversation') }}"


def test_a_template_transformers_renders_otherwise_than_the_kernel_is_refused(built: Built, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="renders .* to other token ids than transformers' apply_chat_template") as e:
        export_with_template(built, DRAWN, tmp_path)
    assert "\n" not in str(e.value)


def test_a_template_that_refuses_every_conversation_is_shipped_unchecked(built: Built, tmp_path: Path) -> None:
    export = export_with_template(built, REFUSING, tmp_path)
    assert export.model_info["chat_template_checked"] == 0
    assert export.task_settings["chat"]["file"] == "chat_template.jinja"
    assert (tmp_path / "export" / "chat_template.jinja").read_text() == REFUSING
    assert ExportResult.load(built.export("llama")).model_info["chat_template_checked"] == 2  # ChatML: both checked
