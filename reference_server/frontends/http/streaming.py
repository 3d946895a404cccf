"""Streamed answers of the HTTP/1.1 front end: a body whose chunks are written as they come.

A handler answers with `HttpResponse(stream=...)`, an async generator of byte strings (server-sent
events, for the generate extension). The head goes out at once with `Transfer-Encoding: chunked`;
each non-empty piece becomes one chunk, written as soon as it is yielded (nothing is held back to
fill a buffer: an event reaches the client when the model sends it), and the last chunk ends the
body. The head waits for the first piece, which may still set the answer's status (a generator
that holds the response can). While the client is slower than the stream, `writable` holds the next piece back (the
connection's write back-pressure), so memory never follows a stalled client. The generator is
closed in every case, which is how a client that went away cancels what it asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from reference_server.frontends.http.messages import LAST_CHUNK, HttpResponse, chunk, encode_head

__all__ = ["send_stream"]

log = logging.getLogger(__name__)


async def send_stream(
    transport: asyncio.Transport | None,
    response: HttpResponse,
    close: bool,
    writable: Callable[[], Awaitable[None]],
) -> None:
    """Write `response`'s head and its stream's chunks on `transport` (None: the client is gone
    already, and the stream is only closed). A stream that fails once the head is out cannot
    change the answer any more: it is logged and the connection closed."""
    stream = response.stream
    assert stream is not None
    try:
        if transport is None:
            return
        # The first piece before the head: it may set the answer's status (the generate extension's
        # is its first response's).
        first = await anext(stream, None)
        transport.write(encode_head(response, close))
        if first:
            transport.write(chunk(first))
        async for data in stream:
            if data:
                transport.write(chunk(data))
            await writable()
            if transport.is_closing():
                return
        transport.write(LAST_CHUNK)
    except Exception:
        log.exception("internal error streaming an answer")
        if transport is not None:
            transport.close()
    finally:
        await stream.aclose()
