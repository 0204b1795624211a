"""The detection baseline: a naive PyTorch + FastAPI YOLOv8 server, one model call per request.

    uvicorn bench.baselines.naive_detect:app --workers 2 --port 8004

What a user writes around the same checkpoint (examples/yolov8.py's `fall_detector`): the body's
image decoded by Pillow, letterboxed to 640 (torch's bilinear resize, padded with 114), the
network, torchvision's class-wise NMS, the boxes mapped back to the image, like `POST /v1/detect`.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from fastapi import FastAPI, Request
from PIL import Image, ImageOps

from examples.yolov8 import fall_detector
from ortpack.components.core.exporters.detection_graphs import YoloReference

model = fall_detector()
labels = [model.names[i] for i in sorted(model.names)]
detect = YoloReference(model, 640, 114, 0.25, 0.45, 300)  # Ultralytics' predict defaults
app = FastAPI()


@app.post("/v1/detect")
async def detect_route(request: Request) -> dict:
    body = await request.body()
    with Image.open(io.BytesIO(body)) as image:
        pixels = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    with torch.inference_mode():
        found = detect(pixels)
    return {
        "width": pixels.shape[1],
        "height": pixels.shape[0],
        "detections": [
            {
                "box": [round(float(v), 2) for v in box],
                "label": labels[int(label)],
                "index": int(label),
                "score": float(s),
            }
            for box, s, label in zip(found["boxes"], found["scores"], found["labels"], strict=True)
        ],
    }


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}
