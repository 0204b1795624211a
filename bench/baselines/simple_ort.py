"""A simple FastAPI + ONNX Runtime server: one session call per request, no batching.

    BUNDLE=dist/all-MiniLM-L6-v2 uvicorn bench.baselines.simple_ort:app --workers 2 --port 8002

The strongest simple configuration measured on this machine before ortpack's server: the int8
variant, one intra-op thread per worker, two workers. Same API shape as `POST /v1/embeddings`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel
from tokenizers import Tokenizer

from bench.baselines.plain_session import plain_session

BUNDLE = Path(os.environ.get("BUNDLE", "dist/all-MiniLM-L6-v2"))
VARIANT = os.environ.get("VARIANT", "cpu-int8")
tokenizer = Tokenizer.from_file(str(BUNDLE / "tokenizer.json"))
tokenizer.enable_truncation(256)
tokenizer.enable_padding()
session = plain_session(BUNDLE, VARIANT)
app = FastAPI()


class EmbeddingsRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


@app.post("/v1/embeddings")
def embeddings(request: EmbeddingsRequest) -> dict:
    texts = [request.input] if isinstance(request.input, str) else request.input
    encoded = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    rows = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    data = [{"object": "embedding", "index": i, "embedding": row.tolist()} for i, row in enumerate(rows)]
    return {"object": "list", "data": data, "model": BUNDLE.name}


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}
