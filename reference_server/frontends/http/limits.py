"""What the HTTP/1.1 front end allows a client before it answers 414 / 431 / 408 or closes: the
request head's sizes, its timers, and the write buffer's water marks.

The defaults follow the servers that clients already meet:

- *Request target* 8 KiB (`max_request_line`): nginx's `large_client_header_buffers` (8k) and
  Apache's `LimitRequestLine` (8190). KServe's longest routes are a few hundred bytes.
- *One header line* 16 KiB (`max_header_line`): h11's `max_incomplete_event_size` and Node's
  whole-head limit; generous for a bearer token or a cookie.
- *The whole head* 64 KiB (`max_head_bytes`): four lines at the limit, and Tomcat, Node and nginx
  all refuse less.
- *Header lines* 100 (`max_headers`): Apache's `LimitRequestFields`.
- *Head timeout* 30 s from a head's first byte (`head_timeout_s`): half nginx's
  `client_header_timeout`; a client that trickles its head (slowloris) is answered 408 and closed.
- *Idle keep-alive timeout* 75 s (`idle_timeout_s`): nginx's `keepalive_timeout`; a kept-open
  connection with no request in progress is closed without an answer, as RFC 9112 §9.5 allows
  (looked at every half timeout: between 75 and 112 s after its last answer).
- *Pipelined requests* 16 (`max_pipelined`): requests a connection may have waiting behind the one
  being served; past it the connection is not read until half of them are answered, so a client
  that pipelines without end costs the server a bounded queue (`connection.py`).
- *Unparsed bytes* 1 MiB (`max_unparsed`): what a connection may make the server keep of its reads
  unparsed while its pipelined requests wait. One read's rest is kept when the queue fills
  (`pipelined_reads.py`); the read gate may let another read in before that rest is parsed, and it
  waits behind it; past 1 MiB held (four of the largest reads) the client, which keeps sending
  requests ahead of answers it does not read, is answered 429 after the requests already read, and
  the connection closes.
- *Write buffer* 256 KiB high, 64 KiB low: above the high-water mark the connection stops being
  read until its client has taken the answers down to the low one, so a client that pipelines and
  never reads costs the server one buffer, not every answer. Not a flag: a client that reads is
  never held up by it, and one that does not is what it is for.

The sizes are what llhttp has handed over (the target, each field name and value) plus four bytes a
line for ': ' and CRLF, so whitespace around a value is not counted; the bytes of a line llhttp has
not finished yet are counted as they arrive. A head that comes in one read no larger than the line
limit can be over no limit but the count: most heads are checked with two comparisons; one that
spans reads is measured read by read by a `HeadMeter`, so memory never follows a client that
streams an endless head.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference_server.frontends.http.messages import HttpResponse, error_response

__all__ = [
    "DEFAULT_LIMITS",
    "HeadMeter",
    "HttpLimits",
    "body_timeout",
    "measure_head",
    "refusal",
    "too_large",
    "too_much_unparsed",
]

#: How far an unfinished line's raw bytes may run past its size as counted here (': ', CRLF; before
#: the first header, ' HTTP/1.1'), so that no line at its limit is refused for them.
_RAW_SLACK = 64


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The request head's limits and the connection's timers; see the module's docstring."""

    max_request_line: int = 8 * 1024
    max_header_line: int = 16 * 1024
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    head_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    max_pipelined: int = 16
    max_unparsed: int = 1 << 20
    write_high_water: int = 256 * 1024
    write_low_water: int = 64 * 1024

    def validate(self) -> None:
        """Raises ValueError naming the flag of a limit that cannot work."""
        for flag, value in (
            ("--http-max-request-line", self.max_request_line),
            ("--http-max-header-line", self.max_header_line),
            ("--http-max-head-size", self.max_head_bytes),
            ("--http-max-headers", self.max_headers),
            ("--http-max-pipelined-requests", self.max_pipelined),
            ("--http-max-unparsed-bytes", self.max_unparsed),
        ):
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        for flag, seconds in (
            ("--http-head-timeout-secs", self.head_timeout_s),
            ("--http-idle-timeout-secs", self.idle_timeout_s),
        ):
            if not seconds > 0:
                raise ValueError(f"{flag} must be a positive number of seconds, got {seconds}")
        if not 0 <= self.write_low_water <= self.write_high_water:
            raise ValueError("the write buffer's low-water mark must be between 0 and its high-water mark")


DEFAULT_LIMITS = HttpLimits()


def measure_head(
    limits: HttpLimits, headers: list[tuple[bytes, bytes]], start: int, size: int
) -> tuple[int, str | None]:
    """`size` plus the header lines from `start` on (4 bytes each for ': ' and CRLF), and the
    limit the head breaks ('count', 'line', 'head'), or None."""
    if len(headers) > limits.max_headers:
        return size, "count"
    for name, value in headers[start:]:
        line = len(name) + len(value)
        if line > limits.max_header_line:
            return size, "line"
        size += line + 4
    return size, "head" if size > limits.max_head_bytes else None


class HeadMeter:
    """The size of a request head that spans reads: what llhttp has handed over (the target, the
    header lines, 4 bytes a line for ': ' and CRLF) and the bytes of the line it has not finished."""

    __slots__ = ("limits", "spanned", "size", "counted", "target_seen", "pending")

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.reset()

    def reset(self) -> None:
        self.spanned = False  # the head has taken more than one read
        self.size = 0  # its bytes llhttp has handed over, 4 a line for ': ' and CRLF
        self.counted = 0  # header lines in `size`
        self.target_seen = 0  # bytes of the target seen at the last read
        self.pending = 0  # bytes read since llhttp last handed over any: its unfinished line

    def count(self, headers: list[tuple[bytes, bytes]], target: bytes) -> HttpResponse | None:
        """Add what llhttp has handed over since the last count; the 431 for a line, a count or a
        size over its limit, else None."""
        url_size = len(target)
        size, broken = measure_head(self.limits, headers, self.counted, self.size + url_size - self.target_seen)
        self.size, self.counted, self.target_seen = size, len(headers), url_size
        return None if broken is None else refusal(self.limits, broken)

    def after_read(self, headers: list[tuple[bytes, bytes]], target: bytes, read_size: int) -> HttpResponse | None:
        """A read of `read_size` bytes ended with the head unfinished: the refusal it earns, or None."""
        began_here, self.spanned = not self.spanned, True
        counted, target_seen = self.counted, self.target_seen
        broken = self.count(headers, target)
        if broken is not None:
            return broken
        if began_here or self.counted != counted or self.target_seen != target_seen:
            # A line ended in this read; the part of it after that line is under one read, and
            # counted from the next read on, so the count never exceeds the line.
            self.pending = 0
            return None
        limits = self.limits
        pending = self.pending = self.pending + read_size
        if pending > limits.max_header_line + _RAW_SLACK:
            return refusal(limits, "line")
        if self.size + pending > limits.max_head_bytes + _RAW_SLACK:
            return refusal(limits, "head")
        return None

    def complete(self, headers: list[tuple[bytes, bytes]], target: bytes) -> HttpResponse | None:
        """The head is all in: the refusal it earns, or None; the meter is ready for the next head."""
        broken = self.count(headers, target)
        self.reset()
        return broken


def refusal(limits: HttpLimits, broken: str) -> HttpResponse:
    """The answer to a head over the limit `broken` names, and close: 414 for the request target,
    431 for the rest (RFC 9112 §3, RFC 6585 §5)."""
    message, flag = {
        "target": (f"the request target is longer than {limits.max_request_line} bytes", "--http-max-request-line"),
        "line": (f"a request head line is longer than {limits.max_header_line} bytes", "--http-max-header-line"),
        "count": (f"the request has more than {limits.max_headers} header lines", "--http-max-headers"),
        "head": (f"the request head is larger than {limits.max_head_bytes} bytes", "--http-max-head-size"),
    }[broken]
    return error_response(f"{message} (raise the limit with {flag})", 414 if broken == "target" else 431, close=True)


def too_large(size: int, limit: int) -> HttpResponse:
    """The answer to a body over `--http-max-input-size`, and close."""
    message = f"request body too large: {size} bytes, the limit is {limit} (raise it with --http-max-input-size)"
    return error_response(message, 413, close=True)


def too_much_unparsed(limit: int) -> HttpResponse:
    """The answer to a client whose pipelined requests, unread, would make the server keep more than
    `limit` bytes, after the requests already read; then close. 429: it sends too many requests
    ahead of their answers (RFC 6585 §4); the requests in the bytes dropped are not answered, and a
    client retries them on a new connection (RFC 9112 §9.3.2)."""
    message = (
        f"the client sent over {limit} bytes of pipelined requests ahead of their answers "
        "(raise the limit with --http-max-unparsed-bytes, or read the answers before sending more)"
    )
    return error_response(message, 429, close=True)


def body_timeout(timeout_s: float) -> HttpResponse:
    """The answer to a body not all in within `--http-body-timeout-secs`, and close."""
    message = f"the request body did not all arrive within {timeout_s:g} s (--http-body-timeout-secs)"
    return error_response(message, 408, close=True)
