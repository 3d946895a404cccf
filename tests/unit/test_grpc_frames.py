"""v2kit.h2.frames.FrameReader: frames cut out of a byte stream however it was split."""

from __future__ import annotations

import pytest

from v2kit.h2 import frames as h2
from v2kit.h2.frames import FrameReader, FrameTooLarge, frame

STREAM = (
    frame(h2.SETTINGS, 0, 0, b"\x00\x04\x00\x00\xff\xff")
    + frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x88")
    + frame(h2.DATA, 0, 1, bytes(range(256)) * 40)
    + frame(h2.PING, h2.ACK, 0, b"8 bytes!")
    + frame(h2.DATA, h2.END_STREAM, 0x80000003, b"")  # the reserved bit is dropped
)
EXPECTED = [
    (h2.SETTINGS, 0, 0, b"\x00\x04\x00\x00\xff\xff"),
    (h2.HEADERS, h2.END_HEADERS, 1, b"\x88"),
    (h2.DATA, 0, 1, bytes(range(256)) * 40),
    (h2.PING, h2.ACK, 0, b"8 bytes!"),
    (h2.DATA, h2.END_STREAM, 3, b""),
]


def read(chunks: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    reader = FrameReader()
    return [(t, f, s, bytes(p)) for chunk in chunks for t, f, s, p in reader.feed(chunk)]


@pytest.mark.parametrize("step", [1, 2, 7, 9, 10, 100, 4096, len(STREAM)])
def test_frames_come_out_whole_however_the_stream_is_cut(step: int) -> None:
    chunks = [STREAM[i : i + step] for i in range(0, len(STREAM), step)]
    assert read(chunks) == EXPECTED


def test_a_frame_that_came_whole_is_a_view_of_its_read() -> None:
    data = frame(h2.DATA, 0, 1, b"x" * 1000)
    ((_, _, _, payload),) = FrameReader().feed(data)
    assert payload.obj is data and bytes(payload) == b"x" * 1000


def test_an_oversized_frame_is_refused_even_with_its_header_split() -> None:
    head = (h2.DEFAULT_FRAME + 1).to_bytes(3, "big") + bytes((h2.DATA, 0)) + (1).to_bytes(4, "big")
    with pytest.raises(FrameTooLarge):
        list(FrameReader().feed(head + b"x"))
    reader = FrameReader()
    assert list(reader.feed(head[:4])) == []
    with pytest.raises(FrameTooLarge):
        list(reader.feed(head[4:]))


def test_unpin_copies_out_a_small_view_kept_of_a_large_read() -> None:
    read = frame(h2.DATA, 0, 1, b"a") + frame(0xFA, 0, 0, bytes(16384))
    ((_, _, _, payload), _) = FrameReader().feed(read)
    other = memoryview(b"another read")
    kept = [[payload], [other[:3]], [b"own"]]
    h2.unpin(kept, read)
    assert type(kept[0][0]) is bytes and kept[0][0] == b"a"  # the read is free to go
    assert type(kept[1][0]) is memoryview  # a view of another read is that read's to judge
    assert kept[2] == [b"own"]


def test_unpin_keeps_views_that_hold_half_their_read_or_more() -> None:
    read = frame(h2.DATA, 0, 1, b"x" * 8000) + frame(h2.DATA, 0, 3, b"y" * 8000) + frame(0xFA, 0, 0, bytes(8000))
    (first, second, _) = (p for _, _, _, p in FrameReader().feed(read))
    kept = [[first], [second]]  # 16000 of 24027 bytes: as good as the read itself, left uncopied
    h2.unpin(kept, read)
    assert kept[0][0] is first and kept[1][0] is second
