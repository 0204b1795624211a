"""The `ortpack` command line.

Every command validates its options before heavy work, prints progress to stderr, and on
failure prints one line `ortpack: error: ...` and exits non-zero:

    0  success
    1  the parity gate failed (nothing was shipped)
    2  bad input: options, paths, models, bundles
    3  this environment cannot do it (a missing provider, a full disk, ...)
   70  an internal error (a bug: run again with --debug for the traceback)
  130  interrupted (SIGINT); 143 terminated (SIGTERM), after the same clean-up

`ortpack bundle diff` answers with its verdict instead: 0 drop-in, 3 re-index, 4 incompatible (and 2
for anything that stops the comparison, an unreachable source included).

`--debug` prints the traceback too and keeps the exit code.

Here: the parser's assembly, `main`, and the one-line error. Each command with its flags lives in
a module of its own: pipeline.py (run, compile, submit; their arguments in pipeline_arguments.py),
steps.py (build, export, optimize, validate, benchmark, package), bundle.py (`bundle ACTION`);
options.py holds the flag groups they share, common.py the exit codes and the logger.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from ortpack import __version__
from ortpack.components.core.errors import OrtpackError, ParityError, one_line
from ortpack.pipelines.cli import bundle, pipeline, steps
from ortpack.pipelines.cli.common import EXIT_ENV, EXIT_GATE, EXIT_INPUT, EXIT_INTERNAL, log
from ortpack.pipelines.cli.pipeline import _print_compatibility

__all__ = ["_print_compatibility", "build_parser", "main"]


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"[ortpack {time.monotonic() - self.start:6.1f}s]"
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"{prefix} {level}{record.getMessage()}"


def _setup_logging(verbosity: int, debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    # Third-party libraries (quantization, exporter) log and warn freely; keep stderr readable.
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.ERROR)
    if not debug:
        warnings.filterwarnings("ignore")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error (`ortpack: error: ...`, exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """Every command with its flags: each command module adds its own (`add_commands`)."""
    parser = _Parser(
        prog="ortpack",
        description="Turn a PyTorch model into a verified, hardware-optimized ONNX Runtime bundle.",
    )
    parser.add_argument("--version", action="version", version=f"ortpack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pipeline.add_commands(sub)  # run, compile, submit
    steps.add_commands(sub)  # build, export, optimize, validate, benchmark, package
    bundle.add_commands(sub)  # bundle verify, diff, check, sign, push, pull
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(-args.quiet + args.verbose, args.debug)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args))
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        print("ortpack: interrupted", file=sys.stderr)
        return 128 + int(signum)
    except Exception as exc:  # noqa: BLE001 - every error ends as one line and an exit code
        if args.debug:
            import traceback

            traceback.print_exc()
        return _report(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM cleans up like SIGINT: stop the step subprocesses we started (kfp.local's), then
    unwind through every `finally` (temporary directories are removed) and exit 143."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGINT)
    except ImportError:
        pass
    raise KeyboardInterrupt(signum)


def _report(exc: Exception) -> int:

    message = one_line(exc)
    if isinstance(exc, ParityError):
        code = EXIT_GATE
    elif isinstance(exc, ValueError):
        code = EXIT_INPUT
    elif isinstance(exc, RuntimeError | OSError):
        code = EXIT_ENV
    else:
        code = EXIT_INTERNAL
    if code == EXIT_INTERNAL or not isinstance(exc, OrtpackError | ValueError | OSError | RuntimeError):
        message = f"internal error: {type(exc).__name__}: {message} (run again with --debug for the traceback)"
    print(f"ortpack: error: {message}", file=sys.stderr)
    return code
