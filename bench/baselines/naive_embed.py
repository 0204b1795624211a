"""The image-embedding baseline: a naive PyTorch + FastAPI server, one model call per request.

    NAIVE_WEIGHTS=... uvicorn bench.baselines.naive_embed:app --workers 2 --port 8005

EfficientNet-Lite0 (examples/efficientnet_lite.py) with its classifier dropped, the weights from
NAIVE_WEIGHTS: decodes the base64 images of an OpenAI embeddings request with Pillow, applies
torchvision's transforms (Resize 256, CenterCrop 224, ToTensor, Normalize to Lite's
(x * 255 - 127) / 128), runs the model, L2-normalises and answers in OpenAI's shape, like
`POST /v1/embeddings` of an image-embedding bundle.
"""

from __future__ import annotations

import base64
import io
import os

import torch
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel
from torchvision import transforms

from examples.efficientnet_lite import efficientnet_lite0

model = efficientnet_lite0()
model.load_state_dict(torch.load(os.environ["NAIVE_WEIGHTS"], map_location="cpu", weights_only=True))
model._fc = torch.nn.Identity()  # the pooled 1280 features, not ImageNet's classes
model.eval()
preprocess = transforms.Compose(
    [
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize([127 / 255] * 3, [128 / 255] * 3),
    ]
)
app = FastAPI()


class EmbeddingsRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


@app.post("/v1/embeddings")
def embeddings(request: EmbeddingsRequest) -> dict:
    items = [request.input] if isinstance(request.input, str) else request.input
    images = [Image.open(io.BytesIO(base64.b64decode(item.partition(",")[2] or item))).convert("RGB") for item in items]
    with torch.inference_mode():
        vectors = torch.nn.functional.normalize(model(torch.stack([preprocess(im) for im in images])), dim=1)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)],
        "model": "efficientnet-lite0",
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}
