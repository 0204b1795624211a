"""The model service: one loaded bundle variant behind the batcher (the layer between the HTTP
routes and the task's engine). It picks the variant, checks it on this node, and owns readiness:
warm-up runs every shape before `ready`."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import (
    MANIFEST_NAME,
    BundleError,
    EmbeddingSpace,
    Manifest,
    Variant,
    embedding_space,
    read_manifest,
    read_variant,
    read_verified,
    verify_bundle,
)
from ortpack.kernel.contracts import get_contract
from ortpack.kernel.engine import Engine, EngineOptions, Item
from ortpack.kernel.engines import get_engine, open_engine
from ortpack.kernel.hardware import HardwareInfo, this_machine
from ortpack.kernel.policy import admit, parse_requirements
from ortpack.kernel.probe import Probe, ProbeResult, check_probe
from ortpack.kernel.runtime import SessionPlan, plan_for, serving_session
from ortpack.kernel.selection import candidate_variants
from ortpack.serving import context
from ortpack.serving.batcher import Batcher
from ortpack.serving.config import ServeConfig
from ortpack.serving.errors import NotReadyError, OverloadedError
from ortpack.serving.memory import (
    PIXEL_EXPANSION,
    EngineMemory,
    MemoryBudget,
    MemoryGuardedEngine,
    body_expansion,
    resident_bytes,
)
from ortpack.serving.metrics import Metrics
from ortpack.serving.startup import Timeline
from ortpack.serving.tasks import LoadContext, TaskRuntime, get_task
from ortpack.serving.tasks.contract import Lifecycle

log = logging.getLogger("ortpack.serve")
# An image model's working memory per pixel run at once, at least: the graph's preprocessing turns
# the whole image to float32 first (3 x 4 bytes a pixel). Measured: the shared arena grew by 137 MB
# for a 12-megapixel photo on MobileNetV3-small (11.4 bytes); the warm-up's small images, which
# the arena's first chunk absorbs, measured 3.3. The warm-up's measure counts when it is larger.
WORKING_BYTES_PER_PIXEL = 12.0


@dataclass
class ModelService:
    """One loaded variant of a bundle behind the batcher: what the routes call. `engine` is the
    task's kernel half (kernel/engines/: tokenizer or decoder, the model call); `runtime` its
    HTTP half (serving/tasks/: routes, bodies, v2 tensors)."""

    manifest: Manifest
    variant: Variant
    engine: Engine
    runtime: TaskRuntime
    batcher: Batcher
    metrics: Metrics
    model_name: str
    timeout_s: float
    online_optimization: bool
    load_reason: str = ""
    node_check: ProbeResult | None = None  # the probe check of this variant on this node
    rejected: list[ProbeResult] = field(default_factory=list)  # variants that missed it here
    excluded: dict[str, list[str]] = field(default_factory=dict)  # variant id -> the --require it missed
    ready: bool = False
    draining: bool = False
    timeline: Timeline = field(default_factory=Timeline)  # the start-up phases
    # opens the lone engine (a batch that runs alone, on every core): after ready, see `open_lone`
    lone_opener: Callable[[], Engine] | None = None
    memory: MemoryBudget = field(default_factory=lambda: MemoryBudget(None))  # set at start, once warm
    max_memory: int | None = None  # --max-memory (None: the container's limit)
    cost_per_byte: float = 0.0  # what a body byte has cost the model (its units), smoothed; set at start
    engine_memory: EngineMemory | None = None  # image engines: the arenas' growth in the budget (set at start)
    # the warm-up's resident growth (bytes) and the most units it ran at once (set by `warm_up`)
    warmed: tuple[int, float] | None = None
    _lone_warmed: float = 0.0  # the most units the lone session's warm-up ran at once
    _lone_thread: threading.Thread | None = None

    @functools.cached_property
    def space(self) -> EmbeddingSpace | None:
        """The embedding space of the served variant (text embeddings; None otherwise): computed
        once, every embeddings answer names it."""
        return embedding_space(self.manifest, self.variant)

    def admit_body(self, size: int, form: str = "json") -> float:
        """Before a request's body of `size` bytes (0: unknown yet) and `form` (serving/http.py
        `body_form`) is read: refuse it at once (429) when no request could finish in the time it
        has left, or when what it will hold does not fit the memory budget; else hold that memory
        until it is answered. Returns what it holds per body byte (for a body of unknown size)."""
        ctx = context.current()
        # what bodies cost per byte so far (an estimate: a body's texts may be cut to --max-tokens)
        budget = ctx.remaining() if ctx is not None else self.timeout_s
        self.batcher.precheck(budget, size * self.cost_per_byte, id(ctx) if ctx is not None else None)
        expansion = body_expansion(self.engine.units, form)
        self.hold(int(size * expansion), "its body")
        return expansion

    def hold(self, size: int, what: str, *, wait_s: float = 0.0, passing: bool = False) -> None:
        """Hold `size` more bytes of the memory budget for the current request (429 beyond it, after
        waiting up to `wait_s` for requests on their way through the model to free theirs)."""
        if size <= 0:
            return
        if not self.memory.reserve(size, wait_s=wait_s, passing=passing):
            memory, arena = self.memory, self.engine_memory
            log.debug(
                "refused %.1f MB for %s: %.1f of %.1f MB held (%.1f passing, %.1f the arena's growth)",
                size / 1e6,
                what,
                memory.held / 1e6,
                (memory.limit or 0) / 1e6,
                memory.passing / 1e6,
                (arena.grown if arena is not None else 0) / 1e6,
            )
            raise OverloadedError(
                f"overloaded: the server's memory budget is held by the requests in progress (this one needs "
                f"{size / 1e6:.1f} MB for {what}); retry later",
                headers={"Retry-After": str(self.batcher.retry_after())},
            )
        ctx = context.current()
        if ctx is not None:
            ctx.reserved += size

    def hold_pixels(self, nbytes: int) -> None:
        """Hold an image's decoded pixels (`nbytes` of uint8, from its header) for the current request
        before they are decoded, so decoding never takes memory the budget has not given (429 beyond
        it). Pixels that do not fit wait for those of requests ahead of it, which the model frees as
        it answers them, up to half the time the request has left (its body is read and held already:
        waiting costs no more memory). Called on a decode thread, in the request's context."""
        size = int(nbytes * PIXEL_EXPANSION)
        ctx = context.current()
        self.hold(size, "its decoded pixels", wait_s=ctx.remaining() / 2 if ctx is not None else 0.0, passing=True)
        if ctx is not None:
            ctx.pixels_held += size

    def finished(self, ctx: Any) -> None:
        """The request of `ctx` is answered: its memory and any admission estimate are released."""
        self.batcher.forget(id(ctx))
        if ctx.reserved:
            self.memory.release(ctx.reserved, passing=ctx.pixels_held)

    async def infer(
        self, payloads: Sequence[Any], buckets: Sequence[Any], shape: Callable[[Item], Any] | None = None
    ) -> list[Any]:
        """Queue one request's items and wait for their outputs (in order), each passed through
        `shape` on the model thread when it is given (post-processing off the event loop: the
        batcher's `shape`)."""
        if not self.ready:
            raise NotReadyError("the model is not ready yet (warming up)" if not self.draining else "shutting down")
        # decoded images are larger than their files (the graph's float copies are the engine's:
        # EngineMemory); those decoded from files were held before their decode (`hold_pixels`)
        ctx = context.current()
        pixels = int(sum(getattr(p, "nbytes", 0) for p in payloads) * PIXEL_EXPANSION)
        self.hold(pixels - (ctx.pixels_held if ctx is not None else 0), "its decoded inputs")
        if ctx is not None and ctx.body_bytes:  # what a body byte costs the model, for `admit_body`
            cost = sum(self.batcher.item_cost(p, b) for p, b in zip(payloads, buckets, strict=True))
            ratio = cost / ctx.body_bytes
            self.cost_per_byte = ratio if not self.cost_per_byte else 0.9 * self.cost_per_byte + 0.1 * ratio
        self.metrics.queue_depth.set(self.batcher.depth + len(payloads))
        items = await self.batcher.submit(payloads, buckets, self.timeout_s, shape)
        ctx = context.current()
        if ctx is not None and ctx.model_end:
            ctx.postprocess_s = time.perf_counter() - ctx.model_end
        return items

    def warm_up(self, max_batch_size: int, threads: int) -> tuple[int, float]:
        """Run every shape the task will run once (first calls allocate memory and pick kernels),
        spread over `threads` (the server's model workers: the cores are otherwise idle during
        start-up). Returns (batches, seconds)."""
        batches = self.engine.warm_up_batches(min(max_batch_size, self.batcher.max_batch_size))
        started, resident = time.perf_counter(), resident_bytes()

        def timed(batch: list[Any]) -> None:
            began = time.perf_counter()
            self.engine.run(batch)
            costs = [self.engine.cost(p) for p in batch]  # the batch times admission predicts with
            self.batcher.times.observe(
                max(costs) * len(costs) if self.engine.padded else sum(costs), time.perf_counter() - began
            )

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ortpack-warmup") as pool:
            list(pool.map(timed, batches))
        # the session ran up to the `threads` largest batches at once: what its arena now holds
        units = sorted((sum(self.engine.cost(p) for p in batch) for batch in batches), reverse=True)
        self.warmed = (max(0, resident_bytes() - resident), sum(units[:threads]))
        return len(batches), time.perf_counter() - started

    def open_lone(self, max_batch_size: int, warmup: bool = True) -> None:
        """Open the lone engine, run every warm-up shape on it (on every core already: one at a
        time), then hand it to the batcher. The server does it after turning ready: until then a
        batch that runs alone runs on a worker session, as under load."""
        if self.lone_opener is None:
            return
        started, resident, held = time.perf_counter(), resident_bytes(), self.memory.held
        lone, self.lone_opener = self.lone_opener(), None
        largest = 0.0
        if warmup:
            for batch in self.engine.warm_up_batches(min(max_batch_size, self.batcher.max_batch_size)):
                lone.run(batch)
                largest = max(largest, sum(self.engine.cost(p) for p in batch))
        # opened after the budget was measured: what it holds leaves the budget (requests may have
        # grown the process meanwhile: less what they reserved)
        self.memory.shrink(max(0, resident_bytes() - resident - (self.memory.held - held)))
        self._lone_warmed = largest
        if self.engine_memory is not None:
            lone = MemoryGuardedEngine(lone, self.engine_memory, self.engine.cost, largest)
        self.batcher.lone_backend = lone
        log.info("lone session: opened and warmed up in %.2f s, after ready", time.perf_counter() - started)

    def begin_warm_up(self, config: ServeConfig) -> None:
        """Start warming up on a background thread now, so it overlaps the rest of start-up
        (importing the HTTP stack, binding the port); `start` waits for it."""
        if not config.warmup:
            return

        def run() -> None:
            with self.timeline.phase("warm-up"):
                count, seconds = self.warm_up(config.max_batch_size, config.worker_count)
            log.info("warm-up: %d shapes in %.2f s", count, seconds)

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
        # what is left once the model is loaded and warm
        tokenizes = self.engine.units == "tokens"
        self.memory = budget = MemoryBudget.for_server(self.max_memory, config.max_body_bytes, tokenizes=tokenizes)
        self.metrics.memory_held.set_function(lambda: budget.held)
        self.metrics.memory_budget.set_function(lambda: -1 if budget.limit is None else budget.limit)
        if self.engine.units == "pixels":
            grown, units = self.warmed or (0, 0.0)
            per_pixel = max(grown / units if grown and units else 0.0, WORKING_BYTES_PER_PIXEL)
            # the served sessions share the process's CPU arena (kernel/runtime.py `share_cpu_arena`)
            memory = self.engine_memory = EngineMemory(self.memory, per_pixel, shared=True)
            self.batcher.backend = MemoryGuardedEngine(self.batcher.backend, memory, self.engine.cost, units)
            lone = self.batcher.lone_backend
            if lone is not None:  # opened before start (tests): its warm-up is in the budget already
                self.batcher.lone_backend = MemoryGuardedEngine(lone, memory, self.engine.cost, self._lone_warmed)
            how = "measured at warm-up" if per_pixel > WORKING_BYTES_PER_PIXEL else "the least the graph needs"
            log.info("image working memory: %.1f bytes per pixel run at once (%s)", per_pixel, how)
        self.cost_per_byte = self.cost_per_byte or self.engine.cost_per_byte
        if isinstance(self.runtime, Lifecycle):  # the generation loop: sized from the budget, then warmed
            await self.runtime.start(self)
        self.ready = True
        self.metrics.ready.set(1)
        if self.lone_opener is not None:
            self._lone_thread = threading.Thread(
                target=self.open_lone, args=(config.max_batch_size, config.warmup), name="ortpack-lone", daemon=True
            )
            self._lone_thread.start()

    async def stop(self) -> None:
        self.ready, self.draining = False, True
        self.metrics.ready.set(0)
        if isinstance(self.runtime, Lifecycle):
            await self.runtime.stop()
        await self.batcher.stop(drain=True)
        await asyncio.to_thread(self.join_threads)

    def join_threads(self, timeout_s: float = 60.0) -> None:
        """Wait for the warm-up and the lone session's opening to end: a process must not exit while
        ONNX Runtime creates a session or runs on another thread (it aborts, exit 134)."""
        for thread in (getattr(self, "_warm_up_thread", None), self._lone_thread):
            if thread is not None and thread.is_alive():
                thread.join(timeout_s)


def _batcher(engine: Engine, config: ServeConfig, metrics: Metrics, lone: bool) -> Batcher:
    """The batcher; with `lone`, its lone engine comes later (`ModelService.open_lone`)."""
    return Batcher(
        engine,
        max_batch_size=min(config.max_batch_size, engine.max_batch_size or config.max_batch_size),
        max_queue_size=config.max_queue_size,
        workers=config.worker_count,
        max_batch_delay_ms=config.max_batch_delay_ms,
        on_batch=metrics.observe_batch,
        on_model_error=lambda scope: metrics.model_errors.labels(scope=scope).inc(),
        cost=engine.cost,
        padded=engine.padded,
        max_batch_cost=engine.max_batch_cost,
        units=engine.units,
        lone_threads=config.lone_thread_count if lone else 1,
        batch_s=config.max_batch_ms / 1000.0,
        fast_s=config.fast_lane_ms / 1000.0,
        admission=config.admission,
    )


class NodeCheckError(BundleError):
    """No variant the server may load passes its gate on this node."""


def load_service(
    bundle_dir: Path,
    config: ServeConfig,
    metrics: Metrics,
    *,
    signed: dict[str, str] | None = None,
    timeline: Timeline | None = None,
    known: Callable[[Path], str | None] | None = None,
) -> ModelService:
    """Verify the bundle, pick the variant, open its session, and re-check its numbers on this
    node with the bundle's probe set: everything before warm-up.

    Every file is checked before the server starts. What it loads is read once, hashed and loaded
    from those bytes (a file swapped on disk after the check is never what runs); the rest (other
    variants, the report) is hashed on another thread meanwhile. With `--variant auto` a variant
    that misses its gate here is skipped for the next candidate (fp32 last), with one warning line;
    an explicitly requested one that misses refuses the start.

    `signed` (path -> sha256, from a verified signature) pins manifest.json to the bytes the
    signature covers; every other file is then pinned through the manifest's own sha256. `timeline`
    records the phases; `known`: the digests hashed already (serving/startup.py)."""
    timeline = timeline or Timeline()
    began = timeline.now()
    import onnxruntime as ort

    if signed is not None and MANIFEST_NAME not in signed:
        raise BundleError(f"the signature does not cover {MANIFEST_NAME}")
    manifest = read_manifest(bundle_dir, signed[MANIFEST_NAME] if signed is not None else None)
    metrics.gated_metrics(g.metric for g in get_contract(manifest.task).gates.values())
    hardware = this_machine()
    candidates = candidate_variants(manifest, config.variant, ort.get_available_providers(), hardware)
    excluded = _apply_policy(manifest, candidates, config)
    candidates = [v for v in candidates if v.id not in excluded]
    shared = manifest.task_settings.shared_files()
    if manifest.probe is not None:
        shared.append(manifest.probe.file)
    first = [candidates[0].file, *shared]
    timeline.record("manifest", began)

    def verify_others() -> None:
        with timeline.phase("verify"):
            verify_bundle(bundle_dir, [f for f in manifest.files if f not in first], known)

    # the other files are checked on one thread; the first candidate's bytes are read, hashed and
    # opened on another while this one reads the probe set and decodes its inputs
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="ortpack-bundle") as pool:
        others = pool.submit(verify_others)
        began = timeline.now()  # the first session's phase counts reading the shared files
        opening = pool.submit(_session, bundle_dir, manifest, candidates[0], config)
        files = {rel: read_verified(bundle_dir, manifest, rel) for rel in shared}
        names = [o.name for o in manifest.signature.outputs]
        probe = Probe.from_bytes(files[manifest.probe.file], names) if manifest.probe is not None else None
        service, batching, rejected = _first_passing(
            bundle_dir, manifest, candidates, files, probe, config, metrics, timeline, began, pool, opening
        )
        others.result()  # a tampered file anywhere refuses the start
    if service is None or (service.node_check is None and probe is not None):
        summary = " | ".join(f"{r.variant_id}: {r.summary()}" for r in rejected)
        raise NodeCheckError(
            f"no variant of {manifest.name} passes its parity gate on this node ({hardware.summary()}): {summary}"
        )
    service.rejected = rejected
    service.excluded = excluded
    service.timeline = timeline
    _check_space(service)
    log.info(
        "loaded %s variant %s (%s); node check %s; %d workers x %d threads; %s",
        manifest.name,
        service.variant.id,
        service.load_reason,
        "skipped (no probe set)" if service.node_check is None else f"passed in {service.node_check.seconds:.2f} s",
        config.worker_count,
        config.intra_op_threads,
        batching,
    )
    return service


def _first_passing(
    bundle_dir: Path,
    manifest: Manifest,
    candidates: list[Variant],
    files: dict[str, bytes],
    probe: Probe | None,
    config: ServeConfig,
    metrics: Metrics,
    timeline: Timeline,
    began: float,
    pool: ThreadPoolExecutor,
    opening: Future[Opened],
) -> tuple[ModelService | None, str, list[ProbeResult]]:
    """Open the candidates in order from their verified bytes and re-check each on this node with
    the probe set; (the first that passes, or the last opened when there is no probe set, or
    None; its batching; the node checks that missed). Only `--variant auto` goes on to the next
    candidate after a miss. Each candidate's session opens on `pool` (`_session`; the first's is
    `opening`, on its way) while this thread decodes or tokenizes the probe's inputs with an engine
    that gets the session once it is open."""
    hardware = this_machine()
    rejected: list[ProbeResult] = []
    batching = ""
    for variant in candidates:
        if variant is not candidates[0]:
            opening = pool.submit(_session, bundle_dir, manifest, variant, config)
        engine = _engine(manifest, variant, files, config)
        payloads = _probe_payloads(engine, probe)
        service, batching = _open(manifest, variant, engine, opening, config, metrics)
        timeline.record("session", began)
        if probe is None:
            log.warning(
                "bundle %s has no probe set: variant %s is not re-checked on this node", manifest.name, variant.id
            )
            return service, batching, rejected
        with timeline.phase("node check"):
            result = _node_check(service, probe, payloads, hardware, config.worker_count)
        metrics.observe_probe(result)
        if result.passed:
            service.node_check = result
            return service, batching, rejected
        rejected.append(result)
        if variant is candidates[-1] or config.variant != "auto":
            break
        log.warning(
            "variant %s missed its gate on this node (%s): %s; trying %s",
            variant.id,
            hardware.int8_kernel,
            result.summary(),
            candidates[candidates.index(variant) + 1].id,
        )
        began = timeline.now()
    return None, batching, rejected


def _check_space(service: ModelService) -> None:
    """Warn when the embedding space the manifest records is not the one the served files make."""
    recorded, served = service.variant.space, service.space
    if recorded is not None and served is not None and recorded.id != served.id:
        log.warning(
            "variant %s: manifest.json records space %s but its files make %s (edited after packaging?); "
            "serving it as %s",
            service.variant.id,
            recorded.id,
            served.id,
            served.id,
        )


def _apply_policy(manifest: Manifest, candidates: list[Variant], config: ServeConfig) -> dict[str, list[str]]:
    """The candidates --require excludes (id -> misses), one warning line each; checked against
    the manifest alone, before any model is read. Raises PolicyRefusedError when none is left."""

    policy = parse_requirements(config.require)
    if not policy:
        return {}
    admission = admit(manifest, candidates, policy)
    for variant_id, misses in admission.excluded.items():
        log.warning("policy: variant %s is not served: %s", variant_id, "; ".join(misses))
    return admission.excluded


def _node_check(
    service: ModelService, probe: Probe, payloads: list[Any] | None, hardware: HardwareInfo, threads: int
) -> ProbeResult:
    """The variant's probe check on this node, with its own thresholds from the manifest, spread
    over `threads` (the server's model workers: the cores are otherwise idle meanwhile)."""
    return check_probe(
        probe,
        service.engine,
        service.variant.parity.thresholds,
        get_engine(service.manifest.task).probe_metrics,
        gates=get_contract(service.manifest.task).gates,
        variant_id=service.variant.id,
        provider=service.engine.session.get_providers()[0],
        hardware=hardware.as_dict(),
        threads=threads,
        payloads=payloads,
    )


@dataclass(frozen=True)
class Opened:
    """A variant's verified bytes (kept for the lone session) and its serving session."""

    model: bytes
    session: Any
    plan: SessionPlan
    data: dict[str, bytes] = field(default_factory=dict)  # the graph's weights file, where it has one


def _session(bundle_dir: Path, manifest: Manifest, variant: Variant, config: ServeConfig) -> Opened:
    """Read and hash the variant's file and open its session from those bytes (on a pool thread:
    the hashing and most of the session's optimization release the GIL)."""
    model, data = read_variant(bundle_dir, manifest, variant)
    # an engine that runs its own loop (generation) steps one session at a time: every core, spinning
    # between the operators of a step
    own_loop = get_engine(manifest.task).own_loop
    threads = config.lone_thread_count if own_loop else config.intra_op_threads
    # A generation loop's session: no CPU arena. Its every step allocates the present cache a
    # little larger than the last, which an arena cannot reuse and keeps: 200 long requests took a
    # 3 GB server to 7.4 GB resident; without it, the same speed (8 streams: 55 against 56 tokens/s)
    session, plan = serving_session(
        model, variant, intra_op_threads=threads, allow_spinning=own_loop, data=data, arena=not own_loop
    )
    return Opened(model, session, plan, data)


def _engine(manifest: Manifest, variant: Variant, files: dict[str, bytes], config: ServeConfig) -> Engine:
    """The variant's engine, before its session is open (`Engine.on` gives it the session)."""
    try:
        return open_engine(
            manifest, None, files, variant=variant, options=engine_options(config, plan_for(variant).providers[0])
        )
    except ValueError as exc:  # the bundle and the server's options disagree: one line, exit 2
        raise BundleError(str(exc)) from None


def _probe_payloads(engine: Engine, probe: Probe | None) -> list[Any] | None:
    """The probe's inputs as this engine's payloads, or None: no probe set, or inputs it cannot
    take (the node check then tries again and reports why, as a miss)."""
    if probe is None:
        return None
    try:
        return engine.probe_payloads(probe.inputs)
    except Exception:  # noqa: BLE001 - reported by the node check
        return None


def _open(
    manifest: Manifest,
    variant: Variant,
    engine: Engine,
    opening: Future[Opened],
    config: ServeConfig,
    metrics: Metrics,
) -> tuple[ModelService, str]:
    """The loaded model service, once its session is open, and how it batches (for the start-up log line)."""
    opened = opening.result()
    model, plan = opened.model, opened.plan
    engine = engine.on(opened.session)
    try:
        runtime = get_task(manifest.task).open(
            LoadContext(manifest=manifest, variant=variant, engine=engine, config=config)
        )
    except ValueError as exc:  # the bundle and the server's options disagree: one line, exit 2
        raise BundleError(str(exc)) from None
    lone_opener: Callable[[], Engine] | None = None
    if config.lone_thread_count > max(1, config.intra_op_threads) and not get_engine(manifest.task).own_loop:

        def open_lone() -> Engine:
            """The same verified bytes in a second session with every core, for batches that run alone."""
            session, _ = serving_session(
                model, variant, intra_op_threads=config.lone_thread_count, allow_spinning=True, data=opened.data
            )
            return engine.on(session)

        lone_opener = open_lone
        batching = f"{engine.batching}; a batch alone on {config.lone_thread_count} threads"
    else:
        batching = engine.batching
    return ModelService(
        manifest=manifest,
        variant=variant,
        engine=engine,
        runtime=runtime,
        batcher=_batcher(engine, config, metrics, lone_opener is not None),
        metrics=metrics,
        model_name=config.model_name or manifest.name,
        timeout_s=config.request_timeout_ms / 1000.0,
        online_optimization=plan.online_optimization,
        load_reason=f"{plan.providers[0]}: {plan.reason}",
        lone_opener=lone_opener,
        max_memory=config.memory_bytes,
    ), batching


# Pixels per image batch by default. On the CPU a batch holds one image unless --max-batch-pixels is
# given: with one intra-op thread per worker, a batch never cost less per image than one image alone
# (MobileNetV3-small fp32, EfficientNet-Lite0 int8, YOLOv8s int8 at 224x224, VGA and 1280x960: a
# batch of 8 cost 1.18-1.75x one image's per image, bench/image_batching.py;
# docs/image-classification.md#batching), and the stacked copy of its images is saved too.
DEFAULT_BATCH_PIXELS = 4_000_000


def engine_options(config: ServeConfig, provider: str = "CPUExecutionProvider") -> EngineOptions:
    """The server's limits, as the engine applies them on `provider` (the session's first)."""
    one_image = not config.max_batch_pixels and provider == "CPUExecutionProvider"
    return EngineOptions(
        max_tokens=config.max_tokens,
        truncate=config.truncate,
        buckets=config.buckets,
        max_text_chars=config.max_text_chars,
        max_image_pixels=config.max_image_pixels,
        decode=config.decode,
        max_batch_tokens=config.max_batch_tokens,
        max_batch_pixels=config.max_batch_pixels or DEFAULT_BATCH_PIXELS,
        max_batch_images=1 if one_image else 0,
    )


def model_service(request: Any) -> ModelService:
    """The service an app-level route (serving/routes/) answers from: the whole ModelService. Task
    routes read it through `ortpack.serving.http.service_of`, which declares only what they use."""
    service: ModelService = request.app.state.service
    return service
