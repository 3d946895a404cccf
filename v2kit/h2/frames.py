"""HTTP/2's frame codec and HPACK (RFC 9113, RFC 7541) for the lean gRPC client and the reference
server's gRPC front end: constants, frames read out of a byte stream (`FrameReader`), header blocks
decoded with a cache for those that leave the table as it is (`HeaderDecoder`), views of a read
that a driver keeps copied out when they would pin it for a fraction of its bytes (`unpin`), a unary call
encoded once (`encode_call`), and whether a header block changes the HPACK decoder's table
(`keeps_table`). No state beyond that: `v2kit.h2.connection` is the connection built on it."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import hpack
import hpack.exceptions

from v2kit.h2.fields import Fields, classify

__all__ = [
    "BadHeaderBlock", "EncodedCall", "FrameReader", "FrameTooLarge", "HeaderDecoder", "encode_call",
    "frame", "framing_problem", "h2_error", "keeps_table", "literal", "unpin",
]  # fmt: skip

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
)  # fmt: skip
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0, 1, 2, 3, 5, 6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 7, 8, 9, 11

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384  # also the largest frame we accept: we never advertise more
LAST_STREAM_ID = 2**31 - 1
LARGEST_FRAME_SETTING = 2**24 - 1  # SETTINGS_MAX_FRAME_SIZE's upper bound
_LARGEST_FRAME = 1 << 24  # frame lengths have 24 bits

_H2_ERRORS = (
    "NO_ERROR PROTOCOL_ERROR INTERNAL_ERROR FLOW_CONTROL_ERROR SETTINGS_TIMEOUT STREAM_CLOSED FRAME_SIZE_ERROR "
    "REFUSED_STREAM CANCEL COMPRESSION_ERROR CONNECT_ERROR ENHANCE_YOUR_CALM INADEQUATE_SECURITY HTTP_1_1_REQUIRED"
).split()

_HEAD = struct.Struct(">HBBBL")  # 24-bit length as 16 + 8 bits, type, flags, stream id

#: One frame: type, flags, stream id (reserved bit cleared) and payload.
Frame = tuple[int, int, int, memoryview]


class FrameTooLarge(Exception):
    """A frame longer than we accept (`DEFAULT_FRAME`, as we never advertise more)."""

    def __init__(self, length: int) -> None:
        super().__init__(f"a {length}-byte frame is over the {DEFAULT_FRAME}-byte limit")
        self.length = length


class FrameReader:
    """Cuts a byte stream into HTTP/2 frames. A frame that came whole in one read is a view of that
    read, never copied; only a frame split across reads is put together, once, from its pieces."""

    __slots__ = ("_partial", "_size")

    def __init__(self) -> None:
        self._partial = bytearray()  # the start of a frame split across reads
        self._size = 0  # that frame's whole size, once its header is in; 0 before

    def feed(self, data: bytes) -> Iterator[Frame]:
        """The frames `data` completes, in order; raises FrameTooLarge at an oversized one."""
        pos, end = 0, len(data)
        if self._partial:
            partial = self._partial
            if not self._size:
                pos = min(9 - len(partial), end)
                partial += data[:pos]
                if len(partial) < 9:
                    return
                self._size = 9 + self._length(partial, 0)
            take = min(self._size - len(partial), end - pos)
            partial += data[pos : pos + take]
            pos += take
            if len(partial) < self._size:
                return
            self._partial, self._size = bytearray(), 0
            _, _, ftype, flags, stream_id = _HEAD.unpack_from(partial, 0)
            yield ftype, flags, stream_id & LAST_STREAM_ID, memoryview(partial)[9:]
        view = memoryview(data)
        while end - pos >= 9:
            high, low, ftype, flags, stream_id = _HEAD.unpack_from(data, pos)
            length = high << 8 | low
            if length > DEFAULT_FRAME:
                raise FrameTooLarge(length)
            stop = pos + 9 + length
            if stop > end:
                break
            yield ftype, flags, stream_id & LAST_STREAM_ID, view[pos + 9 : stop]
            pos = stop
        if pos < end:
            self.hold(view[pos:])

    def pending(self) -> bool:
        """Whether a frame split across reads is waiting for the rest (then `feed` the next read)."""
        return bool(self._partial)

    def hold(self, start: memoryview) -> None:
        """Keep `start`, the beginning of a frame that the read did not complete, for `feed` to finish."""
        self._partial = bytearray(start)
        self._size = 9 + self._length(self._partial, 0) if len(start) >= 9 else 0

    @staticmethod
    def _length(head: bytes | bytearray, pos: int) -> int:
        high, low = _HEAD.unpack_from(head, pos)[:2]
        length = int(high << 8 | low)
        if length > DEFAULT_FRAME:
            raise FrameTooLarge(length)
        return length


def unpin(kept: Iterable[list[bytes | bytearray | memoryview]], read: bytes) -> None:
    """Copy the views of `read` found in `kept` (the chunk lists a driver holds once the read is
    handled) to bytes of their own, unless together they are at least half of it. A view keeps its
    whole read in memory: a peer that spreads a few bytes per stream over large reads would pin a
    read per stream (1024 x 256 KiB a connection) for bytes that count for little. So a read
    outlives its handling only while at least half its bytes are held: what a connection pins is
    at most twice what it counts, and a message that fills its reads keeps its zero copy."""
    views = [
        (chunks, i) for chunks in kept for i, chunk in enumerate(chunks)
        if type(chunk) is memoryview and chunk.obj is read
    ]  # fmt: skip
    if views and 2 * sum(len(chunks[i]) for chunks, i in views) < len(read):
        for chunks, i in views:
            chunks[i] = bytes(chunks[i])


class BadHeaderBlock(Exception):
    """A header block HPACK cannot decode: the connection is beyond repair (COMPRESSION_ERROR)."""


class HeaderDecoder:
    """One connection's HPACK decoder. A peer that is warm sends the same few header blocks over
    and over; those that leave the dynamic table as it is (`keeps_table`) are decoded and judged
    (`rules.classify`) once and kept by their bytes, and any block that changes the table empties
    the cache."""

    __slots__ = ("_decoder", "_decoded")

    LIMIT = 64  # decoded blocks kept

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        # RFC 7541 §4.2: a size update above what we allow (the default, never changed) is an error.
        self._decoder.max_allowed_table_size = 4096
        self._decoded: dict[bytes, Fields] = {}

    def decode(self, block: bytes) -> Fields:
        """The block's fields and what makes it malformed; raises BadHeaderBlock."""
        headers = self._decoded.get(block)
        if headers is not None:
            return headers
        try:
            # hpack annotates its decoded fields as bytes but yields str (raw=False): typed as Any so
            # that a compiled build (which checks annotations at run time) takes what hpack gives.
            decoded: Iterable[tuple[Any, Any]] = self._decoder.decode(block)
            headers = classify([(str(name), str(value)) for name, value in decoded])
        except (hpack.exceptions.HPACKError, UnicodeDecodeError, ValueError, IndexError) as exc:
            raise BadHeaderBlock(str(exc) or type(exc).__name__) from exc
        if keeps_table(block):
            if len(self._decoded) >= self.LIMIT:
                self._decoded.clear()
            self._decoded[block] = headers
        elif self._decoded:
            self._decoded.clear()  # the table changed: cached blocks may decode differently now
        return headers


def h2_error(code: int) -> str:
    return _H2_ERRORS[code] if code < len(_H2_ERRORS) else f"error code {code}"


# --- encoding, once per request --------------------------------------------------------------------


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 §5.1: an integer on a `prefix_bits` prefix of a byte starting with `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: int | bytes, value: bytes) -> bytes:
    """A literal header field without indexing (RFC 7541 §6.2.2), raw strings: it never touches the
    server's dynamic table. `name` is a static-table index or the name itself."""
    if isinstance(name, int):
        head = _hpack_int(name, 4, 0x00)
    else:
        head = b"\x00" + _hpack_int(len(name), 7, 0x00) + name
    return head + _hpack_int(len(value), 7, 0x00) + value


def _grpc_timeout(timeout_s: float) -> bytes:
    """gRPC's Timeout header: at most 8 digits and a unit, rounded up."""
    for unit, per_second in ((b"n", 1e9), (b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        value = math.ceil(timeout_s * per_second)
        if value < 100_000_000:
            return str(value).encode() + unit
    return b"99999999H"


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream_id.to_bytes(4, "big") + payload


@dataclass(frozen=True, slots=True)
class EncodedCall:
    """A unary call encoded once: write `headers_head`, the stream id, `block_data_head`, the stream
    id again and `body` for HEADERS and DATA in one go."""

    block: bytes  # the HPACK header block
    body: bytes  # the length-prefixed gRPC message
    timeout_s: float
    headers_head: bytes  # HEADERS frame header (END_HEADERS) up to the stream id
    block_data_head: bytes  # the block, then the DATA frame header (END_STREAM) up to the stream id
    largest_frame: int  # the larger of the two payloads: one frame each if the server allows it


def encode_call(
    path: str,
    message: bytes,
    *,
    authority: str,
    tls: bool,
    metadata: Sequence[tuple[str, str]] = (),
    timeout_s: float = 30.0,
    compressed: bool = False,
) -> EncodedCall:
    """A unary call to `path` ("/package.Service/Method") carrying `message`, with `metadata`
    (lower-case keys) and a `timeout_s` deadline, encoded once for any number of calls.
    `compressed`: `message` is compressed in the coding a grpc-encoding in `metadata` names."""
    fields = [
        b"\x83",  # :method POST
        b"\x87" if tls else b"\x86",  # :scheme https | http
        literal(4, path.encode()),  # :path
        literal(1, authority.encode()),  # :authority
        literal(b"te", b"trailers"),
        literal(b"grpc-timeout", _grpc_timeout(timeout_s)),
        literal(31, b"application/grpc"),  # content-type
        literal(58, b"perfkit-grpc"),  # user-agent
    ]
    fields += [literal(key.encode(), value.encode()) for key, value in metadata]
    block = b"".join(fields)
    body = (b"\x01" if compressed else b"\x00") + len(message).to_bytes(4, "big") + message
    largest = max(len(block), len(body))
    one_frame = largest < _LARGEST_FRAME  # else the frame headers below are never used
    return EncodedCall(
        block=block,
        body=body,
        timeout_s=timeout_s,
        headers_head=len(block).to_bytes(3, "big") + bytes((HEADERS, END_HEADERS)) if one_frame else b"",
        block_data_head=block + len(body).to_bytes(3, "big") + bytes((DATA, END_STREAM)) if one_frame else b"",
        largest_frame=largest,
    )


def keeps_table(block: bytes) -> bool:
    """Whether decoding `block` leaves the dynamic table as it was (RFC 7541 §6): only indexed
    fields and literals without (or never) indexing, no literal with indexing, no size update."""
    pos, end = 0, len(block)
    try:
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed
                pos = _skip_int(block, pos, 0x7F)
            elif first & 0xE0:  # 01xxxxxx with indexing, 001xxxxx size update; 0001xxxx never indexed
                if first & 0xF0 != 0x10:
                    return False
                pos = _skipliteral(block, pos)
            else:
                pos = _skipliteral(block, pos)
    except IndexError:
        return False
    return True


def _skipliteral(block: bytes, pos: int) -> int:
    new_name = block[pos] & 0x0F == 0
    pos = _skip_int(block, pos, 0x0F)
    if new_name:
        pos = _skip_string(block, pos)
    return _skip_string(block, pos)


def _skip_string(block: bytes, pos: int) -> int:
    length, pos = _read_int(block, pos, 0x7F)
    return pos + length


def _skip_int(block: bytes, pos: int, mask: int) -> int:
    return _read_int(block, pos, mask)[1]


def _read_int(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    """RFC 7541 §5.1: (value, position after it) of the integer whose prefix is `mask`'s bits."""
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def framing_problem(body: bytes | bytearray | memoryview) -> str:
    if len(body) < 5:
        return f"the reply is {len(body)} bytes, shorter than gRPC's 5-byte message prefix"
    if body[0] != 0:
        return "the reply is compressed, which we did not ask for"
    declared = int.from_bytes(body[1:5], "big")
    return f"the reply's message prefix says {declared} bytes, {len(body) - 5} came"
