"""Keepalive pings, ping strikes and the advertised windows (v2kit.h2.pings, `H2Limits`): in memory
on a fake clock (a client and a server connection back to back), and on loopback against the gRPC
front end configured by its flags (tritonserver's --grpc-keepalive-* and --grpc-http2-*ping*, and
--grpc-http2-stream-window / --grpc-http2-connection-window), with a raw HTTP/2 client."""

from __future__ import annotations

import asyncio
import struct
import time
from types import SimpleNamespace
from typing import Any, cast

from reference_server.config import config_from_args
from reference_server.workers.frontends import build_grpc
from tests.h2peer import MemorySink
from tests.unit.test_grpc_server import Peer, Servicer, start
from tests.unit.test_h2_connection import Clock, Pair, Recorder, block, frames_in
from v2kit.h2 import frames as h2
from v2kit.h2.connection import Connection, Stream
from v2kit.h2.frames import frame
from v2kit.h2.pings import PingPolicy
from v2kit.h2.rules import H2Limits

PING = frame(h2.PING, 0, 0, bytes(8))


def pings_pair(**policy: Any) -> Pair:
    pair = Pair(limits=H2Limits(pings=PingPolicy(**policy)))
    pair.server_sink.reads = True  # the client reads: the cap on unread answers stays out of it
    return pair


def ping_outcomes(pair: Pair, count: int) -> list[str]:
    """What each of `count` PINGs from the client gets from the server: "ack", or the GOAWAY's code and debug data."""
    outcomes = []
    for _ in range(count):
        pair.server.receive(PING)
        for ftype, flags, _, payload in frames_in(pair.server_sink.take()):
            if ftype == h2.PING and flags & h2.ACK:
                outcomes.append("ack")
            elif ftype == h2.GOAWAY:
                outcomes.append(f"goaway {int.from_bytes(payload[4:8], 'big')} {payload[8:].decode()}")
    return outcomes


def test_more_pings_than_the_strikes_allow_get_enhance_your_calm_too_many_pings() -> None:
    # No call open, keepalive without calls not permitted: one PING per 2 hours (grpc core's rule).
    pair = pings_pair(max_ping_strikes=2)
    calm = f"goaway {h2.ENHANCE_YOUR_CALM} too_many_pings"
    assert ping_outcomes(pair, 4) == ["ack", "ack", "ack", calm]  # the 1st is free; strikes 1, 2, then 3 > 2
    assert pair.server.closed()
    assert pair.server_events.take() == [("failed", "the client sent PINGs too often")]
    assert ping_outcomes(pings_pair(max_ping_strikes=0), 50) == ["ack"] * 50  # 0: any number


def test_pings_apart_or_after_data_sent_are_no_strikes() -> None:
    pair = pings_pair(min_recv_ping_interval_s=1.0, max_ping_strikes=1)
    stream = pair.request()  # a call is open: the interval is the policy's, not 2 hours
    pair.exchange()
    assert ping_outcomes(pair, 1) == ["ack"]
    pair.clock.advance(1.0)
    assert ping_outcomes(pair, 2) == ["ack", "ack"]  # apart: no strike; then strike 1 of 1
    pair.server.send_headers(1, block(**{":status": "200"}))  # data sent forgives the strikes
    assert ping_outcomes(pair, 2) == ["ack", "ack"]
    assert ping_outcomes(pair, 1) == [f"goaway {h2.ENHANCE_YOUR_CALM} too_many_pings"]
    assert stream.id == 1
    # Permitted without calls: a connection with none open pings at the policy's interval too.
    idle = pings_pair(min_recv_ping_interval_s=1.0, max_ping_strikes=1, permit_without_calls=True)
    for _ in range(3):
        assert ping_outcomes(idle, 1) == ["ack"]
        idle.clock.advance(1.0)


def keepalive_pings(pair: Pair, period_s: float) -> int:
    """Keepalive PINGs the server sends in the next `period_s`; the client answers them."""
    pair.clock.advance(period_s)
    sent = sum(1 for ftype, flags, *_ in frames_in(bytes(pair.server_sink.data)) if ftype == h2.PING and not flags)
    pair.exchange()
    return sent


def test_keepalive_pings_go_while_calls_are_open_up_to_the_cap_without_data() -> None:
    pair = pings_pair(keepalive_time_s=10.0, keepalive_timeout_s=1.0, max_pings_without_data=2)
    pair.server_sink.reads = False
    assert keepalive_pings(pair, 10.0) == 0  # no call open
    pair.request()
    pair.exchange()
    assert [keepalive_pings(pair, 10.0) for _ in range(3)] == [1, 1, 0]  # answered; the 3rd waits for data
    pair.server.send_headers(1, block(**{":status": "200"}))
    assert keepalive_pings(pair, 10.0) == 1
    assert not pair.server.closed()  # every one was answered in time
    assert pair.server_events.take() == [("opened", 1, {":method": "POST", ":scheme": "http", ":path": "/x"}, False),
                                         ("data", 1, b"hello"), ("ended", 1)]  # fmt: skip


def test_a_keepalive_ping_not_answered_in_time_ends_the_connection() -> None:
    pair = pings_pair(keepalive_time_s=10.0, keepalive_timeout_s=1.0, permit_without_calls=True)
    pair.clock.advance(10.0)
    pair.server_sink.take()  # the PING, never answered
    pair.clock.advance(0.9)
    assert not pair.server.closed()
    pair.clock.advance(0.2)
    assert pair.server.closed()
    (goaway,) = [f for f in frames_in(pair.server_sink.take()) if f[0] == h2.GOAWAY]
    assert (int.from_bytes(goaway[3][4:8], "big"), goaway[3][8:]) == (h2.NO_ERROR, b"keepalive watchdog timeout")
    assert pair.server_events.take() == [("failed", "the client did not answer a keepalive PING within 1 s")]


class Deferring(Recorder):
    """Takes the client's streams as a streaming call does: their DATA given back once consumed."""

    def stream_opened(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> Stream | None:
        stream = super().stream_opened(stream_id, headers, end_stream)
        assert stream is not None
        stream.deferred = True
        self.stream = stream
        return stream


def test_a_smaller_stream_window_is_advertised_and_bounds_what_is_sent_unread() -> None:
    limits = H2Limits(stream_window=1000, connection_window=70_000)
    clock, sink = Clock(), MemorySink()
    server = Connection(Recorder(), client=False, peer="the client", now=clock.time, call_at=clock.call_at,
                        max_peer_streams=1, limits=limits)  # fmt: skip
    server.start(sink)
    opening = frames_in(sink.take())
    settings = [dict(struct.iter_unpack(">HL", p)) for t, f, _, p in opening if t == h2.SETTINGS and not f]
    updates = [int.from_bytes(p, "big") for t, _, s, p in opening if t == h2.WINDOW_UPDATE and s == 0]
    assert (settings[0][h2.INITIAL_WINDOW_SIZE], updates) == (1000, [70_000 - 65_535])

    pair = Pair(limits=limits)
    events = pair.server_events = Deferring()
    pair.server.events = events
    pair.request(body=b"x" * 3000)
    pair.exchange()
    taken = sum(len(e[2]) for e in events.take() if e[0] == "data")
    assert taken == 1000  # the client waits on the window: the rest stays on its side
    pair.server.consumed(events.stream)
    pair.exchange()
    assert sum(len(e[2]) for e in events.take() if e[0] == "data") == 1000
    # A client that ignores the window: DATA past it is FLOW_CONTROL_ERROR on its stream.
    pair.server.receive(frame(h2.DATA, 0, 1, b"y" * 1001))
    assert ("reset", 1, h2.FLOW_CONTROL_ERROR) in events.take()


# -- on loopback, the gRPC front end set by its flags


def limited(*flags: str) -> dict[str, Any]:
    config = config_from_args(["--model-repository", "unused", *flags])
    server = build_grpc(config, cast(Any, SimpleNamespace(tracing=None)), None)
    return {"max_streams": server.max_streams, "h2_limits": server.h2_limits}


async def next_of(peer: Peer, kind: int) -> tuple[int, bytes] | None:
    """The next frame of `kind` (flags, payload), or None once the server has closed."""
    while True:
        try:
            ftype, flags, _, payload = await peer.read_frame()
        except asyncio.IncompleteReadError:
            return None
        if ftype == kind:
            return flags, payload


def test_pings_past_the_flags_strikes_get_goaway_too_many_pings_on_loopback(run: Any) -> None:
    async def main() -> list[Any]:
        server, port = await start(Servicer(), **limited("--grpc-http2-max-ping-strikes", "1"))
        peer = await Peer.connect(port)
        got: list[Any] = []
        for _ in range(2):
            peer.writer.write(PING)
            got.append(await next_of(peer, h2.PING))
        peer.writer.write(PING)
        got.append(await next_of(peer, h2.GOAWAY))
        got.append(await next_of(peer, h2.GOAWAY))  # then the server closes
        peer.close()
        await server.stop(0)
        return got

    ack = (h2.ACK, bytes(8))
    calm = (0, struct.pack(">LL", 0, h2.ENHANCE_YOUR_CALM) + b"too_many_pings")
    assert run(main()) == [ack, ack, calm, None]  # the 1st is free, the 2nd strike 1, the 3rd one too many


def test_a_client_that_stops_answering_keepalive_pings_is_closed_on_loopback(run: Any) -> None:
    flags = ("--grpc-keepalive-time", "60", "--grpc-keepalive-timeout", "60", "--grpc-keepalive-permit-without-calls", "1",
             "--grpc-http2-max-pings-without-data", "0")  # fmt: skip

    async def main() -> tuple[list[float], tuple[int, bytes] | None, float, tuple[int, bytes] | None]:
        server, port = await start(Servicer(), **limited(*flags))
        start_at = time.monotonic()
        peer = await Peer.connect(port)
        pinged = []
        for answer in (True, False):
            ping = await next_of(peer, h2.PING)
            pinged.append(time.monotonic() - start_at)
            assert ping is not None and not ping[0] & h2.ACK
            if answer:
                peer.writer.write(frame(h2.PING, h2.ACK, 0, ping[1]))
        goaway = await next_of(peer, h2.GOAWAY)
        closed_after = time.monotonic() - start_at
        after = await next_of(peer, h2.GOAWAY)
        peer.close()
        await server.stop(0)
        return pinged, goaway, closed_after, after

    pinged, goaway, closed_after, after = run(main())
    # Wide margins: a busy machine runs timers late, never early.
    assert 0.05 <= pinged[0] and pinged[0] + 0.05 <= pinged[1], pinged  # a period apart: the answer was taken
    assert closed_after >= pinged[1] + 0.05, (pinged, closed_after)  # the timeout after the unanswered one
    assert closed_after < 10
    assert goaway == (0, struct.pack(">LL", 0, h2.NO_ERROR) + b"keepalive watchdog timeout")
    assert after is None


def test_the_window_flags_are_advertised_and_data_past_them_refused_on_loopback(run: Any) -> None:
    flags = ("--grpc-http2-stream-window", "4096", "--grpc-http2-connection-window", "100000")

    async def main() -> tuple[int, int, str]:
        server, port = await start(Servicer(), **limited(*flags))
        peer = await Peer.connect(port)
        settings = await next_of(peer, h2.SETTINGS)
        update = await next_of(peer, h2.WINDOW_UPDATE)
        assert settings is not None and update is not None
        peer.writer.write(
            frame(h2.HEADERS, h2.END_HEADERS, 1, peer.headers_block("ModelStreamInfer"))
            + frame(h2.DATA, 0, 1, bytes(4097))
        )
        _, _, trailers = await peer.until(1)
        peer.close()
        await server.stop(0)
        advertised = dict(struct.iter_unpack(">HL", settings[1]))[h2.INITIAL_WINDOW_SIZE]
        return advertised, int.from_bytes(update[1], "big"), trailers.get("reset", "")

    assert run(main()) == (4096, 100_000 - 65_535, str(h2.FLOW_CONTROL_ERROR))
