"""The server's error types and the one table that maps them to HTTP statuses.

Every error answer has one JSON shape (OpenAI's, which KServe clients also read as JSON):

    {"error": {"message": "...", "type": "invalid_request", "code": 400}}

The connection layer (serving/protocol.py) writes the same shape for what it refuses before a
route runs: 400 (malformed HTTP), 408 (slow client), 431 (headers too large), 503 (too many
connections).
"""

from __future__ import annotations

from ortpack.kernel.errors import InputError, InputTooLargeError, UnsupportedInputError


class ServeError(Exception):
    """Base class: `message` is sent to the client; `headers` are added to the answer."""

    kind = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidRequestError(ServeError, ValueError):
    kind = "invalid_request"


class UnauthorizedError(ServeError, ValueError):
    kind = "unauthorized"


class ModelNotFoundError(ServeError, LookupError):
    kind = "model_not_found"


class RouteNotFoundError(ServeError, LookupError):
    kind = "not_found"


class MethodNotAllowedError(ServeError, LookupError):
    kind = "method_not_allowed"


class PayloadTooLargeError(ServeError, ValueError):
    kind = "payload_too_large"


class UnsupportedMediaTypeError(ServeError, ValueError):
    kind = "unsupported_media_type"


class UnprocessableError(ServeError, ValueError):
    kind = "unprocessable"


class OverloadedError(ServeError, RuntimeError):
    kind = "overloaded"


class NotReadyError(ServeError, RuntimeError):
    kind = "not_ready"


class DeadlineExceededError(ServeError, TimeoutError):
    kind = "deadline_exceeded"


class RequestTimeoutError(ServeError, TimeoutError):
    """The client did not send its request (headers or body) in time."""

    kind = "request_timeout"


class ClientClosedError(ServeError, ConnectionError):
    """The client went away before its answer (nginx's 499: logged and counted, never sent)."""

    kind = "client_closed_request"


class InferenceError(ServeError, RuntimeError):
    kind = "inference_error"


# error type -> HTTP status. The first match in this order wins (subclasses before bases).
STATUS: tuple[tuple[type[ServeError], int], ...] = (
    (InvalidRequestError, 400),
    (UnauthorizedError, 401),
    (ModelNotFoundError, 404),
    (RouteNotFoundError, 404),
    (MethodNotAllowedError, 405),
    (RequestTimeoutError, 408),
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (UnprocessableError, 422),
    (OverloadedError, 429),
    (ClientClosedError, 499),
    (InferenceError, 500),
    (NotReadyError, 503),
    (DeadlineExceededError, 504),
    (ServeError, 500),
)


def from_input_error(error: InputError) -> ServeError:
    """The answer to input an engine refused (ortpack.kernel.errors): 413 over a limit, 415 of a
    kind it does not take, 400 otherwise."""
    if isinstance(error, InputTooLargeError):
        return PayloadTooLargeError(str(error))
    if isinstance(error, UnsupportedInputError):
        return UnsupportedMediaTypeError(str(error))
    return InvalidRequestError(str(error))


def status_of(error: ServeError) -> int:
    for cls, status in STATUS:
        if isinstance(error, cls):
            return status
    return 500


def error_body(error: ServeError) -> dict[str, dict[str, object]]:
    return {"error": {"message": error.message, "type": error.kind, "code": status_of(error)}}
