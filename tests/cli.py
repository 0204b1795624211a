"""The `ortpack` CLI as the tests run it: a real subprocess, and the one-line error it must print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def ortpack(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """`ortpack ARGS` in a subprocess, output captured: this environment without the variables
    starting with `drop`, updated with `env`."""
    base = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    return subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one `ortpack: error:` line of a failed command (and no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ortpack: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    line = error_line(result)
    assert fragment in line, line
