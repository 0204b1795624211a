"""The build side's error types (the base and the one-line wording are the kernel's).

User and data problems subclass `ValueError`; problems with this machine or environment subclass
`RuntimeError`. The CLI prints `str(error)` on one line and exits non-zero; nothing here should
need a traceback to be understood.
"""

from __future__ import annotations

# the kernel's base and wording, used on this side too
from ortpack.kernel.errors import OrtpackError
from ortpack.kernel.errors import and_list as and_list
from ortpack.kernel.errors import did_you_mean as did_you_mean
from ortpack.kernel.errors import one_line as one_line


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


class SourceError(ModelLoadError):
    """A model URI is malformed, names nothing, or holds what ortpack refuses to load (pickled weights)."""


class SourceUnreachableError(OrtpackError, RuntimeError):
    """The store behind a model URI cannot be reached, or refused the credentials."""
