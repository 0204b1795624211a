"""The library's error types.

User and data problems subclass `ValueError`; problems with this machine or environment subclass
`RuntimeError`. The CLI prints `str(error)` on one line and exits non-zero; nothing here should
need a traceback to be understood.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class OrtpackError(Exception):
    """Base class of every error the library raises on purpose."""


class InvalidSpecError(OrtpackError, ValueError):
    """A spec or option is out of range, unknown or inconsistent."""


class ModelLoadError(OrtpackError, ValueError):
    """The model source is missing, is not a model, or its weights are corrupt."""


class ExportError(OrtpackError, ValueError):
    """The model loaded but could not be exported to a valid ONNX graph."""


class ParityError(OrtpackError, ValueError):
    """A variant missed its parity gate; carries the one-line summary of every miss."""


class NoVariantPassedError(ParityError):
    """Every variant missed its gate, so there is nothing to package."""


class UnsupportedHereError(OrtpackError, RuntimeError):
    """The requested target or precision cannot be built or run in this environment."""


def one_line(exc: BaseException | str, limit: int | None = None) -> str:
    """`exc`'s message on one line (whitespace collapsed), at most `limit` characters; an exception
    without a message gives its type name. Every error this project prints goes through here."""
    text = " ".join(str(exc).split())
    if not text and isinstance(exc, BaseException):
        text = type(exc).__name__
    return text if limit is None or len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def did_you_mean(value: str, known: Iterable[str]) -> str:
    """`"; did you mean 'NAME'?"` for the known name `value` is closest to, ignoring case (a wrong
    case, a typo), else "": the end of an "unknown X" message."""
    names = {name.lower(): name for name in known}
    key = value.strip().lower()
    close = [key] if key in names else difflib.get_close_matches(key, list(names), n=1, cutoff=0.7)
    return f"; did you mean {names[close[0]]!r}?" if close else ""


def and_list(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class SourceError(ModelLoadError):
    """A model URI is malformed, names nothing, or holds what ortpack refuses to load (pickled weights)."""


class SourceUnreachableError(OrtpackError, RuntimeError):
    """The store behind a model URI cannot be reached, or refused the credentials."""
