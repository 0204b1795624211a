"""What the ortpack components run on: one image per flavour, built from Dockerfile.component.

`COMPONENT_IMAGE` is the CPU flavour (CPU-only torch, onnxruntime): resolve and export run on
it; `STEPS_IMAGE` (Dockerfile.steps) is the same code without PyTorch, a tenth of the size, for the
steps that never load a model into PyTorch (the cpu target's optimize, validate and benchmark;
package, gate and publish); `GPU_COMPONENT_IMAGE` the GPU flavour (CUDA torch, onnxruntime-gpu)
the cuda branch runs on. All are build-time constants; `ortpack compile/submit --component-image`
/ `--steps-image` (or ORTPACK_COMPONENT_IMAGE / ORTPACK_STEPS_IMAGE, read by the CLI, never at
import) replace them in the compiled YAML, by tag or pinned by digest (`REPO@sha256:...`: the
backend's cache key then sees the image's content).

`ORT_VERSION` is the onnxruntime the CPU image pins and `GPU_ORT_VERSION` the onnxruntime-gpu the
GPU image pins (PyPI has onnxruntime-gpu only up to 1.31.1, so the GPU flavour differs: its
variants record 1.31.1, and a server running another onnxruntime treats that as a mismatch). The
version is an input of every step whose result depends on it, so KFP's cache key changes when
onnxruntime does (a test checks ORT_VERSION against the installed onnxruntime).
"""

import re

from ortpack import __version__

COMPONENT_IMAGE = f"ghcr.io/ortpack/ortpack-component:{__version__}"
GPU_COMPONENT_IMAGE = f"ghcr.io/ortpack/ortpack-component:{__version__}-gpu"
STEPS_IMAGE = f"ghcr.io/ortpack/ortpack-steps:{__version__}"
ORT_VERSION = "1.32.0"
GPU_ORT_VERSION = "1.31.1"
IMAGE_ENV = "ORTPACK_COMPONENT_IMAGE"
GPU_IMAGE_ENV = "ORTPACK_GPU_COMPONENT_IMAGE"
STEPS_IMAGE_ENV = "ORTPACK_STEPS_IMAGE"

# [HOST[:PORT]/]PATH[:TAG][@sha256:HEX], as Docker's reference grammar has it (lower-case path)
_REFERENCE = re.compile(
    r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def check_image(reference: str) -> str:
    """`reference` if it is a valid image reference with a tag or a digest, else ValueError."""
    reference = reference.strip()
    last = reference.rsplit("/", 1)[-1]
    if not _REFERENCE.match(reference) or (":" not in last and "@" not in last):
        raise ValueError(
            f"bad image reference {reference!r}: expected REPO:TAG or REPO@sha256:<64 hex> (e.g. {COMPONENT_IMAGE})"
        )
    return reference


def gpu_image_for(reference: str) -> str:
    """The GPU flavour of a CPU image given by tag: the same tag with `-gpu` (as `make images`
    tags them). A digest pins one build, so its GPU flavour must be given explicitly."""
    reference = check_image(reference)
    if "@" in reference:
        raise ValueError(
            f"{reference} is pinned by digest: give the GPU image explicitly (--gpu-component-image, {GPU_IMAGE_ENV})"
        )
    return f"{reference}-gpu"


def steps_image_for(reference: str) -> str:
    """The torch-free steps' image beside a component image given by tag: `REPO/ortpack-steps:TAG`
    for `REPO/ortpack-component:TAG` (as `make images` tags them). Any other reference (a digest
    pins one build; another name is another build) is returned as it is: the component image runs
    every step, so a pipeline given only it still runs."""
    reference = check_image(reference)
    repo, _, tag = reference.rpartition(":")
    if "@" not in reference and repo.rsplit("/", 1)[-1] == "ortpack-component":
        return f"{repo[: -len('ortpack-component')]}ortpack-steps:{tag}"
    return reference
