"""`ortpack-serve` / `python -m ortpack.serving`: fetch, verify and serve a bundle.

Start-up problems (bad option, the port in use, unreachable or tampered bundle, a signature
missing or not verifying with --trust-key, no variant for this hardware) print one line and exit
2, before the model is loaded when they can be known before (the port is bound first). A bad or
missing option ends with "(see ortpack-serve --help)". The HTTP
port opens before warm-up, so liveness answers at once; readiness turns 200 when every bucket
shape has run, and one line says what is served:

    ready: all-MiniLM-L6-v2 variant cpu-int8 (ORT 1.32.0, avx512_vnni) on http://127.0.0.1:8080 in 0.9 s

SIGTERM (or Ctrl-C): readiness turns 503 at once while the server keeps serving for
--shutdown-grace-s (endpoints and load balancers forget the pod meanwhile; answers carry
`Connection: close`), then it stops accepting, answers every request already accepted, and
exits 0. A second signal skips what is left of the grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ortpack.kernel.errors import one_line

log = logging.getLogger("ortpack.serve")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and an access line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        import orjson

        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own lines (started, waiting, finished...) only when debugging: ours say what matters
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel("DEBUG" if level == "debug" else "WARNING")


def bind_socket(host: str, port: int, what: str) -> socket.socket:
    """Bind (not yet listen on) host:port, as uvicorn would: a port in use stops the start here,
    before the model is loaded."""
    from ortpack.serving.config import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    from ortpack.serving.startup import Prehash, Timeline

    timeline = Timeline()
    with timeline.phase("imports"):
        from ortpack.serving.config import ConfigError, parse_config
        from ortpack.serving.memory import return_large_blocks

    return_large_blocks()  # before anything large is allocated (serving/memory.py)

    try:
        config = parse_config(argv)
    except ConfigError as exc:  # a usage error: a bad or missing option, like `ortpack`'s
        print(f"ortpack-serve: error: {exc} (see ortpack-serve --help)", file=sys.stderr)
        return 2
    try:
        sockets = [bind_socket(config.host, config.port, "--port")]
        if config.metrics_port:
            sockets.append(bind_socket(config.host, config.metrics_port, "--metrics-port"))
    except ConfigError as exc:
        print(f"ortpack-serve: error: {exc}", file=sys.stderr)
        return 2
    # a bundle directory already in place is hashed meanwhile, on the core the imports leave idle
    local = Path(config.bundle)
    prehash = Prehash(local) if "://" not in config.bundle and (local / "manifest.json").is_file() else None
    setup_logging(config.log_level, config.log_format)
    with timeline.phase("imports"):  # what both threads below import, once, before they start
        import ortpack.serving.http
        import ortpack.serving.service  # noqa: F401
        from ortpack.kernel.bundle import BundleError
    # The bundle is verified, loaded and checked on a thread, mostly in hashlib and ONNX Runtime
    # (which release the GIL), while this one imports the HTTP stack. A SIGTERM meanwhile (before
    # the server's own handlers) stops the start after the phase in progress, and exits 0.
    stop = early_stop()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortpack-load") as pool:
        loading = pool.submit(build, config, timeline, prehash)
        with timeline.phase("http imports"):
            import_http_stack()
    try:
        service = loading.result()
        if stop.is_set():
            service.join_threads()  # the warm-up runs on: the process must not exit under it
            log.info("%s before ready: stopped without serving", stop.name)
            return 0
    except (BundleError, ConfigError, OSError) as exc:
        print(f"ortpack-serve: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - e.g. ONNX Runtime refusing the model: one line, no traceback
        print(
            f"ortpack-serve: error: cannot load the model: {type(exc).__name__}: {one_line(exc, 400)}",
            file=sys.stderr,
        )
        return 3
    if stop.is_set():  # a signal between the load and now
        service.join_threads()
        log.info("%s before ready: stopped without serving", stop.name)
        return 0
    return serve(service, config, sockets, timeline, stop)


class _Stop(threading.Event):
    name = "a signal"


def early_stop() -> _Stop:
    """SIGTERM and SIGINT before the server serves: remember them (the start ends after the phase in
    progress and exits 0, as a drained server would); the server's own handlers replace these."""
    stop = _Stop()

    def handle(sig: int, frame: Any) -> None:
        stop.name = signal.Signals(sig).name
        if not stop.is_set():
            log.info("%s during start-up: stopping once the current phase ends", stop.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    return stop


def import_http_stack() -> None:
    """Import what `serve` runs (uvicorn, its event loop, the app and routes)."""
    import uvicorn  # noqa: F401

    import ortpack.serving.app
    import ortpack.serving.protocol  # noqa: F401

    with contextlib.suppress(ImportError):  # loop="auto" picks uvloop when it is installed
        import uvloop  # noqa: F401


def build(config: Any, timeline: Any = None, prehash: Any = None) -> Any:
    """Fetch, verify and load the bundle, and begin warming up. A failed start removes what it
    extracted into the cache; a successful one marks it verified for the next start to reuse.
    `timeline` (a ortpack.serving.startup.Timeline) records the phases; `prehash` (a Prehash of the
    bundle directory) has hashed its files already."""
    from ortpack.serving.startup import Timeline

    timeline = timeline or Timeline()
    with timeline.phase("imports"):
        from ortpack.kernel.sources import fetch
        from ortpack.serving.metrics import Metrics
        from ortpack.serving.service import load_service

    cache = Path(config.cache_dir or Path(tempfile.gettempdir()) / "ortpack-bundles")
    cache.mkdir(parents=True, exist_ok=True)
    wait_for_local_bundle(config.bundle, config.bundle_wait_s or (300.0 if os.environ.get(ASYNC_ENV) == "async" else 0))
    began = timeline.now()
    log.debug("bundle %s: fetching and verifying", config.bundle)
    fetched = fetch(config.bundle, cache)
    try:
        signature = check_signature(fetched.path, getattr(config, "trust_key", ""))  # before anything is loaded
        timeline.record("fetch", began)
        # the signature's digests pin manifest.json, and through it every file loaded: a file
        # swapped after the signature check can never be what is served
        service = load_service(
            fetched.path,
            config,
            Metrics(),
            signed=signature.digests if signature else None,
            timeline=timeline,
            known=prehash.known if prehash is not None else None,
        )
    except BaseException:
        fetched.discard()
        raise
    fetched.keep()
    if fetched.reused:
        log.info("bundle: reusing the verified extraction %s", fetched.extraction)
    if signature is None:
        warn_unverified(fetched.path)  # after the load, so a refused start stays one line
    service.begin_warm_up(config)  # on another thread, while the app is built and the port opens
    return service


ASYNC_ENV = "MODEL_INIT_MODE"  # KServe sets it to "async" when a modelcar provides /mnt/models


def wait_for_local_bundle(bundle: str, wait_s: float) -> None:
    """Wait up to `wait_s` for a bundle given as a path to appear (its manifest.json): KServe's
    modelcar sidecar links /mnt/models in while this container starts. URIs are not waited for."""
    if wait_s <= 0 or "://" in bundle:
        return
    manifest = Path(bundle) / "manifest.json"
    deadline = time.monotonic() + wait_s
    if not manifest.exists():
        log.info("waiting up to %.0f s for the bundle at %s", wait_s, bundle)
    while not manifest.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def check_signature(bundle_dir: Path, trust_key: str) -> Any:
    """With a trust key, verify the bundle's signature before anything is loaded (raises BundleError)
    and return it (a `BundleSignature`: the digests it vouches for); without one, return None."""
    if not trust_key:
        return None
    from ortpack.kernel.signing import verify_signature

    signed = verify_signature(bundle_dir, Path(trust_key))
    log.info("bundle signature verified: %d files, key sha256 %s", len(signed.files), signed.key_fingerprint[:16])
    return signed


def warn_unverified(bundle_dir: Path) -> None:
    """One warning line: nothing proves who made this bundle (no --trust-key)."""
    from ortpack.kernel.signing import has_signature

    if has_signature(bundle_dir):
        log.warning("bundle signature (model.sig) NOT checked: no --trust-key given; serving it unverified")
    else:
        log.warning("bundle is unsigned: serving it without a signature check (--trust-key refuses unsigned bundles)")


def ready_line(service: Any, config: Any, seconds: float) -> str:
    import onnxruntime

    from ortpack.kernel.hardware import this_machine

    where = f"http://{f'[{config.host}]' if ':' in config.host else config.host}:{config.port}"
    metrics = f" (metrics on port {config.metrics_port})" if config.metrics_port else ""
    return (
        f"ready: {service.model_name} variant {service.variant.id} "
        f"(ORT {onnxruntime.__version__}, {this_machine().int8_kernel}) on {where}{metrics} in {seconds:.1f} s"
    )


def serve(service: Any, config: Any, sockets: list[socket.socket], timeline: Any, stop: Any = None) -> int:
    listen_began = timeline.now()  # the app built, the port opened
    import uvicorn

    from ortpack.serving.app import serving_app
    from ortpack.serving.protocol import ConnectionLimits, protocol_class

    metrics = service.metrics
    limits = ConnectionLimits(
        max_connections=config.max_connections,
        max_header_bytes=config.max_header_bytes,
        max_headers=config.max_headers,
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        keep_alive_s=config.timeout_keep_alive_s,
        max_discard_bytes=config.max_body_bytes,
        on_reject=lambda reason: metrics.rejections.labels(reason=reason).inc(),
    )

    def on_ready() -> None:
        log.info("%s", ready_line(service, config, timeline.now()), extra={"fields": {"startup": timeline.as_dict()}})
        log.debug("start-up phases (s since start): %s", timeline.summary())

    def begin_draining() -> None:
        service.draining = True  # readiness 503; inference still served until uvicorn stops
        limits.draining = True  # answers carry Connection: close
        metrics.ready.set(0)

    class Server(uvicorn.Server):
        drain_at: float | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            timeline.record("listen", listen_began)  # the port listens
            if stop is not None and stop.is_set():  # a signal before uvicorn's handlers were in place
                log.info("%s during start-up: stopping", stop.name)
                begin_draining()
                self.should_exit = True

        def handle_exit(self, sig: int, frame: Any) -> None:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            if self.drain_at is None and config.shutdown_grace_s > 0 and not self.should_exit:
                begin_draining()
                self.drain_at = time.monotonic() + config.shutdown_grace_s
                log.info("%s: readiness 503; still serving for %g s, then draining", name, config.shutdown_grace_s)
                return
            begin_draining()
            if not self.should_exit:
                log.info("%s: stopped accepting; answering the requests in flight", name)
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful shutdown (so the process dies of it);
            # a drained server has done its job and exits 0. tests check the code.
            self._captured_signals.clear()

        async def on_tick(self, counter: int) -> bool:
            if self.drain_at is not None and not self.should_exit and time.monotonic() >= self.drain_at:
                self.should_exit = True
                log.info(
                    "grace period over: stopped accepting; answering %d requests in flight",
                    len(self.server_state.tasks),
                )
            return await super().on_tick(counter)

    server = Server(uvicorn_config(serving_app(service, config, on_ready), protocol_class(limits), config))
    server.run(sockets=sockets)
    log.info("stopped: every accepted request answered")
    return 0 if server.started else 1


def uvicorn_config(app: Any, protocol: Any, config: Any) -> Any:
    """uvicorn's settings for the app: ortpack's HTTP protocol (its connection limits), no
    websockets, no access log (the app logs), keep-alive and drain timeouts from the options."""
    import uvicorn

    return uvicorn.Config(
        app,
        loop="auto",  # uvloop when installed (measured ~10% more throughput than asyncio's loop)
        http=protocol,
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,
        timeout_keep_alive=config.timeout_keep_alive_s,
        timeout_graceful_shutdown=config.drain_timeout_s,
        backlog=min(2048, max(128, config.max_connections)),
        server_header=False,
        date_header=False,
    )


if __name__ == "__main__":
    sys.exit(main())
