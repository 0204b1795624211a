"""The library's error types.

User and data problems subclass `ValueError`; problems with this machine or environment subclass
`RuntimeError`. The CLI prints `str(error)` on one line and exits non-zero; nothing here should
need a traceback to be understood.
"""

from __future__ import annotations


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
