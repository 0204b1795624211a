"""What every command module shares: the exit codes, the `ortpack` logger (progress on stderr),
and the directories commands read from or write to."""

from __future__ import annotations

import logging
from pathlib import Path

from ortpack.components.core.errors import InvalidSpecError

EXIT_GATE, EXIT_INPUT, EXIT_ENV, EXIT_INTERNAL, EXIT_INTERRUPT = 1, 2, 3, 70, 130

log = logging.getLogger("ortpack")


def existing_dir(value: str, what: str) -> Path:
    """The directory an option names, which must exist (`what`: the error's word for it)."""
    path = Path(value)
    if not path.is_dir():
        raise InvalidSpecError(f"{what} directory not found: {value}")
    return path


def fresh_dir(path: Path, force: bool) -> Path:
    """An output directory to create: refused when it exists, unless `force` (then removed first)."""

    if path.exists():
        if not force:
            raise InvalidSpecError(f"output directory exists: {path} (use --force to replace it)")
        import shutil

        shutil.rmtree(path)
    return path
