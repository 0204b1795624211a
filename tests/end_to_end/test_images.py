"""The component and serving Dockerfiles, read without an engine (tests/end_to_end/test_containers.py builds
and runs them): their pins agree with pyproject.toml and components/container_images.py, TORCH=cpu takes torch
from the CPU wheel index and refuses CUDA packages, no step installs anything at run time."""

from __future__ import annotations

import re
import tomllib

from tests import ROOT


def _arg(dockerfile: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", (ROOT / dockerfile).read_text(), re.M)
    assert match, f"{dockerfile} has no ARG {name}"
    return match.group(1)


def _extra(name: str) -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]


def _pin(requirements: list[str], package: str) -> str:
    (found,) = [r for r in requirements if re.match(rf"^{package}(\[[^\]]*\])?==", r)]
    return found.split("==")[1]


def test_component_image_pins_match_the_project() -> None:
    from ortpack.components.container_images import GPU_ORT_VERSION, ORT_VERSION

    export = _extra("export")
    assert _arg("Dockerfile.component", "TORCH_VERSION") == _pin(export, "torch")
    assert _arg("Dockerfile.component", "TORCHVISION_VERSION") == _pin(export, "torchvision")
    assert _pin(export, "onnxruntime") == ORT_VERSION
    assert _arg("Dockerfile.component", "ORT_GPU_VERSION") == GPU_ORT_VERSION == _pin(_extra("gpu"), "onnxruntime-gpu")
    assert _arg("Dockerfile.serve", "ORT_GPU_VERSION") == GPU_ORT_VERSION


def test_cpu_flavour_takes_cpu_torch_and_refuses_cuda_packages() -> None:
    text = (ROOT / "Dockerfile.component").read_text()
    assert _arg("Dockerfile.component", "FLAVOUR") == "cpu"
    assert _arg("Dockerfile.component", "TORCH") == "cpu"
    assert _arg("Dockerfile.component", "TORCH_CPU_INDEX") == "https://download.pytorch.org/whl/cpu"
    cpu = text[text.index('if [ "${TORCH}" = "cpu" ]') : text.index('elif [ "${TORCH}" = "pypi" ]')]
    assert '--index-url "${TORCH_CPU_INDEX}"' in cpu
    assert '"torch==${TORCH_VERSION}+cpu" "torchvision==${TORCHVISION_VERSION}+cpu"' in cpu
    assert "grep -i -E '^(nvidia-|triton=)'" in cpu and "exit 1" in cpu
    # torch is installed before the extras, so `torch==2.14.1` is already satisfied by 2.14.1+cpu
    assert text.index("+cpu") < text.index('".[export,image,kfp,sign,oci,s3]"')


def test_the_component_image_has_no_serving_side() -> None:
    """The steps run the kernel's engines, never the server: no serve extra (starlette, uvicorn),
    and the serving floor is not copied in (its link in ortpack/ dangles, so it is not installed)."""
    text = (ROOT / "Dockerfile.component").read_text()
    extras = re.search(r'pip install --no-cache-dir "\.\[([^\]]+)\]"', text)[1].split(",")  # type: ignore[index]
    assert "serve" not in extras and {"export", "image", "kfp"} <= set(extras)
    assert "COPY serving" not in text and "COPY kernel ./kernel" in text


def test_steps_install_nothing_at_run_time() -> None:
    """install_kfp_package=False: the image must carry the compiler's kfp."""
    import kfp

    assert _pin(_extra("kfp"), "kfp") == kfp.__version__
    assert (
        "kfp"
        in re.search(r'pip install --no-cache-dir "\.\[([^\]]+)\]"', (ROOT / "Dockerfile.component").read_text())[1]
    )


def test_serving_image_installs_verification_and_registries_by_default() -> None:
    extras = _arg("Dockerfile.serve", "EXTRAS").split(",")
    assert {"serve", "sign", "oci", "image"} <= set(extras)
    assert _arg("Dockerfile.serve", "FLAVOUR") == "cpu"
