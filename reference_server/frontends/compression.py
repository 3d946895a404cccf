"""gzip and deflate for both front ends: a bounded inflater and the matching compressor.

A compressed body is a promise of a size the sender chose: about a thousand bytes out for each
byte in, so a 1 MB request under the size limit can inflate to 1 GB. `inflate` never holds more
than `limit` + one chunk of output: it feeds zlib's decompressobj in `CHUNK`-sized `max_length`
steps and stops at the first byte past the limit (`TooLarge`), so a bomb costs the server its
limit and a few milliseconds, never its memory.

"deflate" is the zlib format (RFC 1950) in HTTP (RFC 9110 §8.4.1.2) and in gRPC; many clients
send raw deflate (RFC 1951) instead, so a body that is not zlib-wrapped is read as raw deflate.
gzip is RFC 1952. As Triton's DataCompressor does (`inflateInit2(15 | 32)`), either wrapped
format is accepted under either name.

The front ends call the `_async` forms from the event loop: small data is done there, larger data
in a worker thread (zlib lets go of the GIL), so that compressing a large answer (gzip manages
tens of MB/s) or inflating a body to the limit never stalls the other clients' requests.
"""

from __future__ import annotations

import asyncio
import zlib

__all__ = [
    "CHUNK", "CODINGS", "Corrupt", "TooLarge", "coding_for_level", "compress", "compress_async", "inflate",
    "inflate_async",
]  # fmt: skip

#: The codings both front ends read and write, in the order they are advertised.
CODINGS = ("gzip", "deflate")


def coding_for_level(level: str, offered: list[str]) -> str | None:
    """The coding of an answer under a gRPC compression level (none, low, medium, high), from the
    codings the client accepts: grpc core ranks them (gzip, deflate) and gives low the first, medium
    the middle one and high the last (compression_internal.cc). None: uncompressed."""
    accepted = [c for c in CODINGS if c in offered]
    if level == "none" or not accepted:
        return None
    return accepted[{"low": 0, "medium": len(accepted) // 2, "high": -1}[level]]


#: Output bytes asked of zlib at a time: what `inflate` may hold past its limit.
CHUNK = 1 << 18

#: Data compressed on the loop, at most: a few hundred microseconds of gzip.
INLINE_COMPRESS = 1 << 15
#: Compressed data inflated on the loop, at most: about a thousand times that out, a few milliseconds.
INLINE_INFLATE = 1 << 12

_AUTO = zlib.MAX_WBITS | 32  # zlib or gzip wrapper, detected from the header
_RAW = -zlib.MAX_WBITS


class TooLarge(Exception):
    """The inflated data would exceed the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the decompressed size exceeds {limit} bytes")
        self.limit = limit


class Corrupt(Exception):
    """The data is not a complete gzip or deflate stream."""


def inflate(data: bytes | bytearray | memoryview, coding: str, limit: int) -> bytes:
    """`data` (compressed with `coding`, one of CODINGS) decompressed, at most `limit` bytes.
    Raises TooLarge past the limit, Corrupt for data that is not one whole stream."""
    wbits = _AUTO
    if coding == "deflate" and len(data) >= 2 and not _zlib_header(data):
        wbits = _RAW
    inflater = zlib.decompressobj(wbits)
    out: list[bytes] = []
    size = 0
    pending: bytes | bytearray | memoryview = data
    try:
        while True:
            piece = inflater.decompress(pending, CHUNK)
            size += len(piece)
            if size > limit:
                raise TooLarge(limit)
            out.append(piece)
            pending = inflater.unconsumed_tail
            if inflater.eof or (not pending and not piece):
                break
    except zlib.error as exc:
        raise Corrupt(f"not valid {coding} data: {exc}") from None
    if not inflater.eof:
        raise Corrupt(f"not valid {coding} data: the stream ends early")
    if inflater.unused_data:
        raise Corrupt(f"not valid {coding} data: {len(inflater.unused_data)} bytes after the end of the stream")
    return out[0] if len(out) == 1 else b"".join(out)


def compress(data: bytes, coding: str) -> bytes:
    """`data` compressed with `coding` (one of CODINGS; deflate as zlib-wrapped, per RFC 9110)."""
    if coding == "gzip":
        compressor = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        return compressor.compress(data) + compressor.flush()
    return zlib.compress(data, 6)


async def inflate_async(data: bytes | bytearray | memoryview, coding: str, limit: int) -> bytes:
    """`inflate`, in a worker thread unless `data` is small."""
    if len(data) <= INLINE_INFLATE:
        return inflate(data, coding, limit)
    return await asyncio.get_running_loop().run_in_executor(None, inflate, data, coding, limit)


async def compress_async(data: bytes, coding: str) -> bytes:
    """`compress`, in a worker thread unless `data` is small."""
    if len(data) <= INLINE_COMPRESS:
        return compress(data, coding)
    return await asyncio.get_running_loop().run_in_executor(None, compress, data, coding)


def _zlib_header(data: bytes | bytearray | memoryview) -> bool:
    """Whether `data` starts with a zlib header (RFC 1950 §2.2: CM 8, and CMF*256+FLG a multiple
    of 31), or a gzip one (which the automatic wrapper detection reads too)."""
    first, second = data[0], data[1]
    if first == 0x1F and second == 0x8B:
        return True
    return first & 0x0F == 8 and (first << 8 | second) % 31 == 0
