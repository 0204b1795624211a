"""Your own image model: `--model PACKAGE.MODULE:FACTORY` (+ `--weights`, a state_dict) and
`--model FILE.pt2` (a torch.export program), each built end to end on a tiny network, and every
way to get them wrong refused in one line before any export work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ortpack.components.core.errors import InvalidSpecError, ModelLoadError
from tests import ROOT
from tests.own_models import TwoInputs, tiny_net

FACTORY = "tests.own_models:tiny_net"


def _export(source: str, tmp_path: Path, **options: object) -> object:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    given = {"crop_size": 64, "resize_size": 72, **options}
    spec = ExportSpec(source=source, task="image-classification", name="own", options=given)
    return export_model(spec, tmp_path / "export")


def _program(tmp_path: Path, module: torch.nn.Module, *args: torch.Tensor, dynamic: bool = True) -> Path:
    shapes = tuple({0: torch.export.Dim("batch")} for _ in args) if dynamic else None
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(module.eval(), args, dynamic_shapes=shapes), path)
    return path


@pytest.mark.slow
def test_a_factory_with_a_state_dict_builds(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    weights = tmp_path / "w.safetensors"
    save_file(tiny_net().state_dict(), str(weights))
    export = _export(FACTORY, tmp_path, weights=str(weights))
    assert export.source["kind"] == "factory" and export.source["id"] == FACTORY
    assert export.source["weights_sha256"] is not None
    assert export.task_settings["labels"] == [f"class_{i}" for i in range(10)]
    assert export.task_settings["preprocessing"]["crop_size"] == 64 and export.task_settings["preprocessing"][
        "mean"
    ] == [0.485, 0.456, 0.406]


@pytest.mark.slow
def test_an_exported_program_builds_and_serves(tmp_path: Path) -> None:
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from ortpack.kernel.bundle import verify_bundle

    path = _program(tmp_path, tiny_net(), torch.zeros(2, 3, 64, 64))
    spec = BuildSpec(
        export=ExportSpec(
            source=str(path), task="image-classification", name="prog", options={"crop_size": 64, "resize_size": 72}
        ),
        variants=tuple(variant_grid(["cpu"], ["fp32"])),
    )
    build_bundle(spec, tmp_path / "dist")
    manifest = verify_bundle(tmp_path / "dist")
    assert manifest.source.kind == "program" and manifest.source.id == "model.pt2"
    assert manifest.source.revision is not None and manifest.source.revision.startswith("sha256:")
    assert manifest.variant("cpu-fp32").parity.passed


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("no_such_package.models:build", "cannot import 'no_such_package.models'"),
        ("tests.no_such_module:build", "cannot import 'tests.no_such_module'"),
        ("tests.own_models:missing", "has no callable 'missing'"),
        ("tests.own_models:not_a_module", "returned a dict, not a torch.nn.Module"),
        ("tests.own_models:broken", "tests.own_models:broken() failed: RuntimeError: the factory needs a GPU"),
        ("tests.own_models:two_inputs", "must take one float tensor [batch, 3, 64, 64]"),
        ("Mobilenet_V3_Small", "did you mean 'mobilenet_v3_small'?"),
    ],
)
def test_a_bad_factory_is_refused_in_one_line(source: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as caught:
        _export(source, tmp_path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "export" / "model.onnx").exists()


def test_a_state_dict_that_does_not_match_names_the_keys(tmp_path: Path) -> None:
    state = tiny_net().state_dict()
    state["head.extra"] = torch.zeros(1)
    del state["features.0.bias"]
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(ModelLoadError, match=r"1 missing \(features\.0\.bias\); 1 unexpected \(head\.extra\)"):
        _export(FACTORY, tmp_path, weights=str(tmp_path / "w.pt"))
    state = tiny_net().state_dict()
    state["head.weight"] = torch.zeros(5, 32)
    torch.save(state, tmp_path / "w2.pt")
    with pytest.raises(ModelLoadError, match=r"head\.weight is \(5, 32\) in the file, \(10, 32\) in the model"):
        _export(FACTORY, tmp_path, weights=str(tmp_path / "w2.pt"))


def test_a_program_with_the_wrong_signature_is_refused(tmp_path: Path) -> None:
    two = _program(tmp_path, TwoInputs(), torch.zeros(2, 3, 8, 8), torch.zeros(2, 3))
    with pytest.raises(ModelLoadError, match=r"model\.pt2 must take one float tensor \[batch, 3, 64, 64\]"):
        _export(str(two), tmp_path)
    fixed = _program(tmp_path, tiny_net(), torch.zeros(1, 3, 64, 64), dynamic=False)
    with pytest.raises(ModelLoadError, match="export it with a dynamic batch"):
        _export(str(fixed), tmp_path)
    with pytest.raises(InvalidSpecError, match="--weights does not apply to an exported program"):
        _export(str(fixed), tmp_path, weights=str(fixed))
    (tmp_path / "junk.pt2").write_bytes(b"not an archive")
    with pytest.raises(ModelLoadError, match="cannot load the exported program"):
        _export(str(tmp_path / "junk.pt2"), tmp_path)


def test_the_cli_refuses_an_unimportable_module_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", "build", "--task", "image-classification",
         "--model", "nowhere.models:net", "--out", str(tmp_path / "x")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot import 'nowhere.models'" in done.stderr, done.stderr


def test_a_factory_bundle_is_named_after_what_it_builds() -> None:
    """A generic factory name (`build`) names nothing: the bundle takes its module's name."""
    from ortpack.components.core.exporters.image_models import ImageSource

    assert ImageSource("factory", "lite0:build").default_name == "lite0"
    assert ImageSource("factory", "examples.efficientnet_lite:create_model").default_name == "efficientnet_lite"
    assert ImageSource("factory", "my_models.effnet:efficientnet_lite0").default_name == "efficientnet_lite0"
