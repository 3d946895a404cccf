"""h2spec's hpack cases, ported (see tests/integration/test_h2_conformance.py)."""

from __future__ import annotations

from tests.h2peer import Peer
from tests.h2spec.verify import (
    EH,
    ES,
    case,
    connection_error,
)
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame


def _bad_block(key: str, title: str, block: bytes) -> None:
    @case(key, title)
    def _(p: Peer) -> None:
        p.send(frame(h2.HEADERS, EH | ES, 1, block))
        connection_error(p, h2.COMPRESSION_ERROR)


_bad_block("hpack/2.3.3/1", "Sends a indexed header field representation with invalid index", b"\x82\x86\x84\xfe\x01")
_bad_block(
    "hpack/2.3.3/2", "Sends a literal header field representation with invalid index", b"\x82\x86\x84\x7f\x3f\x01a"
)
_bad_block(
    "hpack/4.2/1",
    "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE",
    b"\x3f\xe2\x1f\x82\x86\x84",
)  # 4097
_bad_block(
    "hpack/5.2/1",
    "Sends a Huffman-encoded string literal representation with padding longer than 7 bits",
    b"\x82\x86\x84\x41\x8a\x08\x9d\x5c\x0b\x81\x70\xdc\x79\xa6\x99\xff",
)
_bad_block(
    "hpack/5.2/2",
    "Sends a Huffman-encoded string literal representation padded by zero",
    b"\x82\x86\x84\x41\x89\x08\x9d\x5c\x0b\x81\x70\xdc\x79\xa6\x90",
)
_bad_block(
    "hpack/5.2/3",
    "Sends a Huffman-encoded string literal representation containing the EOS symbol",
    b"\x82\x86\x84\x41\x8a\x08\x9d\x5c\x0b\x81\x70\xdc\xff\xff\xff\xff",
)
_bad_block("hpack/6.1/1", "Sends a indexed header field representation with index 0", b"\x82\x86\x84\x80")
_bad_block(
    "hpack/6.3/1",
    "Sends a dynamic table size update at the end of header block",
    b"\x82\x86\x84\x41\x09127.0.0.1\x3f\xe1\x1f",
)
