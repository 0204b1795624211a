"""The published baseline: a naive PyTorch + FastAPI embedding server, one model call per request.

    uvicorn bench.baselines.naive_torch:app --workers 2 --port 8001

Same request and answer shape as `POST /v1/embeddings` (float encoding), so one load script
drives both servers. Mean pooling and L2 normalisation as sentence-transformers does.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

from ortpack.components.core.tasks import resolve_model_source

SOURCE, NAME = resolve_model_source(os.environ.get("NAIVE_MODEL", "all-MiniLM-L6-v2"), "text-embedding")
tokenizer = AutoTokenizer.from_pretrained(SOURCE)
model = AutoModel.from_pretrained(SOURCE).eval()
app = FastAPI()


class EmbeddingsRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


@app.post("/v1/embeddings")
def embeddings(request: EmbeddingsRequest) -> dict:
    texts = [request.input] if isinstance(request.input, str) else request.input
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1)
    data = [{"object": "embedding", "index": i, "embedding": row.tolist()} for i, row in enumerate(pooled)]
    return {"object": "list", "data": data, "model": NAME}


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}
