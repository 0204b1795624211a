"""The published image baseline: a naive PyTorch + FastAPI classifier, one model call per request.

    NAIVE_WEIGHTS=... uvicorn bench.baselines.naive_image:app --workers 2 --port 8003

Decodes the base64 JPEG with Pillow, applies torchvision's transforms (Resize, CenterCrop,
ToTensor, Normalize), runs the model and answers the top 5, like `POST /v1/classify/json`.
"""

from __future__ import annotations

import base64
import io
import os

import torch
import torchvision
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel
from safetensors.torch import load_file
from torchvision import transforms

NAME = os.environ.get("NAIVE_IMAGE_MODEL", "mobilenet_v3_small")
weights = torchvision.models.get_model_weights(NAME).DEFAULT
model = torchvision.models.get_model(NAME, weights=None)
model.load_state_dict(load_file(os.environ["NAIVE_WEIGHTS"]))
model.eval()
labels = weights.meta["categories"]
preset = weights.transforms()
preprocess = transforms.Compose(
    [
        transforms.Resize(preset.resize_size[0], interpolation=preset.interpolation),
        transforms.CenterCrop(preset.crop_size[0]),
        transforms.ToTensor(),
        transforms.Normalize(preset.mean, preset.std),
    ]
)
app = FastAPI()


class ClassifyRequest(BaseModel):
    image: str


@app.post("/v1/classify/json")
def classify(request: ClassifyRequest) -> dict:
    image = Image.open(io.BytesIO(base64.b64decode(request.image))).convert("RGB")
    with torch.inference_mode():
        probs = torch.softmax(model(preprocess(image).unsqueeze(0)), dim=1)[0]
    top = torch.topk(probs, 5)
    return {
        "predictions": [
            {"label": labels[i], "index": int(i), "probability": float(p)}
            for p, i in zip(top.values, top.indices, strict=True)
        ]
    }


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}
