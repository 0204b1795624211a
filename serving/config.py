"""Server configuration: every option is a command-line flag and an `ORTPACK_<NAME>` variable.

Flags win over the environment, the environment over the defaults. Nothing is read at import
time: `parse_config(argv, environ)` does it when the server starts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


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
    max_batch_size: int = 32
    max_batch_delay_ms: float = 0.0
    max_queue_size: int = 1024
    request_timeout_ms: float = 30_000.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_items: int = 2048
    max_tokens: int = 0  # default: the bundle's tokenizer max_length
    max_image_pixels: int = 40_000_000
    max_batch_pixels: int = 4_000_000
    jpeg_draft: bool = False
    truncate: bool = True
    buckets: tuple[int, ...] = ()  # default: powers of two from 16 up to max_tokens
    workers: int = 0  # model threads running ORT at once; default: the cores available
    intra_op_threads: int = 1
    warmup: bool = True
    cache_dir: str = ""  # where fetched bundles go; default: a directory under the temp dir
    trust_key: str = ""  # PEM public key; when set, the bundle's model.sig must verify with it
    log_level: str = "info"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.port <= 65535, f"--port must be in 1..65535, got {self.port}"),
            (1 <= self.max_batch_size <= 4096, f"--max-batch-size must be in 1..4096, got {self.max_batch_size}"),
            (self.max_batch_delay_ms >= 0, f"--max-batch-delay-ms must be >= 0, got {self.max_batch_delay_ms}"),
            (self.max_queue_size >= 1, f"--max-queue-size must be >= 1, got {self.max_queue_size}"),
            (self.request_timeout_ms > 0, f"--request-timeout-ms must be > 0, got {self.request_timeout_ms}"),
            (self.max_body_bytes >= 1024, f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}"),
            (self.max_items >= 1, f"--max-items must be >= 1, got {self.max_items}"),
            (self.max_tokens >= 0, f"--max-tokens must be >= 0, got {self.max_tokens}"),
            (self.max_image_pixels >= 1024, f"--max-image-pixels must be >= 1024, got {self.max_image_pixels}"),
            (self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (self.intra_op_threads >= 0, f"--intra-op-threads must be >= 0, got {self.intra_op_threads}"),
            (all(b > 0 for b in self.buckets), f"--buckets must be positive, got {self.buckets}"),
            (self.log_level in ("debug", "info", "warning", "error"), f"unknown --log-level {self.log_level!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def worker_count(self) -> int:
        return self.workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


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
    "bundle": "bundle to serve: a directory, file://, http(s):// (.tar) or s3:// URI",
    "variant": "variant id to load, or 'auto' for the best one for this hardware",
    "host": "address to bind (default 127.0.0.1; use 0.0.0.0 in a container)",
    "port": "port to bind",
    "model_name": "model name clients use (default: the bundle's name)",
    "api_key": "require 'Authorization: Bearer <key>' on every route but health",
    "max_batch_size": "most items in one model call",
    "max_batch_delay_ms": "how long a batch may wait to fill when the model is idle (0: never wait)",
    "max_queue_size": "most items waiting; beyond it requests get 429 with Retry-After",
    "request_timeout_ms": "per-request deadline; a request not answered in time gets 504",
    "max_body_bytes": "largest request body; larger gets 413",
    "max_items": "most texts in one request; more gets 413",
    "max_tokens": "most tokens per text (default: the bundle's max length)",
    "truncate": "truncate texts longer than --max-tokens (true) or answer 413 (false)",
    "max_image_pixels": "image bundles: largest image in pixels (checked from the header before decoding; 413)",
    "max_batch_pixels": "image bundles: most pixels in one model call (a batch always holds one image)",
    "jpeg_draft": "image bundles: decode JPEGs at a reduced DCT scale (no smaller than the resize size); "
    "much faster on large photos, but pixels differ from the validated full decode (see README)",
    "buckets": "comma-separated padded-length ceilings (default: every 4 tokens to 32, 8 to 64, 16 to 128, 32 on)",
    "workers": "model calls running at once (default: one per available core)",
    "intra_op_threads": "ONNX Runtime threads per model call (default 1)",
    "warmup": "run every bucket shape once before reporting ready",
    "cache_dir": "where fetched bundles are extracted (default: under the temp directory)",
    "trust_key": "PEM public key; refuse bundles whose signature is missing or does not verify with it",
    "log_level": "debug, info, warning or error",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ortpack-serve",
        description="Serve an ortpack bundle with ONNX Runtime: OpenAI embeddings, Open Inference Protocol v2, "
        "Prometheus metrics. Every option can also be set as ORTPACK_<OPTION> (e.g. ORTPACK_MAX_BATCH_SIZE).",
    )
    for f in fields(ServeConfig):
        if f.name == "extra":
            continue
        flag = "--" + f.name.replace("_", "-")
        env = "ORTPACK_" + f.name.upper()
        default = "required" if f.name == "bundle" else f.default
        parser.add_argument(
            flag, type=_converter(f.name), default=None, help=f"{_HELP[f.name]} [{env}; default {default!r}]"
        )
    return parser


def _converter(name: str) -> Callable[[str], Any]:
    """How the text of a flag or an ORTPACK_* variable becomes the field's value."""
    if name == "buckets":
        return _buckets
    default = next(f.default for f in fields(ServeConfig) if f.name == name)
    converters: dict[type, Callable[[str], Any]] = {int: int, float: float, bool: _bool}
    return converters.get(type(default), str)


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
    return ServeConfig(**values)
