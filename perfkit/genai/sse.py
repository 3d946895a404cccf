"""An incremental, bounded parser of server-sent events (the WHATWG HTML "event stream" grammar).

Sans-I/O: `feed()` takes the bytes as they arrive, in chunks cut anywhere (inside a line, between
a CR and its LF, inside a UTF-8 sequence), and returns the events completed by them. A line is
ended by CRLF, LF or CR; a blank line dispatches the event, its `data:` lines joined by LF (an
event without data, a keep-alive, is dropped); a line starting with ":" is a comment; a field
without a colon has an empty value; `id` and `retry` mean nothing to a load generator and are
skipped. A peer decides how long a line is, so a line longer
than `max_line` raises `SseError` where it arrives, before it is held whole; so does a line that is
not UTF-8. `pending` says whether the stream stopped inside an event, which is how a stream cut
mid-token is told from one that ended between events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_LINE_BYTES", "SseError", "SseEvent", "SseParser"]

#: Longest line accepted: one event of a chat completion is well under a KiB; an embeddings or
#: a long-token event a few hundred KiB.
MAX_LINE_BYTES = 1 << 20
_EOL = re.compile(rb"\r\n|\r|\n")


class SseError(Exception):
    """The bytes are not an event stream this parser accepts (the message says why)."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    data: str
    event: str = "message"


class SseParser:
    __slots__ = ("_data", "_event", "_line", "_max_line", "_skip_lf")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._max_line = max_line
        self._line = bytearray()  # the unfinished line
        self._data: list[str] = []
        self._event = ""
        self._skip_lf = False  # the last chunk ended in CR: an LF opening the next one belongs to it

    @property
    def pending(self) -> bool:
        """Part of an event has arrived and its blank line has not."""
        return bool(self._line) or bool(self._data) or bool(self._event)

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if not chunk:
            return []
        events: list[SseEvent] = []
        start = 0
        if self._skip_lf and chunk[:1] == b"\n":
            start = 1
        self._skip_lf = False
        for match in _EOL.finditer(chunk, start):
            piece = chunk[start : match.start()]
            if self._line:
                self._line += piece
                line = bytes(self._line)
                self._line.clear()
            else:
                line = piece
            self._check_length(len(line))
            event = self._take_line(line)
            if event is not None:
                events.append(event)
            start = match.end()
        if chunk.endswith(b"\r"):
            self._skip_lf = True
        rest = chunk[start:]
        if rest:
            self._check_length(len(self._line) + len(rest))
            self._line += rest
        return events

    def _check_length(self, length: int) -> None:
        if length > self._max_line:
            raise SseError(f"an event-stream line is longer than {self._max_line} bytes")

    def _take_line(self, raw: bytes) -> SseEvent | None:
        if not raw:
            if not self._data:  # the standard's rule: an event without data is not dispatched
                self._event = ""
                return None
            event = SseEvent("\n".join(self._data), self._event or "message")
            self._data.clear()
            self._event = ""
            return event
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            raise SseError("an event-stream line is not UTF-8") from None
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None
