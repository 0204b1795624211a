"""The published image baseline: a naive PyTorch + FastAPI classifier, one model call per request.

    NAIVE_WEIGHTS=... uvicorn bench.baselines.naive_image:app --workers 2 --port 8003

Decodes the base64 JPEG with Pillow, applies torchvision's transforms (Resize, CenterCrop,
ToTensor, Normalize), runs the model and answers the top 5, like `POST /v1/classify/json`.
NAIVE_IMAGE_MODEL names the model as `--model` does (a torchvision name, default
mobilenet_v3_small, or PACKAGE.MODULE:FACTORY); NAIVE_PREPROCESSING (JSON: resize_size,
crop_size, interpolation, mean, std) overrides a torchvision model's own transforms and is needed
for the others.
"""

from __future__ import annotations

import base64
import importlib
import io
import json
import os

import torch
import torchvision
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel
from torchvision import transforms

NAME = os.environ.get("NAIVE_IMAGE_MODEL", "mobilenet_v3_small")
WEIGHTS = os.environ["NAIVE_WEIGHTS"]
if ":" in NAME:
    module, _, factory = NAME.partition(":")
    model = getattr(importlib.import_module(module), factory)()
    labels = [f"class_{i}" for i in range(1000)]
    pre = json.loads(os.environ["NAIVE_PREPROCESSING"])
else:
    preset = torchvision.models.get_model_weights(NAME).DEFAULT
    model = torchvision.models.get_model(NAME, weights=None)
    labels = preset.meta["categories"]
    transforms_ = preset.transforms()
    pre = {
        "resize_size": transforms_.resize_size[0],
        "crop_size": transforms_.crop_size[0],
        "interpolation": transforms_.interpolation.value,
        "mean": transforms_.mean,
        "std": transforms_.std,
        **json.loads(os.environ.get("NAIVE_PREPROCESSING", "{}")),
    }
if WEIGHTS.endswith(".safetensors"):
    from safetensors.torch import load_file

    model.load_state_dict(load_file(WEIGHTS))
else:
    model.load_state_dict(torch.load(WEIGHTS, map_location="cpu", weights_only=True))
model.eval()
preprocess = transforms.Compose(
    [
        transforms.Resize(pre["resize_size"], interpolation=transforms.InterpolationMode(pre["interpolation"])),
        transforms.CenterCrop(pre["crop_size"]),
        transforms.ToTensor(),
        transforms.Normalize(pre["mean"], pre["std"]),
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
