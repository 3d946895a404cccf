"""One error hierarchy for the reference server.

Each class carries the HTTP status and the gRPC status-code name that Triton uses for it, so the
REST middleware and the gRPC interceptor read one mapping (Triton: INTERNAL→500, NOT_FOUND→404,
UNAVAILABLE→503, UNSUPPORTED→501, INVALID_ARG and the rest→400).
"""

from __future__ import annotations

from v2kit.model_config import ConfigError


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


class PayloadTooLarge(InvalidArgument):
    http_status = 413


class BodyTimeout(InvalidArgument):
    """A request body that did not arrive in time; the connection is closed after the answer."""

    http_status = 408
    grpc_code = "DEADLINE_EXCEEDED"


class InternalError(ServerError):
    http_status = 500
    grpc_code = "INTERNAL"


class ModelConfigError(InvalidArgument, ConfigError):
    """A model's configuration is malformed or contradicts its model file.

    The message names the file (and line and column where the parser knows them).
    """
