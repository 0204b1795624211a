"""The model service: one loaded bundle variant behind the batcher (the layer between the HTTP
routes and the backend). It owns readiness: warm-up runs every bucket shape before `ready`."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.backend import ImageClassifierBackend, TextEmbeddingBackend, load_session
from serving.batcher import Batcher
from serving.bundle import BundleError, Manifest, Variant, read_manifest, verify_bundle
from serving.config import ServeConfig
from serving.errors import NotReadyError
from serving.images import ImageDecoder
from serving.metrics import Metrics
from serving.text import Encoded, TextEncoder, default_buckets

log = logging.getLogger("ortpack.serve")

# For `--variant auto` without benchmark numbers: per target, the precisions to prefer, best first.
PREFERENCE = {"cuda": ("fp16", "fp32"), "cpu": ("int8", "fp32")}
TARGET_PROVIDER = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def _measured_p50(variant: Variant) -> float | None:
    shapes = variant.benchmark.get("shapes") or {}
    first = next(iter(shapes.values()), None)
    return float(first["p50_ms"]) if first else None


def choose_variant(manifest: Manifest, requested: str, available_providers: Sequence[str]) -> Variant:
    """The variant to load: the one asked for, or for `auto`, among the variants of the first
    target whose execution provider this onnxruntime has (cuda before cpu), the fastest by the
    bundle's own benchmark (int8 is not always faster: a static-int8 MobileNetV3 ran slower than
    fp32), else by `PREFERENCE`."""
    if requested != "auto":
        return manifest.variant(requested)
    for target in ("cuda", "cpu"):
        if TARGET_PROVIDER[target] not in available_providers:
            continue
        candidates = [v for v in manifest.variants if v.target == target]
        if not candidates:
            continue
        measured = [(p50, v.id, v) for v in candidates if (p50 := _measured_p50(v)) is not None]
        if len(measured) == len(candidates):
            return min(measured)[2]
        return sorted(
            candidates, key=lambda v: PREFERENCE[target].index(v.precision) if v.precision in PREFERENCE[target] else 99
        )[0]
    raise BundleError(
        f"no variant of {manifest.name} runs on this machine (providers {list(available_providers)}; "
        f"variants {[v.id for v in manifest.variants]})"
    )


@dataclass
class ModelService:
    manifest: Manifest
    variant: Variant
    encoder: TextEncoder | None  # text bundles
    decoder: ImageDecoder | None  # image bundles
    backend: TextEmbeddingBackend | ImageClassifierBackend
    batcher: Batcher
    metrics: Metrics
    model_name: str
    timeout_s: float
    online_optimization: bool
    load_reason: str = ""
    ready: bool = False
    draining: bool = False

    @property
    def dim(self) -> int:
        return self.backend.output_dim

    @property
    def task(self) -> str:
        return self.manifest.task

    async def infer(self, payloads: Sequence[Any], buckets: Sequence[Any]) -> np.ndarray:
        if not self.ready:
            raise NotReadyError("the model is not ready yet (warming up)" if not self.draining else "shutting down")
        self.metrics.queue_depth.set(self.batcher.depth + len(payloads))
        rows = await self.batcher.submit(payloads, buckets, self.timeout_s)
        return np.stack(rows)

    async def embed(self, encoded: Encoded) -> np.ndarray:
        return await self.infer(encoded.payloads, encoded.buckets)

    def warm_up_shapes(self, max_batch_size: int) -> list[tuple[int, ...]]:
        """Text: (batch, length) per bucket, batch 1 at every ceiling and a full batch at the
        smallest. Images (a bucket per image size): (batch, height, width) for the crop size, VGA
        both ways and 1080p at batch 1, and a batch of 8 VGA images."""
        if self.encoder is not None:
            shapes: list[tuple[int, ...]] = [(1, b) for b in self.encoder.buckets]
            shapes.append((max_batch_size, self.encoder.buckets[0]))
            return shapes
        crop = self.manifest.preprocessing.crop_size if self.manifest.preprocessing else 224
        return [(1, crop, crop), (1, 480, 640), (1, 640, 480), (1, 1080, 1920), (min(8, max_batch_size), 480, 640)]

    def warm_up(self, max_batch_size: int, threads: int) -> float:
        """Run every bucket shape once (first calls allocate memory and pick kernels), spread over
        `threads` (the server's model workers: the cores are otherwise idle during start-up)."""
        from concurrent.futures import ThreadPoolExecutor

        def run(shape: tuple[int, ...]) -> None:
            if self.encoder is not None:
                batch, length = shape
                ids = np.full(length, 1000 % self.encoder.vocab_size, dtype=np.int64)
                self.backend.run([ids] * batch)
            else:
                batch, height, width = shape
                self.backend.run([np.full((height, width, 3), 128, dtype=np.uint8)] * batch)

        started = time.perf_counter()
        shapes = sorted(self.warm_up_shapes(max_batch_size), key=lambda s: -int(np.prod(s)))  # biggest first
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ortpack-warmup") as pool:
            list(pool.map(run, shapes))
        return time.perf_counter() - started

    def begin_warm_up(self, config: ServeConfig) -> None:
        """Start warming up on a background thread now, so it overlaps the rest of start-up
        (importing the HTTP stack, binding the port); `start` waits for it."""
        if not config.warmup:
            return

        def run() -> None:
            seconds = self.warm_up(config.max_batch_size, config.worker_count)
            log.info("warm-up: %d shapes in %.2f s", len(self.warm_up_shapes(config.max_batch_size)), seconds)

        self._warm_up_thread = threading.Thread(target=run, name="ortpack-warmup", daemon=True)
        self._warm_up_thread.start()

    async def start(self, config: ServeConfig) -> None:
        """Start the batcher; turn ready once the warm-up (begun or run here) has finished."""
        self.batcher.start()
        thread = getattr(self, "_warm_up_thread", None)
        if thread is None and config.warmup:
            self.begin_warm_up(config)
            thread = self._warm_up_thread
        if thread is not None:
            await asyncio.to_thread(thread.join)
        self.ready = True
        self.metrics.ready.set(1)

    async def stop(self) -> None:
        self.ready, self.draining = False, True
        self.metrics.ready.set(0)
        await self.batcher.stop(drain=True)


def _batcher(backend: Any, config: ServeConfig, metrics: Metrics, images: bool = False) -> Batcher:
    """Images are batched by size and also capped at `max_batch_pixels` per batch."""
    return Batcher(
        backend,
        max_batch_size=config.max_batch_size,
        max_queue_size=config.max_queue_size,
        workers=config.worker_count,
        max_batch_delay_ms=config.max_batch_delay_ms,
        on_batch=metrics.observe_batch,
        item_cost=(lambda p: p.shape[0] * p.shape[1]) if images else None,
        max_batch_cost=config.max_batch_pixels if images else math.inf,
    )


def load_service(bundle_dir: Path, config: ServeConfig, metrics: Metrics) -> ModelService:
    """Verify the bundle, pick the variant, open its session: everything before warm-up."""
    import onnxruntime as ort

    manifest = read_manifest(bundle_dir)
    variant = choose_variant(manifest, config.variant, ort.get_available_providers())
    # Every file is checked before the server starts: what it loads before loading it, the rest
    # (other variants, the report) on another thread meanwhile (hashing 90 MB takes ~0.15 s).
    loaded = [variant.file] + ([manifest.tokenizer.file] if manifest.tokenizer else [])
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortpack-verify") as pool:
        others = pool.submit(verify_bundle, bundle_dir, [f for f in manifest.files if f not in loaded])
        verify_bundle(bundle_dir, only=loaded)
        service, batching = _open(bundle_dir, manifest, variant, config, metrics)
        others.result()  # a tampered file anywhere refuses the start
    log.info(
        "loaded %s variant %s (%s); %d workers x %d threads; %s",
        manifest.name,
        variant.id,
        service.load_reason,
        config.worker_count,
        config.intra_op_threads,
        batching,
    )
    return service


# The loaded model service, and how it batches (for the start-up log line).
def _open(
    bundle_dir: Path, manifest: Manifest, variant: Variant, config: ServeConfig, metrics: Metrics
) -> tuple[ModelService, str]:
    session, plan = load_session(bundle_dir / variant.file, variant, intra_op_threads=config.intra_op_threads)
    dim = int(manifest.outputs[0].shape[-1])
    encoder: TextEncoder | None = None
    decoder: ImageDecoder | None = None
    backend: TextEmbeddingBackend | ImageClassifierBackend
    if manifest.task == "image-classification":
        assert manifest.preprocessing is not None
        try:
            draft = manifest.preprocessing.resize_size if config.jpeg_draft else None
            decoder = ImageDecoder(max_pixels=config.max_image_pixels, draft_size=draft)
        except RuntimeError as exc:
            raise BundleError(str(exc)) from None
        backend = ImageClassifierBackend(session, dim)
        batching = "images batched by size"
    else:
        assert manifest.tokenizer is not None
        max_tokens = config.max_tokens or manifest.tokenizer.max_length
        if max_tokens > manifest.tokenizer.max_length:
            raise BundleError(f"--max-tokens {max_tokens} exceeds the model's {manifest.tokenizer.max_length}")
        encoder = TextEncoder(
            bundle_dir / manifest.tokenizer.file,
            max_tokens=max_tokens,
            truncate=config.truncate,
            buckets=config.buckets or default_buckets(max_tokens),
        )
        backend = TextEmbeddingBackend(
            session, manifest.tokenizer.model_input_names, manifest.tokenizer.pad_token_id, dim
        )
        batching = f"buckets {encoder.buckets}"
    return ModelService(
        manifest=manifest,
        variant=variant,
        encoder=encoder,
        decoder=decoder,
        backend=backend,
        batcher=_batcher(backend, config, metrics, images=decoder is not None),
        metrics=metrics,
        model_name=config.model_name or manifest.name,
        timeout_s=config.request_timeout_ms / 1000.0,
        online_optimization=plan.online_optimization,
        load_reason=f"{plan.providers[0]}: {plan.reason}",
    ), batching
