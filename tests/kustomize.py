"""deploy/'s Kustomize directories rendered without kustomize: the subset deploy/ uses (resources,
components, JSON 6902 patches with a target); anything else fails, so deploy/ stays renderable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from tests import ROOT

DEPLOY = ROOT / "deploy"


def load_objects(path: Path) -> list[dict[str, Any]]:
    objects = [obj for obj in yaml.safe_load_all(path.read_text()) if obj]
    assert objects, f"{path.relative_to(ROOT)}: no objects"
    for obj in objects:
        assert isinstance(obj, dict) and {"apiVersion", "kind", "metadata"} <= set(obj), (
            f"{path.relative_to(ROOT)}: not a Kubernetes object: {str(obj)[:120]}"
        )
    return objects


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    wanted = {"group": group, "version": version, "kind": obj["kind"], "name": obj["metadata"]["name"]}
    unknown = set(target) - set(wanted)
    assert not unknown, f"patch target fields this renderer does not support: {sorted(unknown)}"
    return all(wanted[key] == value for key, value in target.items())


def render(directory: Path, extra_components: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """What `kubectl kustomize DIRECTORY` gives, for the subset of Kustomize that deploy/ uses.

    Supported: `resources` (files and directories), `components`, and `patches` of JSON 6902
    operations with a `target`. Anything else fails here, so deploy/ stays renderable by this test.
    """
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(spec) - {"apiVersion", "kind", "resources", "components", "patches"}
    assert not unsupported, f"{directory.relative_to(ROOT)}: kustomization fields not rendered here: {unsupported}"
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        objects += render(path) if path.is_dir() else load_objects(path)
    for component in [*(directory / c for c in spec.get("components", [])), *extra_components]:
        component_spec = yaml.safe_load((component / "kustomization.yaml").read_text())
        assert component_spec["kind"] == "Component", f"{component}: not a Kustomize Component"
        objects = _apply_patches(component.resolve(), component_spec, objects)
    return _apply_patches(directory, spec, objects)


def _apply_patches(directory: Path, spec: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for patch in spec.get("patches", []):
        operations = yaml.safe_load((directory / patch["path"]).read_text())
        assert isinstance(operations, list), f"{patch['path']}: not a JSON 6902 patch (a list of operations)"
        hits = [i for i, obj in enumerate(objects) if _matches(obj, patch["target"])]
        assert len(hits) == 1, f"{patch['path']}: target {patch['target']} matches {len(hits)} objects"
        objects[hits[0]] = jsonpatch.apply_patch(objects[hits[0]], operations)  # test ops raise on mismatch
    return objects
