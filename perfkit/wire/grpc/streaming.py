"""Streaming inference for the load generator's hot path: gRPC `ModelStreamInfer` on the lean
HTTP/2 client (`perfkit.wire.grpc.channel`), with every response of every request timed.

Theory of operation (Triton's src/grpc/stream_infer_handler.cc, perf_analyzer's src/infer_context.cc):

- Streams, as perf_analyzer keeps them: one bidirectional stream per concurrent context, one
  request outstanding on it at a time. `StreamChannel.exchange` takes an idle stream (or opens
  one: HEADERS without END_STREAM and without grpc-timeout, since a stream outlives any one
  request), writes the request's message, and waits for its final flag; the stream then goes
  back to the pool. A closed loop of N thus holds N streams; an open loop as many as it has
  requests in flight.
- Final flags: every response Triton sends on a stream carries `triton_final_response`; the
  request asks with `triton_enable_empty_final_response` (as perf_analyzer does), so the flag
  always comes, alone in an empty response when the model sends it without outputs (a "null"
  response: not counted as a response, as in perf_analyzer). A response without the parameter is
  final, as tritonclient reads it (a request refused before it ran gets one error reply).
- Timing: each response's arrival is read (`perf_counter_ns`) when the DATA frame that ends its
  message arrives, before it is parsed, and kept in `Exchange.response_ns`: the first response's
  latency, the gaps between responses and the count per request all come from those times. Parsing
  (ModelStreamInferResponse, the outputs' count checked against raw_output_contents) is
  `Exchange.parse_ns`, perf_analyzer's "unmarshal response".
- Never a hang: each request has the request timeout as a deadline on its stream (the
  connection's one timer). When it passes before the final flag, the stream is reset (CANCEL, so
  the server cancels the request) and dropped, and the request ends with DEADLINE_EXCEEDED and
  the responses it did get. An `error_message` reply marks the request failed and ends it when
  final; the stream stays usable, as in Triton.
- Bounds (`perfkit.wire.limits`): a message is read against its own 5-byte prefix, refused past
  `max_message` (RESOURCE_EXHAUSTED); a reply on a stream with no request outstanding, or a
  compressed one we never asked for, is a broken peer (MALFORMED).
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import Sequence

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from perfkit.wire.grpc.channel import Channel
from perfkit.wire.grpc.connection import Call, Connection
from perfkit.wire.limits import MAX_REPLY_BODY
from v2kit import grpc_status as status
from v2kit.grpc_status import MALFORMED
from v2kit.h2.connection import Payload
from v2kit.h2.frames import CANCEL, literal

__all__ = ["EMPTY_FINAL", "FINAL", "Exchange", "StreamChannel", "encode_stream_headers"]

FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
_now = time.perf_counter_ns


class Exchange:
    """One request on a stream and what came back: `status` (0: the final flag came; else the gRPC
    status that ended it, `MALFORMED` for a broken reply), `details`, `error_response` (the first
    `error_message` the server sent for it, "" if none), `response_ns` (the arrival of each response
    that carried outputs), `bytes_in`, `parse_ns`, and `sent_ns` (when its message was handed to the
    transport)."""

    __slots__ = ("future", "status", "details", "error_response", "response_ns", "bytes_in", "parse_ns", "sent_ns")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.status = status.OK
        self.details = ""
        self.error_response = ""
        self.response_ns: list[int] = []
        self.bytes_in = 0
        self.parse_ns = 0
        self.sent_ns = 0

    def end(self, code: int = status.OK, details: str = "") -> None:
        if not self.future.done():
            self.status, self.details = code, details
            self.future.set_result(None)  # not self: no reference cycle per request


def encode_stream_headers(authority: str, tls: bool, metadata: Sequence[tuple[str, str]] = ()) -> bytes:
    """The HPACK block that opens a `ModelStreamInfer` stream (static-table indexes and literals
    without indexing, as `v2kit.h2.frames.encode_call`'s, but no grpc-timeout: the stream lives on)."""
    fields = [
        b"\x83",  # :method POST
        b"\x87" if tls else b"\x86",  # :scheme https | http
        literal(4, STREAM_INFER.encode()),  # :path
        literal(1, authority.encode()),  # :authority
        literal(b"te", b"trailers"),
        literal(31, b"application/grpc"),  # content-type
        literal(58, b"perfkit-grpc"),  # user-agent
    ]
    return b"".join([*fields, *(literal(key.encode(), value.encode()) for key, value in metadata)])


class InferStream(Call):
    """A `ModelStreamInfer` stream: the bytes of a reply message not all in yet, and the request
    outstanding on it. Its `future` is done when the stream has ended."""

    __slots__ = ("buffer", "exchange", "connection")

    def __init__(self, future: asyncio.Future[None], connection: StreamConnection) -> None:
        Call.__init__(self, future)
        self.buffer = bytearray()
        self.exchange: Exchange | None = None
        self.connection = connection


class StreamConnection(Connection):
    """An HTTP/2 connection carrying `InferStream`s (see the module's docstring)."""

    def open(self, block: bytes) -> InferStream:
        stream = InferStream(self._loop.create_future(), self)
        stream_id = self.h2.open_stream(stream)
        self.h2.send_headers(stream_id, block)
        return stream

    def send(self, stream: InferStream, exchange: Exchange, body: bytes, deadline: float) -> None:
        """Write one request's length-prefixed message on `stream`; `exchange` ends by `deadline`."""
        stream.exchange = exchange
        stream.sent_ns = 0
        self.h2.set_deadline(stream, deadline)
        self.h2.send_data(stream, body)
        exchange.sent_ns = stream.sent_ns  # 0 while the windows hold some of it back

    def stream_data(self, stream: Call, data: Payload) -> None:
        assert isinstance(stream, InferStream)
        arrived = _now()
        buffer = stream.buffer
        buffer += data
        while len(buffer) >= 5:
            if buffer[0] != 0:
                self._refuse(stream, MALFORMED, "a compressed reply message, though the request asked for none")
                return
            size = int.from_bytes(buffer[1:5], "big")
            if size > self.max_message:
                details = f"received message larger than max ({size} vs. {self.max_message})"
                self._refuse(stream, status.RESOURCE_EXHAUSTED, details)
                return
            if len(buffer) < 5 + size:
                return
            message = bytes(buffer[5 : 5 + size])
            del buffer[: 5 + size]
            self._reply(stream, message, arrived)
            if stream.future.done():
                return

    def _reply(self, stream: InferStream, message: bytes, arrived: int) -> None:
        exchange = stream.exchange
        if exchange is None:
            self._refuse(stream, MALFORMED, "a reply on a stream with no request outstanding")
            return
        exchange.bytes_in += len(message)
        try:
            reply = pb.ModelStreamInferResponse.FromString(message)
        except DecodeError as exc:
            self._refuse(stream, MALFORMED, f"the reply is not a ModelStreamInferResponse: {exc}")
            return
        response = reply.infer_response
        parameters = response.parameters
        final = parameters[FINAL].bool_param if FINAL in parameters else True
        if reply.error_message:
            exchange.error_response = exchange.error_response or reply.error_message
        elif response.outputs or not final:  # else a final flag alone: not a response
            if len(response.raw_output_contents) not in (0, len(response.outputs)):
                exchange.error_response = exchange.error_response or "raw_output_contents does not match the outputs"
            exchange.response_ns.append(arrived)
        exchange.parse_ns += _now() - arrived
        if final:
            stream.exchange = None
            self.h2.set_deadline(stream, math.inf)
            exchange.end()

    def drained(self, stream: Call) -> None:
        stream.sent_ns = _now()
        if isinstance(stream, InferStream) and stream.exchange is not None:
            stream.exchange.sent_ns = stream.sent_ns

    def stream_ended(self, stream: Call) -> None:
        # The server ended the call: whatever it says, a request still outstanding got no final flag.
        self.h2.close_stream(stream)
        trailers = stream.trailers or {}
        code = trailers.get("grpc-status", "")
        if code.isdigit() and int(code) != status.OK:
            self._settle(stream, int(code), trailers.get("grpc-message", ""))
        else:
            self._settle(stream, status.UNAVAILABLE, "the server ended the stream before the final response")

    def deadline_passed(self, stream: Call) -> None:
        self.h2.reset_stream(stream, CANCEL)
        self._settle(stream, status.DEADLINE_EXCEEDED, "no final response within the request timeout")

    def _settle(self, call: Call, code: int, details: str) -> None:
        super()._settle(call, code, details)
        if isinstance(call, InferStream) and call.exchange is not None:
            exchange, call.exchange = call.exchange, None
            exchange.end(code, details)


class StreamChannel(Channel):
    """`ModelStreamInfer` streams to `host:port`, pooled: one request outstanding on each."""

    connection_type = StreamConnection

    def __init__(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None = None, *, max_message: int = MAX_REPLY_BODY
    ) -> None:
        super().__init__(host, port, ssl_context, max_message=max_message)
        self._idle: list[InferStream] = []

    async def exchange(self, block: bytes, body: bytes, timeout_s: float) -> Exchange:
        """Send one request (`body`: its length-prefixed message) on an idle stream, or on a new one
        opened with `block`, and wait for its final flag or its failure; never raises but for
        cancellation."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        exchange = Exchange(loop.create_future())
        stream = self._take_idle()
        if stream is None:
            stream = await self._open_stream(block, deadline, exchange)
            if stream is None:  # no connection, or no room in time: `exchange` has ended with why
                return exchange
        stream.connection.send(stream, exchange, body, deadline)
        try:
            await exchange.future
        except asyncio.CancelledError:
            stream.connection.cancel(stream)
            raise
        if exchange.status == status.OK and not stream.future.done():
            self._idle.append(stream)
        return exchange

    def _take_idle(self) -> InferStream | None:
        idle = self._idle
        while idle:
            stream = idle.pop()
            if not stream.future.done() and stream.connection.takes_calls():
                return stream
            if not stream.future.done():  # its connection is going away: end our side
                stream.connection.cancel(stream)
        return None

    async def _open_stream(self, block: bytes, deadline: float, exchange: Exchange) -> InferStream | None:
        """A new stream opened with `block`; None, and `exchange` ended with why, when none could be."""
        connection = await self._ready(deadline)
        if isinstance(connection, Call):
            exchange.end(connection.status, connection.details)
            return None
        assert isinstance(connection, StreamConnection)
        if not connection.takes_calls():
            exchange.end(status.UNAVAILABLE, connection.error or "the connection closed")
            return None
        return connection.open(block)

    async def close(self) -> None:
        self._idle.clear()
        await super().close()
