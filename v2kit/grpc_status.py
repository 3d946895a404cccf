"""gRPC status codes (grpc/doc/statuscodes.md) as plain ints, and how the ends of HTTP/2 streams
that carry no grpc-status read as one: an RST_STREAM or GOAWAY code (grpc/doc/PROTOCOL-HTTP2.md,
"Errors") and an HTTP status (grpc/doc/http-grpc-status-mapping.md). Plain ints, not grpcio's
enum: the lean client and the server's front end compare them on every call."""

from __future__ import annotations

from typing import Protocol

__all__ = ["HTTP_STATUS", "MALFORMED", "RESET_STATUS", "code_of"]

MALFORMED = -1  # not a gRPC status: the reply broke gRPC's or HTTP/2's framing
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED = range(8)
RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = range(8, 15)
DATA_LOSS, UNAUTHENTICATED = 15, 16

#: RST_STREAM and GOAWAY codes as gRPC statuses (any other: INTERNAL).
RESET_STATUS = {7: UNAVAILABLE, 8: CANCELLED, 11: RESOURCE_EXHAUSTED, 12: PERMISSION_DENIED}
#: An HTTP status that came without grpc-status (any other: UNKNOWN).
HTTP_STATUS = {"400": INTERNAL, "401": UNAUTHENTICATED, "403": PERMISSION_DENIED, "404": UNIMPLEMENTED}
HTTP_STATUS.update(dict.fromkeys(("429", "502", "503", "504"), UNAVAILABLE))


class _StatusCode(Protocol):
    @property
    def value(self) -> tuple[int, str]: ...


def code_of(status: _StatusCode) -> int:
    """The number of a `grpc.StatusCode` (whose value is its number and its name)."""
    return int(status.value[0])
