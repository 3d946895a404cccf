"""What an HTTP/2 connection (`v2kit.h2.connection`) and its driver say to each other: the `Sink`
its bytes go to (an asyncio transport), the `Stream` a driver subclasses for what it keeps per
call, and the `Events` the connection reports."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from mypy_extensions import mypyc_attr

__all__ = ["Cancellable", "Events", "Payload", "S", "Sink", "Stream"]

Payload = bytes | bytearray | memoryview


class Sink(Protocol):
    """Where a connection's bytes go: an asyncio transport has these methods."""

    def write(self, data: bytes) -> None: ...
    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def get_write_buffer_size(self) -> int: ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by interpreted classes (compiled: docs/compiled.md)
class Stream:
    """One stream's state; drivers subclass it for what they keep per call."""

    __slots__ = ("id", "window", "received", "credit", "held", "deferred", "pending", "end_data", "end_block",
                 "local_ended", "remote_ended", "deadline", "headers_in", "length_left")  # fmt: skip

    def __init__(self) -> None:
        self.id = 0  # set when the stream opens
        self.window = 0  # what the peer's window lets us send on this stream
        self.received = 0  # DATA bytes the peer sent that no WINDOW_UPDATE has given back yet
        self.credit = 0  # of those, bytes taken, to give back in the next WINDOW_UPDATE
        self.held = 0  # DATA bytes the driver has not taken yet (`Connection.consumed`); 0 unless `deferred`
        self.deferred = False  # set by the driver: its DATA is given back once taken, not as it comes
        self.pending: deque[memoryview] | None = None  # DATA the windows have not let out yet, in order
        self.end_data = False  # the last of `pending` ends our side (END_STREAM)
        self.end_block: bytes | None = None  # trailers that end our side once `pending` is out
        self.local_ended = False  # we sent END_STREAM
        self.remote_ended = False  # the peer sent END_STREAM
        self.deadline = math.inf  # by when it must end, on the driver's clock
        self.headers_in = False  # the peer's first header block (request or response) has come
        self.length_left = -1  # DATA bytes its content-length still announces; -1: none announced


S = TypeVar("S", bound=Stream)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by interpreted classes (compiled: docs/compiled.md)
class Events(Generic[S]):
    """What a connection tells its driver; each does nothing unless the driver overrides it."""

    def stream_opened(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> S | None:
        """The peer opened a stream: the driver's `Stream` for it, or None when the driver has
        answered it already (refused it)."""
        return None

    def headers_received(self, stream: S, headers: dict[str, str], end_stream: bool) -> None:
        """A header block on an open stream (response headers, or trailers when `end_stream`)."""

    def stream_data(self, stream: S, data: Payload) -> None:
        """DATA on `stream`, padding removed: a view of what arrived, not a copy."""

    def stream_ended(self, stream: S) -> None:
        """The peer ended its side of `stream` (END_STREAM)."""

    def stream_reset(self, stream: S, code: int | None) -> None:
        """`stream` is gone, forgotten already: the peer reset it with `code`, or (None) the
        connection failed, was lost, or the peer's GOAWAY left it out."""

    def drained(self, stream: S) -> None:
        """The data queued on `stream` has all been written."""

    def settings_changed(self) -> None:
        """The peer's SETTINGS arrived (its stream limit may have changed)."""

    def goaway_received(self, last_stream_id: int, code: int, debug: bytes) -> None:
        """The peer will take no new streams; ours after `last_stream_id` are reset next."""

    def connection_failed(self, reason: str) -> None:
        """The peer broke HTTP/2: the connection is closing (GOAWAY sent); its streams are reset next."""

    def deadline_passed(self, stream: S) -> None:
        """`stream`'s deadline (`Connection.set_deadline`) has passed; it is still open."""
