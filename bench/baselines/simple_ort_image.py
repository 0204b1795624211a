"""A simple FastAPI + ONNX Runtime image classifier: one session call per request, no batching.

    BUNDLE=dist/mobilenet_v3_small uvicorn bench.baselines.simple_ort_image:app --workers 2 --port 8004

What a user who already has ortpack's graph (preprocessing inside it) would write by hand: Pillow
decodes the base64 JPEG at full size, the bundle's variant runs it with one intra-op thread per
worker (two workers: the strongest simple configuration on two cores, as for text), and the top 5
come back, like `POST /v1/classify/json`. The published comparison's "simple ONNX Runtime server".
"""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel

from bench.baselines.plain_session import plain_session

BUNDLE = Path(os.environ.get("BUNDLE", "dist/mobilenet_v3_small"))
VARIANT = os.environ.get("VARIANT", "cpu-fp32")
manifest = json.loads((BUNDLE / "manifest.json").read_text())
labels = manifest["task_settings"].get("labels") or [f"class_{i}" for i in range(1000)]
session = plain_session(BUNDLE, VARIANT)
app = FastAPI()


class ImageRequest(BaseModel):
    image: str
    top_k: int = 5


@app.post("/v1/classify/json")
def classify(request: ImageRequest) -> dict:
    image = Image.open(io.BytesIO(base64.b64decode(request.image))).convert("RGB")
    probabilities = session.run(None, {"images": np.asarray(image)[None]})[0][0]
    top = np.argsort(probabilities)[::-1][: request.top_k]
    return {"predictions": [{"label": labels[i], "index": int(i), "score": float(probabilities[i])} for i in top]}


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}
