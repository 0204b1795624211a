"""Server configuration: every option is a command-line flag and an `ORTPACK_<NAME>` variable.

Flags win over the environment, the environment over the defaults. Nothing is read at import
time: `parse_config(argv, environ)` does it when the server starts. Boolean options work bare
(`--access-log`), with a value (`--warmup false`, `ORTPACK_WARMUP=false`) or negated
(`--no-warmup`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ortpack import __version__
from ortpack.kernel.policy import PolicyError, parse_requirements, split_expressions
from ortpack.serving.memory import parse_bytes


class ConfigError(ValueError):
    """A bad option; the server exits with its one-line message."""


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    bundle: str
    variant: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8080
    model_name: str = ""  # default: the bundle's name
    api_key: str = ""
    api_key_file: str = ""  # read by parse_config into api_key (the key then never shows in `ps`)
    max_batch_size: int = 32
    max_batch_tokens: int = 2048
    max_batch_delay_ms: float = 0.0
    max_batch_ms: float = 50.0  # a batch stops at this many predicted ms (what the fast lane may wait)
    fast_lane_ms: float = 50.0  # requests predicted to take at most this run first
    admission: bool = True  # refuse (429) a request that cannot finish before its deadline
    max_memory: str = ""  # bytes (or K/M/G suffix) the server may use; default: the container's limit
    max_queue_size: int = 2048
    request_timeout_ms: float = 30_000.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_items: int = 1024
    max_tokens: int = 0  # default: the bundle's tokenizer max_length
    max_text_chars: int = 0  # default: 100 x max_tokens
    truncate: bool = True
    max_image_pixels: int = 40_000_000
    max_batch_pixels: int = 0  # 0: one image per call on the CPU, 4 MP elsewhere (engine_options)
    decode: str = "auto"  # image bundles: auto (the bundle's validated default), exact or reduced
    buckets: tuple[int, ...] = ()  # default: ortpack.serving.text.default_buckets (4 apart to 32, 8 to 64, ...)
    workers: int = 0  # model threads running ORT at once; default: the cores available
    intra_op_threads: int = 1
    lone_threads: int = 0  # default: workers x intra-op threads (every core the server uses)
    warmup: bool = True
    # text-generation bundles (serving/tasks/text_generation.py)
    default_max_tokens: int = 512
    max_running_sequences: int = 32
    max_waiting_sequences: int = 256
    prefill_chunk: int = 512
    prefill_share: float = 0.75
    kv_cache_share: float = 0.8
    max_connections: int = 1024
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    timeout_keep_alive_s: float = 5.0
    shutdown_grace_s: float = 0.0
    metrics_port: int = 0  # 0: /metrics only on the main port
    cache_dir: str = ""  # where fetched bundles go; default: a directory under the temp dir
    bundle_wait_s: float = 0.0  # a local bundle that is not there yet is waited for this long
    trust_key: str = ""  # PEM public key; when set, the bundle's model.sig must verify with it
    require: tuple[str, ...] = ()  # admission policy (kernel/policy.py): every expression must hold
    access_log: bool = False
    log_format: str = "text"
    log_level: str = "info"

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.port <= 65535, f"--port must be in 1..65535, got {self.port}"),
            (1 <= self.max_batch_size <= 4096, f"--max-batch-size must be in 1..4096, got {self.max_batch_size}"),
            (self.max_batch_tokens >= 1, f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}"),
            (self.max_batch_delay_ms >= 0, f"--max-batch-delay-ms must be >= 0, got {self.max_batch_delay_ms}"),
            (self.max_batch_ms > 0, f"--max-batch-ms must be > 0, got {self.max_batch_ms}"),
            (self.fast_lane_ms >= 0, f"--fast-lane-ms must be >= 0, got {self.fast_lane_ms}"),
            (self.max_queue_size >= 1, f"--max-queue-size must be >= 1, got {self.max_queue_size}"),
            (self.request_timeout_ms > 0, f"--request-timeout-ms must be > 0, got {self.request_timeout_ms}"),
            (self.max_body_bytes >= 1024, f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}"),
            (self.max_items >= 1, f"--max-items must be >= 1, got {self.max_items}"),
            (
                self.max_items <= self.max_queue_size,
                f"--max-items {self.max_items} exceeds --max-queue-size {self.max_queue_size}: such a request "
                "could never be queued; lower --max-items or raise --max-queue-size",
            ),
            (self.max_tokens >= 0, f"--max-tokens must be >= 0, got {self.max_tokens}"),
            (self.max_text_chars >= 0, f"--max-text-chars must be >= 0, got {self.max_text_chars}"),
            (self.max_image_pixels >= 1024, f"--max-image-pixels must be >= 1024, got {self.max_image_pixels}"),
            (self.max_batch_pixels >= 0, f"--max-batch-pixels must be >= 0, got {self.max_batch_pixels}"),
            (self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (self.intra_op_threads >= 0, f"--intra-op-threads must be >= 0, got {self.intra_op_threads}"),
            (self.lone_threads >= 0, f"--lone-threads must be >= 0, got {self.lone_threads}"),
            (all(b > 0 for b in self.buckets), f"--buckets must be positive, got {self.buckets}"),
            (self.default_max_tokens >= 1, f"--default-max-tokens must be >= 1, got {self.default_max_tokens}"),
            (
                1 <= self.max_running_sequences <= 1024,
                f"--max-running-sequences must be in 1..1024, got {self.max_running_sequences}",
            ),
            (
                self.max_waiting_sequences >= 0,
                f"--max-waiting-sequences must be >= 0, got {self.max_waiting_sequences}",
            ),
            (self.prefill_chunk >= 16, f"--prefill-chunk must be >= 16, got {self.prefill_chunk}"),
            (0 < self.prefill_share <= 10, f"--prefill-share must be in (0, 10], got {self.prefill_share}"),
            (0 < self.kv_cache_share < 1, f"--kv-cache-share must be between 0 and 1, got {self.kv_cache_share}"),
            (self.max_connections >= 1, f"--max-connections must be >= 1, got {self.max_connections}"),
            (self.max_header_bytes >= 1024, f"--max-header-bytes must be >= 1024, got {self.max_header_bytes}"),
            (self.max_headers >= 1, f"--max-headers must be >= 1, got {self.max_headers}"),
            (self.header_timeout_s > 0, f"--header-timeout-s must be > 0, got {self.header_timeout_s}"),
            (self.body_timeout_s > 0, f"--body-timeout-s must be > 0, got {self.body_timeout_s}"),
            (self.timeout_keep_alive_s > 0, f"--timeout-keep-alive-s must be > 0, got {self.timeout_keep_alive_s}"),
            (self.shutdown_grace_s >= 0, f"--shutdown-grace-s must be >= 0, got {self.shutdown_grace_s}"),
            (self.bundle_wait_s >= 0, f"--bundle-wait-s must be >= 0, got {self.bundle_wait_s}"),
            (0 <= self.metrics_port <= 65535, f"--metrics-port must be in 0..65535, got {self.metrics_port}"),
            (self.metrics_port != self.port, f"--metrics-port must differ from --port {self.port}"),
            (
                self.decode in ("auto", "exact", "reduced"),
                f"--decode must be auto, exact or reduced, got {self.decode!r}",
            ),
            (self.log_format in ("text", "json"), f"--log-format must be text or json, got {self.log_format!r}"),
            (self.log_level in ("debug", "info", "warning", "error"), f"unknown --log-level {self.log_level!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

        try:
            parse_requirements(self.require)
        except PolicyError as exc:
            raise ConfigError(str(exc)) from None
        try:
            self.memory_bytes  # noqa: B018 - parsed now, refused in one line
        except ValueError as exc:
            raise ConfigError(f"--max-memory: {exc}") from None

    @property
    def worker_count(self) -> int:
        return self.workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)

    @property
    def lone_thread_count(self) -> int:
        """Intra-op threads for a batch that runs alone; no more than --intra-op-threads means the
        lone path is off."""
        return self.lone_threads or self.worker_count * max(1, self.intra_op_threads)

    @property
    def memory_bytes(self) -> int | None:
        """--max-memory in bytes (None: not given)."""
        return parse_bytes(self.max_memory) if self.max_memory else None

    @property
    def drain_timeout_s(self) -> float:
        """How long shutdown waits for accepted requests after the grace period: each is answered
        within the request deadline (from its arrival) or its body timeout, plus a margin."""
        return max(self.request_timeout_ms / 1000.0, self.body_timeout_s) + 5.0


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"not a boolean: {text!r}")


def _buckets(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--buckets must be comma-separated integers, got {text!r}") from None


_HELP = {
    "bundle": "bundle to serve: a directory, file://, http(s):// (.tar), s3:// or oci:// URI",
    "variant": "variant id to load, or 'auto' for the best one for this hardware",
    "host": "address to bind (use 0.0.0.0 in a container)",
    "port": "port to bind",
    "model_name": "model name clients use",
    "api_key": "require 'Authorization: Bearer <key>' on every route but health (prefer --api-key-file)",
    "api_key_file": "read the API key from this file (first line), so it never shows in the process list",
    "max_batch_size": "most items in one model call",
    "max_batch_tokens": "text bundles: most padded tokens (texts x the longest) in one model call; a batch always "
    "holds one text. Bounds how long a request waits for a busy worker",
    "max_batch_delay_ms": "how long a batch may wait to fill when the model is idle (0: never wait)",
    "max_batch_ms": "a batch stops at this many milliseconds of predicted model time (measured batch times): "
    "how long a small request may wait for a busy worker",
    "fast_lane_ms": "requests whose predicted model time is at most this run before larger ones",
    "admission": "refuse at once (429, Retry-After) a request predicted to miss its deadline given the work "
    "admitted ahead of it, instead of letting every request of an overload time out",
    "max_memory": "memory the server may use, in bytes (K, M, G suffixes): request bodies and what they become "
    "are admitted within what is left of it after the model; beyond, 429 before the body is read",
    "max_queue_size": "most items waiting; a request that does not fit now gets 429 with Retry-After",
    "request_timeout_ms": "per-request deadline from its arrival (body, tokenizing, queue, model): 504",
    "max_body_bytes": "largest request body; larger gets 413",
    "max_items": "most texts or images in one request (413); at most --max-queue-size",
    "max_tokens": "most tokens per text",
    "max_text_chars": "most characters per text before tokenizing: longer texts are cut there with --truncate, "
    "refused with 413 without it",
    "truncate": "truncate texts longer than --max-tokens (true) or answer 413 (false)",
    "max_image_pixels": "image bundles: largest image in pixels (checked from the header before decoding; 413)",
    "max_batch_pixels": (
        "image bundles: most pixels in one model call (a batch always holds one image); "
        "default 0: one image per call on the CPU, 4 MP elsewhere; a value batches by size on the CPU too"
    ),
    "decode": "image bundles: how JPEGs are decoded. auto: the bundle's validated default; exact: the full "
    "decode the reference used; reduced: the smallest DCT scale the parity gate validated (refused at start when "
    "the gate did not validate it)",
    "buckets": "comma-separated padded-length ceilings",
    "workers": "model calls running at once",
    "intra_op_threads": "ONNX Runtime threads per model call",
    "lone_threads": "ONNX Runtime threads for a batch that runs alone (no other batch running, nothing queued): "
    "at low load one request uses every core, under load the workers run side by side. A second session of the "
    "model, spinning while it runs; 1 (or no more than --intra-op-threads) turns it off",
    "warmup": "run every bucket shape once before reporting ready",
    "default_max_tokens": "text-generation: the max_tokens of a request that names none (OpenAI completions: 16), "
    "within the context",
    "max_running_sequences": "text-generation: most sequences decoded together in one batch",
    "max_waiting_sequences": "text-generation: most admitted sequences waiting for their prefill; more get 429",
    "prefill_chunk": "text-generation: most prompt tokens prefilled in one step",
    "prefill_share": "text-generation: while other sequences decode, a prompt's prefill chunk takes at most this "
    "share of a decode step's time, as predicted from measured calls (a 2,000-token prompt arriving beside 8 "
    "streams: share 0.75 gave 2.1x their p99 time between tokens, not 1.75x: see docs/generation.md); higher: long "
    "prompts start sooner, the others wait longer",
    "kv_cache_share": "text-generation: share of the memory left once the model is loaded that the key/value cache "
    "may hold; a request holds its prompt plus max_tokens, and one that does not fit gets 429",
    "max_connections": "most open client connections; more are answered 503 and closed",
    "max_header_bytes": "largest request line + headers in bytes; larger gets 431 and the connection closes",
    "max_headers": "most request header fields; more gets 431",
    "header_timeout_s": "seconds a client has to send its request line and headers once it starts (408, closed)",
    "body_timeout_s": "seconds a client has to send its body once the headers arrived (408, closed)",
    "timeout_keep_alive_s": "seconds an idle connection stays open (also a new one that sends nothing)",
    "shutdown_grace_s": "after SIGTERM, keep serving this long with readiness 503 (so endpoints drop the pod), "
    "then stop accepting and answer every accepted request",
    "metrics_port": "also serve /metrics on this port, without the API key (0: only on --port, with the key)",
    "cache_dir": "where fetched bundles are extracted (one verified copy per archive digest)",
    "bundle_wait_s": "wait this long for a bundle directory that is not there yet (a KServe modelcar links it in "
    "while the server starts; MODEL_INIT_MODE=async, which KServe sets then, makes the default 300)",
    "trust_key": "PEM public key; refuse bundles whose signature is missing or does not verify with it",
    "require": "admission policy, repeatable: VARIANT_OR_PRECISION.METRIC OP NUMBER against the variant's recorded "
    "gate values (e.g. int8.min_cosine>=0.95) or space=ID (its embedding space); a variant that misses is not "
    "served, a bundle with none left is refused before loading. The variable takes ';'-separated expressions",
    "access_log": "log one line per request (route, status, items, tokens, queue and inference ms, request id)",
    "log_format": "text or json (one JSON object per line)",
    "log_level": "debug, info, warning or error",
}

# Defaults whose field value is a placeholder for something decided at start.
_DEFAULT_TEXT = {
    "bundle": "required",
    "model_name": "the bundle's name",
    "api_key": "none",
    "api_key_file": "none",
    "max_tokens": "the bundle's max length",
    "max_text_chars": "100 x --max-tokens",
    "buckets": "4 tokens apart to 32, 8 to 64, 16 to 128, 32 beyond",
    "workers": "one per available core",
    "lone_threads": "--workers x --intra-op-threads",
    "metrics_port": "none",
    "cache_dir": "ortpack-bundles under the temp directory",
    "bundle_wait_s": "0, or 300 with MODEL_INIT_MODE=async",
    "trust_key": "none",
    "require": "none",
    "max_memory": "the container's memory limit (cgroup), else the machine's memory",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ort = version("onnxruntime")
    except PackageNotFoundError:
        try:
            ort = version("onnxruntime-gpu")
        except PackageNotFoundError:
            ort = "not installed"
    return f"ortpack-serve {__version__} (onnxruntime {ort})"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line (main prints it), not usage + message
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ortpack-serve",
        description="Serve an ortpack bundle with ONNX Runtime: OpenAI embeddings, Open Inference Protocol v2, "
        "Prometheus metrics. Every option can also be set as ORTPACK_<OPTION> (e.g. ORTPACK_MAX_BATCH_SIZE); "
        "flags win over the environment.",
    )
    parser.add_argument("--version", action="version", version=_version())
    for f in fields(ServeConfig):
        flag = "--" + f.name.replace("_", "-")
        env = "ORTPACK_" + f.name.upper()
        default = _DEFAULT_TEXT.get(f.name, f.default)
        shown = default if isinstance(default, str) and f.name in _DEFAULT_TEXT else repr(default)
        if f.name == "require":
            parser.add_argument(
                flag, action="append", default=None, metavar="EXPR", help=f"{_HELP[f.name]} [{env}; default {shown}]"
            )
        elif isinstance(f.default, bool):
            shown = "true" if f.default else "false"
            parser.add_argument(
                flag,
                type=_bool,
                nargs="?",
                const=True,
                default=None,
                metavar="BOOL",
                help=f"{_HELP[f.name]} [{env}; default {shown}; bare {flag} means true, --no-{flag[2:]} false]",
            )
            parser.add_argument(
                "--no-" + f.name.replace("_", "-"),
                dest=f.name,
                action="store_const",
                const=False,
                help=argparse.SUPPRESS,
            )
        else:
            parser.add_argument(
                flag, type=_converter(f.name), default=None, help=f"{_HELP[f.name]} [{env}; default {shown}]"
            )
    return parser


def _converter(name: str) -> Callable[[str], Any]:
    """How the text of a flag or an ORTPACK_* variable becomes the field's value."""
    if name == "buckets":
        return _buckets
    if name == "require":
        return lambda text: tuple(split_expressions(text))
    default = next(f.default for f in fields(ServeConfig) if f.name == name)
    converters: dict[type, Callable[[str], Any]] = {int: int, float: float, bool: _bool}
    return converters.get(type(default), str)


def read_key_file(path: str) -> str:
    """The API key in `path`: its first line, stripped (a Kubernetes Secret file may end in a newline)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ConfigError(f"cannot read --api-key-file {path}: {reason}") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise ConfigError(f"--api-key-file {path} is empty")
    return key


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Flags, then ORTPACK_* variables, then defaults. Raises ConfigError with one line."""
    environ = os.environ if environ is None else environ
    args = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    for name, value in args.items():
        if value is None:
            env_value = environ.get("ORTPACK_" + name.upper())
            if env_value is None or env_value == "":
                continue
            try:
                value = _converter(name)(env_value)
            except ValueError as exc:
                raise ConfigError(f"ORTPACK_{name.upper()}: {exc}") from None
        values[name] = value
    if not values.get("bundle"):
        raise ConfigError("no bundle given (--bundle PATH_OR_URI or ORTPACK_BUNDLE)")
    if "require" in values:
        values["require"] = tuple(values["require"])
    if values.get("api_key_file"):
        if values.get("api_key"):
            raise ConfigError("give the API key once: --api-key or --api-key-file, not both")
        values["api_key"] = read_key_file(values["api_key_file"])
    return ServeConfig(**values)
