"""The model service: one loaded bundle variant behind the batcher (the layer between the HTTP
routes and the backend). It owns readiness: warm-up runs every bucket shape before `ready`."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.backend import TextEmbeddingBackend, load_session
from serving.batcher import Batcher
from serving.bundle import BundleError, Manifest, Variant, read_manifest, verify_bundle
from serving.config import ServeConfig
from serving.errors import NotReadyError
from serving.metrics import Metrics
from serving.text import Encoded, TextEncoder, default_buckets

log = logging.getLogger("ortpack.serve")

# For `--variant auto`: per target, the precisions to prefer, best first.
PREFERENCE = {"cuda": ("fp16", "fp32"), "cpu": ("int8", "fp32")}
TARGET_PROVIDER = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def choose_variant(manifest: Manifest, requested: str, available_providers: Sequence[str]) -> Variant:
    """The variant to load: the one asked for, or for `auto` the preferred precision of the best
    target whose execution provider this onnxruntime has (cuda before cpu)."""
    if requested != "auto":
        return manifest.variant(requested)
    for target in ("cuda", "cpu"):
        if TARGET_PROVIDER[target] not in available_providers:
            continue
        for precision in PREFERENCE[target]:
            for v in manifest.variants:
                if v.target == target and v.precision == precision:
                    return v
    raise BundleError(
        f"no variant of {manifest.name} runs on this machine (providers {list(available_providers)}; "
        f"variants {[v.id for v in manifest.variants]})"
    )


@dataclass
class ModelService:
    manifest: Manifest
    variant: Variant
    encoder: TextEncoder
    backend: TextEmbeddingBackend
    batcher: Batcher
    metrics: Metrics
    model_name: str
    timeout_s: float
    online_optimization: bool
    ready: bool = False
    draining: bool = False

    @property
    def dim(self) -> int:
        return self.backend.output_dim

    async def embed(self, encoded: Encoded) -> np.ndarray:
        if not self.ready:
            raise NotReadyError("the model is not ready yet (warming up)" if not self.draining else "shutting down")
        self.metrics.queue_depth.set(self.batcher.depth + len(encoded.payloads))
        rows = await self.batcher.submit(encoded.payloads, encoded.buckets, self.timeout_s)
        return np.stack(rows)

    def warm_up_shapes(self, max_batch_size: int) -> list[tuple[int, int]]:
        """(batch, length) per bucket: batch 1 at every ceiling, and a full batch at the smallest."""
        shapes = [(1, b) for b in self.encoder.buckets]
        shapes.append((max_batch_size, self.encoder.buckets[0]))
        return shapes

    def warm_up(self, max_batch_size: int, threads: int) -> float:
        """Run every bucket shape once (first calls allocate memory and pick kernels), spread over
        `threads` (the server's model workers: the cores are otherwise idle during start-up)."""
        from concurrent.futures import ThreadPoolExecutor

        def run(shape: tuple[int, int]) -> None:
            batch, length = shape
            ids = np.full(length, 1000 % self.encoder.vocab_size, dtype=np.int64)
            self.backend.run([ids] * batch)

        started = time.perf_counter()
        shapes = sorted(self.warm_up_shapes(max_batch_size), key=lambda s: -s[0] * s[1])  # longest first
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


def load_service(bundle_dir: Path, config: ServeConfig, metrics: Metrics) -> ModelService:
    """Verify the bundle, pick the variant, open its session: everything before warm-up."""
    import onnxruntime as ort

    manifest = read_manifest(bundle_dir)
    if manifest.task != "text-embedding" or manifest.tokenizer is None:
        raise BundleError(f"this server serves text-embedding bundles; {manifest.name} is {manifest.task}")
    variant = choose_variant(manifest, config.variant, ort.get_available_providers())
    verify_bundle(bundle_dir, only=[variant.file, manifest.tokenizer.file])  # every file this server loads
    session, plan = load_session(
        bundle_dir / variant.file,
        wanted_providers=variant.execution_providers,
        offline_level=variant.offline_optimization_level,
        built_ort_version=variant.ort_version,
        intra_op_threads=config.intra_op_threads,
    )
    max_tokens = config.max_tokens or manifest.tokenizer.max_length
    if max_tokens > manifest.tokenizer.max_length:
        raise BundleError(f"--max-tokens {max_tokens} exceeds the model's {manifest.tokenizer.max_length}")
    encoder = TextEncoder(
        bundle_dir / manifest.tokenizer.file,
        max_tokens=max_tokens,
        truncate=config.truncate,
        buckets=config.buckets or default_buckets(max_tokens),
    )
    dim = int(manifest.outputs[0].shape[-1])
    backend = TextEmbeddingBackend(session, manifest.tokenizer.model_input_names, manifest.tokenizer.pad_token_id, dim)
    batcher = Batcher(
        backend,
        max_batch_size=config.max_batch_size,
        max_queue_size=config.max_queue_size,
        workers=config.worker_count,
        max_batch_delay_ms=config.max_batch_delay_ms,
        on_batch=metrics.observe_batch,
    )
    log.info(
        "loaded %s variant %s on %s (%s); %d workers x %d threads; buckets %s",
        manifest.name,
        variant.id,
        plan.providers[0],
        plan.reason,
        config.worker_count,
        config.intra_op_threads,
        encoder.buckets,
    )
    return ModelService(
        manifest=manifest,
        variant=variant,
        encoder=encoder,
        backend=backend,
        batcher=batcher,
        metrics=metrics,
        model_name=config.model_name or manifest.name,
        timeout_s=config.request_timeout_ms / 1000.0,
        online_optimization=plan.online_optimization,
    )
