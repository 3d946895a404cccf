"""One error hierarchy for the reference server.

Each class carries the HTTP status and the gRPC status-code name that Triton uses for it, so the
REST middleware and the gRPC interceptor read one mapping (Triton: INTERNAL→500, NOT_FOUND→404,
UNAVAILABLE→503, UNSUPPORTED→501, INVALID_ARG and the rest→400).

v2kit raises its own errors, and this module alone says what they are to a client (`server_error`):
a `CodecError` is a malformed request (InvalidArgument), a `ConfigError` a malformed model
configuration (ModelConfigError).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from v2kit.codec import CodecError
from v2kit.model_config import ConfigError

P = ParamSpec("P")
R = TypeVar("R")


class ServerError(Exception):
    """Base of every error the server reports to a client."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ServerError):
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class NotFound(ServerError):
    http_status = 404
    grpc_code = "NOT_FOUND"


class Unavailable(ServerError):
    http_status = 503
    grpc_code = "UNAVAILABLE"


class Unsupported(ServerError):
    http_status = 501
    grpc_code = "UNIMPLEMENTED"


class Unknown(ServerError):
    """TRITONSERVER_ERROR_UNKNOWN, which Triton answers with HTTP 400."""

    http_status = 400
    grpc_code = "UNKNOWN"


class AlreadyExists(ServerError):
    http_status = 400
    grpc_code = "ALREADY_EXISTS"


class Cancelled(ServerError):
    http_status = 400
    grpc_code = "CANCELLED"


class PayloadTooLarge(InvalidArgument):
    http_status = 413


class BodyTimeout(InvalidArgument):
    """A request body that did not arrive in time; the connection is closed after the answer."""

    http_status = 408
    grpc_code = "DEADLINE_EXCEEDED"


class InternalError(ServerError):
    http_status = 500
    grpc_code = "INTERNAL"


class ModelConfigError(InvalidArgument):
    """A model's configuration is malformed or contradicts its model file.

    The message names the file (and line and column where the parser knows them).
    """


# Triton's wording for the conditions its clients match on (tritonserver's core: the model
# repository manager and lifecycle, the inference request's checks; its front ends), for our
# messages to begin with; perfkit's detail follows. tests/integration/test_triton_wording.py holds
# each against a real tritonserver.


def unknown_model(name: str, version: str | int | None = None) -> str:
    """Triton's NOT_FOUND for a model (or version) it does not serve."""
    if version is None:
        return f"Request for unknown model: '{name}' is not found"
    return f"Request for unknown model: '{name}' version {version} is not found"


def no_available_versions(name: str) -> str:
    """Triton's answer for a model it knows with no version ready (a failed load, or loading)."""
    return f"Request for unknown model: '{name}' has no available versions"


def bad_version(version: str) -> str:
    """Triton's INVALID_ARG for a version that is not an integer (its C++ detail left out)."""
    return (
        f"failed to get model version from specified version string '{version}', "
        "version should be an integral value > 0"
    )


def load_failed(name: str, why: str, *, polled: bool = False) -> str:
    """Triton's words for a load that failed: before the model's config was read (not in the
    repository, a config that does not parse) "failed to poll from model repository"; after it,
    the versions failed to load."""
    if not polled:
        return f"failed to load '{name}', failed to poll from model repository: {why}"
    return f"load failed for model '{name}': {why}"


#: Triton's Status::CodeString, which begins a version's load failure ("Internal: ...").
_STATUS_WORDS: dict[str, str] = {
    "INTERNAL": "Internal",
    "NOT_FOUND": "Not found",
    "INVALID_ARGUMENT": "Invalid argument",
    "UNAVAILABLE": "Unavailable",
    "UNIMPLEMENTED": "Unsupported",
    "ALREADY_EXISTS": "Already exists",
    "UNKNOWN": "Unknown",
    "CANCELLED": "Cancelled",
}


def status_text(exc: ServerError) -> str:
    """`exc` as Triton prints a Status: its code's word, then the message ("Internal: ValueError: ...")."""
    return f"{_STATUS_WORDS.get(exc.grpc_code, 'Invalid argument')}: {exc.message}"


def version_unavailable(version: int, reason: str) -> str:
    """Triton's words for one version that failed to load; after "load failed for model 'X': " come
    those of each failed version, then a newline. `reason` is the failure as `status_text` gives it
    (what the repository index shows as the reason)."""
    return f"version {version} is at UNAVAILABLE state: {reason};"


def server_error(exc: Exception) -> ServerError | None:
    """What a client is told of `exc`: a ServerError as it is, v2kit's errors as their ServerError,
    and None for anything else, which is a bug."""
    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, (CodecError, ConfigError)):
        return _from_v2kit(exc)
    return None


def _from_v2kit(exc: CodecError | ConfigError) -> ServerError:
    return InvalidArgument(str(exc)) if isinstance(exc, CodecError) else ModelConfigError(str(exc))


def raising_server_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, raising v2kit's errors as their ServerError."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (CodecError, ConfigError) as exc:
            raise _from_v2kit(exc) from None

    return call
