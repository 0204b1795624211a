"""The kernel's error types, and the one-line wording every error of the project goes through.

User and data problems subclass `ValueError`; problems with this machine or environment subclass
`RuntimeError`. The build side (ortpack.components.core.errors) and the server
(ortpack.serving.errors, which maps each type here to an HTTP status) build on these.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class OrtpackError(Exception):
    """Base class of every error the project raises on purpose."""


class InputError(OrtpackError, ValueError):
    """Input data an engine refuses: an image that is not one, a token id outside the vocabulary,
    an empty text (a server answers 400)."""


class InputTooLargeError(InputError):
    """Input over a limit: too many pixels, tokens or characters (413)."""


class UnsupportedInputError(InputError):
    """Input of a kind the engine does not take: a GIF where JPEG, PNG or WebP is expected (415)."""


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
