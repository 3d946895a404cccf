"""A connection's reads, fed to llhttp within the bound of its pipelining queue.

Why a module of its own: llhttp parses all it is given, and a read can hold hundreds of tiny
requests. Bounding the queue of pipelined requests (`limits.max_pipelined`) therefore means not
giving llhttp a whole read: a read larger than `PARSE_SLICE` is parsed a slice at a time (a
body's bytes in one piece), and once more than `limits.max_pipelined` requests wait, the read's
unparsed rest is kept, as bytes, reading stops, and the rest is parsed when the connection's
answers have drained the queue to half. A read the read gate lets in meanwhile waits behind
that rest; past `limits.max_unparsed` held, the client is answered 429 and closed
(`limits.too_much_unparsed`). `ReadFeeder` is that job, owned by one
`connection.HttpConnection`, whose parser, queue and flags it reads and sets as the connection's
own: it holds only the kept bytes and the size of the slice being parsed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httptools

from reference_server.frontends.http.limits import too_much_unparsed
from reference_server.frontends.http.messages import error_response

if TYPE_CHECKING:
    from reference_server.frontends.http.connection import HttpConnection

#: A read larger than this is parsed this many bytes at a time, so that parsing stops once the queue
#: is full, not at the end of the read: a slice of tiny requests (18 bytes at least) adds at most
#: a few hundred to it.
PARSE_SLICE = 4096


class ReadFeeder:
    """Feeds one connection's reads to its llhttp parser, keeping a read's rest while its queue is full."""

    __slots__ = ("_conn", "read_size", "rest_due", "unparsed")

    def __init__(self, conn: HttpConnection) -> None:
        self._conn = conn
        self.read_size = 0  # bytes in the read (or the slice of one) being parsed
        self.unparsed: bytes | memoryview | None = None  # a read's rest, kept while the queue is full
        self.rest_due = False  # the rest's parsing is scheduled

    def received(self, data: bytes) -> None:
        """A read of the connection's (not refused): parse it, or queue it behind a kept rest."""
        conn = self._conn
        if self.unparsed is not None:
            # The read gate resumed reading while an earlier read's rest waits: this read goes after it,
            # within the cap (each resume lets in one more read: a gate that resumes the connection
            # again and again would otherwise grow the rest without end).
            limit = conn._limits.max_unparsed
            if len(self.unparsed) + len(data) > limit:
                conn._give_up(too_much_unparsed(limit))
                return
            self.unparsed = b"".join((self.unparsed, data))
            if conn._transport is not None:
                conn._transport.pause_reading()
            return
        self.parse(data)
        if (conn._write_paused or conn._paused) and conn._transport is not None:
            conn._transport.pause_reading()  # the read gate resumed it: the answers still wait

    def parse(self, data: bytes | memoryview) -> None:
        """Parse `data` (a read, or a read's rest), a `PARSE_SLICE` at a time if it is larger; once
        more than `limits.max_pipelined` requests wait, keep the rest unparsed and stop reading."""
        conn = self._conn
        size = len(data)
        if size > PARSE_SLICE or len(conn._queue) > conn._max_pipelined:
            view = memoryview(data)
            start = 0
            while start < size:
                if len(conn._queue) > conn._max_pipelined:
                    self._hold(view[start:])
                    return
                end = start + PARSE_SLICE
                if conn._in_body and conn._length is not None:
                    end += conn._length - conn._size  # the rest of a body in one piece: one on_body
                if not self._feed(view[start:end]):
                    return
                start = end
        elif not self._feed(data):  # the common case: a request, or a few, in a small read
            return
        if conn._in_body and conn._body_timer is None and not conn._serving and conn._transport is not None:
            conn._arm_body_timer()

    def _feed(self, data: bytes | memoryview) -> bool:
        """Hand `data` to llhttp; whether what follows it may be parsed."""
        conn = self._conn
        self.read_size = len(data)
        try:
            conn._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            conn._closing = True  # what follows is another protocol's: answer what was asked, then close
            return False
        except httptools.HttpParserError as exc:
            if not conn._gave_up:  # else a limit refused the request and stopped llhttp (_Refused)
                conn._give_up(error_response(f"malformed HTTP request: {exc}", 400, close=True))
            return False
        if conn._in_head:
            conn._head_unfinished(len(data))
        return not conn._gave_up

    def _hold(self, rest: memoryview) -> None:
        """Keep `rest`, the unparsed end of a read, and stop reading until the queue drains."""
        conn = self._conn
        self.unparsed = rest  # a view: the read is kept, not copied
        conn._paused = True
        if conn._transport is not None:
            conn._transport.pause_reading()

    def parse_rest_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """The queue has drained to half: parse the kept rest from the loop (parsing may serve a
        request, and this is called while an answer is being written)."""
        if not self.rest_due:
            self.rest_due = True
            loop.call_soon(self._parse_rest)

    def _parse_rest(self) -> None:
        """Parse the read's rest kept by `_hold`, then read again if it all went."""
        conn = self._conn
        self.rest_due = False
        rest, self.unparsed = self.unparsed, None
        transport = conn._transport
        if rest is None or transport is None or conn._gave_up:
            return
        conn._paused = False
        self.parse(rest)
        if self.unparsed is not None or conn._paused or conn._gave_up:
            return  # held again, or refused
        if not conn._closing:
            if not conn._write_paused:
                transport.resume_reading()
        elif not conn._serving and not conn._queue:  # the client has sent all it will: nothing left to answer
            transport.close()
