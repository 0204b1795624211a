"""What the simple ONNX Runtime baselines share: the bundle's variant in a plain session."""

from __future__ import annotations

import os
from pathlib import Path

import onnxruntime as ort


def plain_session(bundle: Path, variant: str) -> ort.InferenceSession:
    """`variant`'s model.onnx of `bundle` in a session with ONNX Runtime's defaults on the CPU and
    THREADS (environment, default 1) intra-op threads: what a user would write by hand."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(os.environ.get("THREADS", "1"))
    return ort.InferenceSession(
        str(bundle / "variants" / variant / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
