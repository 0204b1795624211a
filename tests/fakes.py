"""In-process servers for route tests: the real app and model service on a real tiny bundle,
driven through httpx's ASGI transport (no subprocess, no port), with backends that can be slowed
or gated to test scheduling through the HTTP layer."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ortpack.serving.app import serving_app
from ortpack.serving.config import ServeConfig
from ortpack.serving.metrics import Metrics
from ortpack.serving.service import ModelService, load_service


class SlowBackend:
    """The real backend, then `seconds_per_item` of sleep per item: a model that takes time,
    without using the CPU (the test's timing does not depend on the machine's load)."""

    def __init__(self, inner: Any, seconds_per_item: float) -> None:
        self.inner = inner
        self.seconds_per_item = seconds_per_item
        self.batches: list[int] = []
        self.lock = threading.Lock()

    def run(self, payloads: Sequence[Any]) -> np.ndarray:
        rows = self.inner.run(payloads)
        time.sleep(self.seconds_per_item * len(payloads))
        with self.lock:
            self.batches.append(len(payloads))
        return rows


@dataclass
class InProcess:
    client: httpx.AsyncClient
    service: ModelService
    config: ServeConfig

    def metrics(self) -> str:
        return self.service.metrics.render().decode()


@contextlib.asynccontextmanager
async def in_process(
    bundle: Path, *, backend: Any = None, base_url: str = "http://test", **options: Any
) -> AsyncIterator[InProcess]:
    """The server's app for `bundle` with `options` (ServeConfig fields), started and warmed up,
    its lone session too (the server opens it once ready; here before, so that requests find it);
    `backend(real_backend)` replaces what the batcher runs (the lone path too: it is turned off)."""
    options.setdefault("variant", "cpu-fp32")  # fp32 rows do not depend on the batch (int8's do)
    config = ServeConfig(bundle=str(bundle), **options)
    service = load_service(bundle, config, Metrics())
    if backend is not None:
        service.batcher.backend = backend(service.batcher.backend)
        service.lone_opener = None  # every batch goes through the replacement
    service.open_lone(config.max_batch_size, config.warmup)
    app = serving_app(service, config)
    await service.start(config)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url, timeout=60) as client:
            yield InProcess(client=client, service=service, config=config)
    finally:
        await service.stop()


def metric(text: str, name: str) -> float:
    """The value of one sample line (`name` includes its labels), 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
