"""gRPC's wire encoding of answers on HTTP/2: header and trailer blocks, message prefixes, timeouts.

What grpc/doc/PROTOCOL-HTTP2.md fixes byte for byte, apart from the transport (`server.py`) that
sends it: the response headers (with `grpc-accept-encoding` and, for a compressed answer,
`grpc-encoding`), `grpc-status`/`grpc-message` trailers, the 5-byte length prefix of a message and
the `grpc-timeout` header's value. Header blocks are HPACK literals without indexing.
"""

from __future__ import annotations

from urllib.parse import quote

from reference_server.frontends.compression import CODINGS
from v2kit.h2.frames import literal

_CONTENT_TYPE = literal(31, b"application/grpc")
_ACCEPTED = "identity," + ",".join(reversed(CODINGS))  # grpc core's order: identity,deflate,gzip
_ACCEPT_ENCODING = literal(b"grpc-accept-encoding", _ACCEPTED.encode())
_RESPONSE_HEADERS = b"\x88" + _CONTENT_TYPE + _ACCEPT_ENCODING  # :status 200
#: The answer's headers by the coding of its messages.
_CODED_HEADERS = {c: _RESPONSE_HEADERS + literal(b"grpc-encoding", c.encode()) for c in CODINGS}
_OK_TRAILERS = literal(b"grpc-status", b"0")
# grpc-message: percent-encode everything but printable ASCII, and '%' itself.
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
#: grpc-timeout units (PROTOCOL-HTTP2.md: "Timeout → TimeoutValue TimeoutUnit"), in seconds.
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def _timeout_s(value: str | None) -> float | None:
    """A grpc-timeout header's seconds, or None when there is none or it is malformed."""
    if not value or len(value) > 9 or value[-1] not in _TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


def _prefixed(message: bytes, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(message).to_bytes(4, "big") + message


def _trailers(code: int, details: str) -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if details:
        block += literal(b"grpc-message", quote(details, safe=_MESSAGE_SAFE).encode())
    return block


def _trailers_only(code: int, details: str) -> bytes:
    return _RESPONSE_HEADERS + _trailers(code, details)
