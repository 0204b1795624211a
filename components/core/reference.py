"""The PyTorch reference an export leaves for its family (`reference.npz`), typed.

Every exporter writes PyTorch's outputs on the validation inputs and the names of the graph inputs
they were fed by; image exporters also the encoded files as a client sends them and PyTorch's
outputs on each (the served path). A family reads those through the properties here, and its own
task's arrays (a detector's boxes per file, the texts' lengths) by name, where a missing one is an
error that names the export rather than a bare KeyError. One format, written and read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortpack.components.core.validation_data import CALIBRATION_FILE, pack_files, unpack_files
from ortpack.kernel.images import ImageDecoder

REFERENCE_FILE = "reference.npz"
# What every export writes (the rest is its task's)
REQUIRED = ("task", "outputs", "input_names")


@dataclass(frozen=True)
class Reference:
    """The arrays of one export's reference, read once (an NpzFile decompresses an array again on
    each access: a gate that sliced its reference batch by batch spent 80 % of its time there)."""

    arrays: Mapping[str, np.ndarray]
    where: str = REFERENCE_FILE

    @classmethod
    def load(cls, path: Path) -> Reference:
        with np.load(path, allow_pickle=False) as npz:
            return cls({name: npz[name] for name in npz.files}, str(path))

    @staticmethod
    def write(
        path: Path, arrays: Mapping[str, Any], *, files: list[bytes] | None = None, compress: bool = True
    ) -> None:
        """Write `arrays` (which must hold `REQUIRED`) and, given `files`, the encoded files of the
        served path (`served_offsets`, `served_data`)."""
        missing = [name for name in REQUIRED if name not in arrays]
        if missing:
            raise ValueError(f"a reference needs {', '.join(missing)}")
        out = dict(arrays)
        if files is not None:
            out["served_offsets"], out["served_data"] = pack_files(files)
        (np.savez_compressed if compress else np.savez)(path, allow_pickle=False, **out)

    @property
    def task(self) -> str:
        return str(self["task"])

    @property
    def outputs(self) -> np.ndarray:
        """PyTorch's outputs on the validation inputs (the first output's rows)."""
        return self["outputs"]

    @property
    def input_names(self) -> list[str]:
        return [str(name) for name in self["input_names"]]

    def served_files(self) -> list[bytes]:
        """The encoded validation files as a client sends them (image tasks)."""
        return unpack_files(self["served_offsets"], self["served_data"])

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise KeyError(f"{self.where} has no {name!r} (it holds {', '.join(sorted(self.arrays))})") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.arrays.get(name, default)


def calibration_photos(export_dir: Path) -> list[np.ndarray]:
    """What a detector's or segmenter's static int8 is calibrated on: the user's calibration photos
    beside the export, else the reference's validation files, decoded as the server decodes them
    (a dense model's activations on generated images are not its activations on photos)."""
    decoder = ImageDecoder(max_pixels=1 << 40)
    path = Path(export_dir) / CALIBRATION_FILE
    if path.is_file():
        with np.load(path) as packed:
            files = unpack_files(packed["offsets"], packed["data"])
    else:
        files = Reference.load(Path(export_dir) / REFERENCE_FILE).served_files()
    return [decoder.decode(f, "calibration image") for f in files]
