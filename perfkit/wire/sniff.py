"""Which protocol a port speaks, for the message of a client pointed at the wrong port.

A Triton-like server listens on three ports: HTTP/1.1 (KServe v2 REST, usually 8000), gRPC on
HTTP/2 (usually 8001) and Prometheus metrics over HTTP/1.1 (usually 8002). A client on the wrong
one fails with the transport's own words: aiohttp quotes an HTTP/2 SETTINGS frame as a "Bad status
line b'\\x00\\x00\\x12\\x04...'", gRPC reports "Failed parsing HTTP/2", and the metrics port answers
404. Once a control-plane call has failed, `sniff` sends one HTTP/1.1 request for the liveness
route and reads the first bytes back: an HTTP/2 server answers with its SETTINGS frame (the
server's connection preface), an HTTP/1.x server with a status line. `wrong_port_hint` words it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass

__all__ = ["Spoken", "not_kserve_hint", "read_spoken", "sniff", "wrong_port_hint"]

HTTP2, HTTP1 = "HTTP/2", "HTTP/1.1"
_SETTINGS = 0x04
_LIVE = "/v2/health/live"


@dataclass(frozen=True, slots=True)
class Spoken:
    protocol: str  # HTTP2 or HTTP1
    status: int | None = None  # HTTP/1.x: the status of GET /v2/health/live


def read_spoken(first: bytes) -> Spoken | None:
    """What the first bytes a server sent say it speaks; None when they say neither."""
    if first.startswith(b"HTTP/1."):
        parts = first.split(b"\r\n", 1)[0].split(b" ")
        return Spoken(HTTP1, int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None)
    # An HTTP/2 frame header: 24-bit length, type, flags, then stream 0 for SETTINGS.
    if len(first) >= 9 and first[3] == _SETTINGS and first[5:9] == b"\0\0\0\0":
        return Spoken(HTTP2)
    return None


async def sniff(
    host: str, port: int, ssl_context: ssl.SSLContext | None = None, timeout_s: float = 3.0
) -> Spoken | None:
    """Ask `host:port` for the liveness route over HTTP/1.1 and read what it says it speaks; None
    when it cannot be reached or says neither (never raises)."""
    try:
        return read_spoken(await asyncio.wait_for(_first_bytes(host, port, ssl_context), timeout_s))
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        return None


async def _first_bytes(host: str, port: int, ssl_context: ssl.SSLContext | None) -> bytes:
    reader, writer = await asyncio.open_connection(host, port, ssl=ssl_context)
    try:
        authority = f"[{host}]" if ":" in host else host
        writer.write(f"GET {_LIVE} HTTP/1.1\r\nHost: {authority}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        first = b""
        while len(first) < 64 and read_spoken(first) is None:
            chunk = await reader.read(64 - len(first))
            if not chunk:
                break
            first += chunk
        return first
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def wrong_port_hint(spoken: Spoken | None, protocol: str) -> str | None:
    """What to tell a `protocol` ("http" or "grpc") client about a port that speaks `spoken`;
    None when the port speaks the client's protocol (the failure is something else)."""
    if spoken is None:
        return None
    if protocol == "http" and spoken.protocol == HTTP2:
        return "this port speaks HTTP/2 (gRPC?): use -i grpc, or the server's HTTP port (usually 8000)"
    if protocol == "grpc" and spoken.protocol == HTTP1:
        if spoken.status == 404:
            return ("this port speaks HTTP/1.1 but not the KServe v2 API: is it the metrics port? the server's "
                    "gRPC port is usually 8001")  # fmt: skip
        return "this port speaks HTTP/1.1: use -i http, or the server's gRPC port (usually 8001)"
    return None


def not_kserve_hint() -> str:
    """For an HTTP server that answers 404 on the liveness route every KServe v2 server has."""
    return (f"answers HTTP but not the KServe v2 API (404 on {_LIVE}): is it the metrics port? the server's HTTP "
            "port is usually 8000")  # fmt: skip
