"""v2kit.h2.connection: a client-role and a server-role connection exchanging bytes in memory (h11's
ConnectionPair), with raw frames slipped in where one side must misbehave or say what our engine
never says (small windows, PINGs, garbage)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from tests.h2peer import MemorySink
from v2kit.h2 import frames as h2
from v2kit.h2.connection import Connection, Events, Payload, Stream
from v2kit.h2.frames import FrameReader, frame, literal
from v2kit.h2.rules import DEFAULT_H2_LIMITS, H2Limits

Event = tuple[Any, ...]


class Timer:
    def __init__(self, clock: Clock, when: float, callback: Callable[[], None]) -> None:
        self.clock, self.when, self.callback = clock, when, callback

    def cancel(self) -> None:
        self.clock.timers.remove(self)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self, when, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in [t for t in self.timers if t.when <= self.now]:
            self.timers.remove(timer)
            timer.callback()


class Recorder(Events[Stream]):
    """Every event, in order; data as bytes. Peer streams are taken unless `refuse` says no."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.refuse = False

    def stream_opened(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> Stream | None:
        self.events.append(("opened", stream_id, headers, end_stream))
        return None if self.refuse else Stream()

    def headers_received(self, stream: Stream, headers: dict[str, str], end_stream: bool) -> None:
        self.events.append(("headers", stream.id, headers, end_stream))

    def stream_data(self, stream: Stream, data: Payload) -> None:
        self.events.append(("data", stream.id, bytes(data)))

    def stream_ended(self, stream: Stream) -> None:
        self.events.append(("ended", stream.id))

    def stream_reset(self, stream: Stream, code: int | None) -> None:
        self.events.append(("reset", stream.id, code))

    def drained(self, stream: Stream) -> None:
        self.events.append(("drained", stream.id))

    def goaway_received(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.events.append(("goaway", last_stream_id, code))

    def connection_failed(self, reason: str) -> None:
        self.events.append(("failed", reason))

    def deadline_passed(self, stream: Stream) -> None:
        self.events.append(("deadline", stream.id))

    def take(self, drained: bool = False) -> list[Event]:
        """The events so far, but for `drained` unless asked for."""
        events, self.events = self.events, []
        return [e for e in events if drained or e[0] != "drained"]


class Pair:
    """A client and a server connection, wired back to back through `exchange`."""

    def __init__(self, max_streams: int = 16, limits: H2Limits = DEFAULT_H2_LIMITS) -> None:
        self.clock = Clock()
        self.client_events, self.server_events = Recorder(), Recorder()
        self.client = Connection(
            self.client_events, client=True, peer="the server", now=self.clock.time, call_at=self.clock.call_at
        )
        self.server = Connection(
            self.server_events, client=False, peer="the client", now=self.clock.time, call_at=self.clock.call_at,
            max_peer_streams=max_streams, limits=limits,
        )  # fmt: skip
        self.client_sink, self.server_sink = MemorySink(), MemorySink()
        self.client.start(self.client_sink)
        self.server.start(self.server_sink)
        self.exchange()

    def exchange(self) -> None:
        while self.client_sink.data or self.server_sink.data:
            if self.client_sink.data:
                self.server.receive(self.client_sink.take())
            if self.server_sink.data:
                self.client.receive(self.server_sink.take())

    def request(self, body: bytes = b"hello", **extra: str) -> Stream:
        stream = Stream()
        stream_id = self.client.open_stream(stream)
        self.client.send_headers(stream_id, block(**{":method": "POST", ":scheme": "http", ":path": "/x", **extra}))
        self.client.send_data(stream, body, end_stream=True)
        return stream


def block(**fields: str) -> bytes:
    return b"".join(literal(name.encode(), value.encode()) for name, value in fields.items())


def frames_in(data: bytes) -> list[tuple[int, int, int, bytes]]:
    return [(t, f, s, bytes(p)) for t, f, s, p in FrameReader().feed(data)]


def test_settings_are_exchanged_and_acknowledged() -> None:
    pair = Pair(max_streams=7)
    assert pair.client.peer_max_streams == 7  # the server's limit, learnt from its SETTINGS
    assert pair.server.peer_max_streams == h2.LAST_STREAM_ID  # the client sets none
    assert not pair.client.closed() and not pair.server.closed()
    assert pair.client_events.take() == [] and pair.server_events.take() == []


def test_a_request_and_its_response() -> None:
    pair = Pair()
    stream = pair.request(b"hello")
    assert stream.id == 1 and stream.local_ended
    pair.exchange()
    assert pair.server_events.take() == [
        ("opened", 1, {":method": "POST", ":scheme": "http", ":path": "/x"}, False),
        ("data", 1, b"hello"),
        ("ended", 1),
    ]
    answer = pair.server.streams[1]
    pair.server.send_headers(1, block(**{":status": "200"}))
    pair.server.send_data(answer, b"world")
    pair.server.send_trailers(answer, block(**{"grpc-status": "0"}))
    assert 1 not in pair.server.streams  # trailers end an answer
    pair.exchange()
    assert pair.client_events.take() == [
        ("headers", 1, {":status": "200"}, False),
        ("data", 1, b"world"),
        ("headers", 1, {"grpc-status": "0"}, True),
        ("ended", 1),
    ]
    pair.client.close_stream(stream)
    assert not pair.client.streams and not pair.client_sink.data  # both sides ended: no RST_STREAM


def test_a_reply_split_anywhere_reads_as_one_read_does() -> None:
    # Whole frames are cut in `Receiver` itself, split ones by its FrameReader: every split of the
    # reply's three frames, and a read that ends inside a frame after whole ones, reads the same.
    pair = Pair()
    pair.request(b"hello")
    pair.exchange()
    pair.server_events.take()
    answer = pair.server.streams[1]
    pair.server.send_headers(1, block(**{":status": "200"}))
    pair.server.send_data(answer, b"world")
    pair.server.send_trailers(answer, block(**{"grpc-status": "0"}))
    reply = pair.server_sink.take()
    expected = [
        ("headers", 1, {":status": "200"}, False),
        ("data", 1, b"world"),
        ("headers", 1, {"grpc-status": "0"}, True),
        ("ended", 1),
    ]
    for cut in range(1, len(reply)):
        events = Recorder()
        client = Connection(events, client=True, peer="s", now=pair.clock.time, call_at=pair.clock.call_at)
        client.start(MemorySink())
        client.receive(frame(h2.SETTINGS, 0, 0, b""))
        client.open_stream(Stream())
        client.receive(reply[:cut])
        client.receive(reply[cut:])
        assert events.take() == expected, cut


def test_data_waits_for_small_windows_and_goes_in_order() -> None:
    pair = Pair()
    # The server says its streams take 10 bytes at a time; the connection window is the default.
    pair.client.receive(frame(h2.SETTINGS, 0, 0, struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, 10)))
    pair.client_sink.take()  # the ACK
    stream = pair.request(b"0123456789abcdefghijklmnopqrstuvwxy")
    sent = frames_in(pair.client_sink.take())
    assert [(t, f) for t, f, _, p in sent] == [(h2.HEADERS, h2.END_HEADERS), (h2.DATA, 0)] and len(sent[1][3]) == 10
    assert not stream.local_ended and pair.client_events.take(drained=True) == []
    for _ in range(3):
        pair.client.receive(frame(h2.WINDOW_UPDATE, 0, 1, (10).to_bytes(4, "big")))
    sent = frames_in(pair.client_sink.take())
    assert [(len(p), f) for _, f, _, p in sent] == [(10, 0), (10, 0), (5, h2.END_STREAM)]
    assert b"".join(p for *_, p in sent) == b"abcdefghijklmnopqrstuvwxy"
    assert stream.local_ended and pair.client_events.take(drained=True) == [("drained", 1)]


def test_a_stream_whose_window_opens_goes_before_one_still_shut() -> None:
    pair = Pair()
    pair.client.receive(frame(h2.SETTINGS, 0, 0, struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, 0)))
    first, second = pair.request(b"first"), pair.request(b"second")
    pair.client.receive(frame(h2.WINDOW_UPDATE, 0, 3, (6).to_bytes(4, "big")))
    assert second.local_ended and not first.local_ended
    pair.client.receive(frame(h2.WINDOW_UPDATE, 0, 1, (5).to_bytes(4, "big")))
    assert first.local_ended
    pair.exchange()
    data = [e[1:] for e in pair.server_events.take() if e[0] == "data"]
    assert data == [(3, b"second"), (1, b"first")]


def test_an_empty_end_of_stream_needs_no_window() -> None:
    pair = Pair()
    pair.client.receive(frame(h2.SETTINGS, 0, 0, struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, 0)))
    stream = pair.request(b"")
    assert stream.local_ended
    pair.exchange()
    assert pair.server_events.take()[-1] == ("ended", 1)


def test_long_header_blocks_go_in_continuation_frames() -> None:
    pair = Pair()
    pair.request(b"x", padding="p" * 40_000)
    sent = pair.client_sink.take()
    assert [t for t, *_ in frames_in(sent)][:4] == [h2.HEADERS, h2.CONTINUATION, h2.CONTINUATION, h2.DATA]
    pair.server.receive(sent)
    opened = pair.server_events.take()[0]
    assert opened[:2] == ("opened", 1) and opened[2]["padding"] == "p" * 40_000


def test_a_frame_inside_a_header_block_ends_the_connection() -> None:
    pair = Pair()
    pair.server.receive(frame(h2.HEADERS, 0, 1, block(a="b")) + frame(h2.PING, 0, 0, bytes(8)))
    assert pair.server_events.take() == [("failed", "the client broke a header block (frame type 6)")]
    (goaway,) = frames_in(pair.server_sink.take())
    assert goaway[0] == h2.GOAWAY and goaway[3][4:] == h2.PROTOCOL_ERROR.to_bytes(4, "big")
    assert pair.server.closed()


def test_ping_is_answered() -> None:
    pair = Pair()
    pair.server.receive(frame(h2.PING, 0, 0, b"8 bytes!"))
    assert frames_in(pair.server_sink.take()) == [(h2.PING, h2.ACK, 0, b"8 bytes!")]
    pair.server.receive(frame(h2.PING, h2.ACK, 0, b"8 bytes!"))
    assert not pair.server_sink.data  # an ACK is not answered


def test_a_reset_reaches_the_other_side() -> None:
    pair = Pair()
    stream = pair.request()
    pair.exchange()
    pair.server_events.take()
    assert pair.client.reset_stream(stream, h2.CANCEL)
    assert not pair.client.reset_stream(stream, h2.CANCEL)  # once
    pair.exchange()
    assert pair.server_events.take() == [("reset", 1, h2.CANCEL)]
    assert not pair.server.streams and not pair.client.streams


def test_streams_past_the_limit_are_refused() -> None:
    pair = Pair(max_streams=1)
    pair.request()
    late = pair.request()
    pair.exchange()
    assert [e[0] for e in pair.server_events.take()] == ["opened", "data", "ended"]  # stream 1 only
    assert pair.client_events.take() == [("reset", late.id, h2.REFUSED_STREAM)]


def test_goaway_drains_then_closes() -> None:
    pair = Pair()
    pair.request()
    pair.exchange()
    pair.server.close_when_idle()
    pair.exchange()
    assert pair.client_events.take() == [("goaway", 1, h2.NO_ERROR)]
    assert pair.client.draining and not pair.server.closed()  # stream 1 goes on
    answer = pair.server.streams[1]
    pair.server.send_headers(1, block(**{":status": "200"}))
    pair.server.send_trailers(answer, block(**{"grpc-status": "0"}))
    assert pair.server.closed()  # its last stream is done
    pair.exchange()
    assert pair.client_events.take()[-1] == ("ended", 1)


def test_streams_a_goaway_left_out_are_reset() -> None:
    pair = Pair()
    stream = pair.request()
    pair.client_sink.take()  # lost on the way: the server never saw stream 1
    pair.client.receive(frame(h2.GOAWAY, 0, 0, struct.pack(">LL", 0, h2.NO_ERROR)))
    assert pair.client_events.take() == [("goaway", 0, h2.NO_ERROR), ("reset", stream.id, None)]
    assert pair.client.closed()  # nothing left to drain


def test_a_deadline_passes_once() -> None:
    pair = Pair()
    early, late = pair.request(), pair.request()
    pair.client.set_deadline(late, 5.0)
    pair.client.set_deadline(early, 1.0)
    pair.clock.advance(1.0)
    assert pair.client_events.take() == [("deadline", early.id)]
    pair.clock.advance(3.0)
    assert pair.client_events.take() == []
    pair.clock.advance(1.0)
    assert pair.client_events.take() == [("deadline", late.id)]
    assert pair.clock.timers == []


@pytest.mark.parametrize(
    "data,reason",
    [
        (b"GET / HTTP/1.1\r\n\r\n", "the client did not start with the HTTP/2 preface: it is not HTTP/2"),
        (h2.PREFACE + frame(h2.PING, 0, 0, bytes(8)), "the client did not start with SETTINGS: it is not HTTP/2"),
        (h2.PREFACE + frame(h2.SETTINGS, 0, 0, b"12345"), "the client sent a malformed SETTINGS frame"),
        (h2.PREFACE + frame(h2.SETTINGS, 0, 0) + frame(h2.HEADERS, 4, 2, b""), "the client sent headers on stream 2, which we never opened"),
    ],
)  # fmt: skip
def test_a_peer_that_breaks_the_rules_gets_goaway(data: bytes, reason: str) -> None:
    events = Recorder()
    clock = Clock()
    server = Connection(events, client=False, peer="the client", now=clock.time, call_at=clock.call_at)
    sink = MemorySink()
    server.start(sink)
    server.receive(data)
    assert events.take() == [("failed", reason)]
    assert frames_in(sink.take())[-1][0] == h2.GOAWAY and sink.closing


@pytest.mark.parametrize(
    "response",
    [
        {"content-type": "application/grpc"},  # no :status
        {":status": "200", ":path": "/x"},  # a request's pseudo-header
        {":status": "2000"},
        {":status": "200", "Content-Type": "application/grpc"},
        {":status": "200", "connection": "close"},
    ],
)
def test_a_malformed_response_is_a_stream_error(response: dict[str, str]) -> None:
    pair = Pair()
    pair.request()
    pair.exchange()
    pair.client_events.take()
    pair.server.send_headers(1, block(**response))
    pair.client.receive(pair.server_sink.take())
    assert pair.client_events.take() == [("reset", 1, h2.PROTOCOL_ERROR)]
    assert (h2.RST_STREAM, 0, 1, h2.PROTOCOL_ERROR.to_bytes(4, "big")) in frames_in(pair.client_sink.take())
    assert not pair.client.closed()


def test_trailers_with_a_pseudo_header_or_without_end_stream_are_a_stream_error() -> None:
    pair = Pair()
    pair.request()
    pair.request()
    pair.exchange()
    pair.server.send_headers(1, block(**{":status": "200"}))
    pair.server.send_headers(1, block(**{":status": "200"}), end_stream=True)  # pseudo-header in trailers
    pair.server.send_headers(3, block(**{":status": "200"}))
    pair.server.send_headers(3, block(**{"grpc-status": "0"}))  # a second block, not the end
    pair.client_events.take()
    pair.client.receive(pair.server_sink.take())
    resets = [e for e in pair.client_events.take() if e[0] == "reset"]
    assert resets == [("reset", 1, h2.PROTOCOL_ERROR), ("reset", 3, h2.PROTOCOL_ERROR)]


def test_rapid_reset_ends_the_connection_and_a_slow_one_does_not() -> None:
    pair = Pair(max_streams=2000)
    for _ in range(100):
        stream = pair.request()
        pair.exchange()
        pair.client.reset_stream(stream, h2.CANCEL)
        pair.exchange()
        pair.clock.advance(1 / 30)  # under 33/s
    assert not pair.server.closed()
    pair.server_events.take()
    for _ in range(1100):  # at once: over the burst of 1000
        pair.client.reset_stream(pair.request(), h2.CANCEL)
    pair.exchange()
    assert ("failed", "the client reset streams faster than 33/s") in pair.server_events.take()
    assert pair.server.closed()


def test_unread_answers_past_the_cap_end_the_connection() -> None:
    pair = Pair()
    pair.server.receive(frame(h2.PING, 0, 0, bytes(8)) * 1000)  # the test sink holds them all: unread
    assert not pair.server.closed()
    pair.server.receive(frame(h2.PING, 0, 0, bytes(8)) * 2)
    assert pair.server.closed()
    assert pair.server_events.take() == [("failed", "the client floods us with frames to answer and reads none")]


def test_empty_frames_without_end_end_the_connection() -> None:
    pair = Pair()
    stream = Stream()
    pair.client.open_stream(stream)
    pair.client.send_headers(1, block(**{":method": "POST", ":scheme": "http", ":path": "/x"}))
    pair.exchange()
    pair.server_events.take()
    empty_data = frame(h2.DATA, 0, 1, b"")
    pair.server.receive(empty_data * 1000 + frame(h2.DATA, 0, 1, b"x") + empty_data * 1000)  # data in between
    assert not pair.server.closed()
    pair.server.receive(empty_data)
    assert ("failed", "the client sends empty frames without end") in pair.server_events.take()
    assert pair.server.closed()


def test_empty_continuations_without_end_end_the_connection() -> None:
    pair = Pair()
    pair.server.receive(frame(h2.HEADERS, 0, 1, b"") + frame(h2.CONTINUATION, 0, 1, b"") * 1001)
    assert pair.server_events.take() == [("failed", "the client sends empty frames without end")]
    assert pair.server.closed()


#: Each limit low, so that a few frames pass it (the server's --grpc-http2-* flags set them).
LOW = H2Limits(max_induced=3, max_empty_frames=3, reset_burst=2, reset_rate_per_s=1.0, max_header_block=64)


@pytest.mark.parametrize("limits", [DEFAULT_H2_LIMITS, LOW], ids=["default", "low"])
def test_each_limit_is_the_connections_own(limits: H2Limits) -> None:
    """The frames that pass the defaults end a connection given lower limits, each with its reason."""
    outcomes = []
    pair = Pair(limits=limits)  # unread answers: the test sink holds them all
    pair.server.receive(frame(h2.PING, 0, 0, bytes(8)) * 5)
    outcomes.append(pair.server_events.take())
    pair = Pair(limits=limits)
    pair.server.receive(frame(h2.HEADERS, 0, 1, b"") + frame(h2.CONTINUATION, 0, 1, b"") * 5)
    outcomes.append(pair.server_events.take())
    pair = Pair(limits=limits)
    pair.server.receive(frame(h2.HEADERS, 0, 1, b"") + frame(h2.CONTINUATION, 0, 1, b"x" * 65))
    outcomes.append(pair.server_events.take())
    pair = Pair(limits=limits)
    for _ in range(3):
        pair.client.reset_stream(pair.request(), h2.CANCEL)
    pair.exchange()
    outcomes.append([e for e in pair.server_events.take() if e[0] == "failed"])
    if limits is DEFAULT_H2_LIMITS:
        assert outcomes == [[], [], [], []]
    else:
        assert outcomes == [
            [("failed", "the client floods us with frames to answer and reads none")],
            [("failed", "the client sends empty frames without end")],
            [("failed", "the client sent a header block over 64 bytes")],
            [("failed", "the client reset streams faster than 1/s")],
        ]


def test_a_header_block_limit_under_one_frame_holds_for_a_lone_headers_frame() -> None:
    pair = Pair(limits=H2Limits(max_header_block=16))
    pair.server.receive(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, block(**{":path": "/" + "x" * 32})))
    assert pair.server_events.take() == [("failed", "the client sent a header block over 16 bytes")]
    assert pair.server.closed()
