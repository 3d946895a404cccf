"""A raw HTTP/2 client on a blocking loopback socket, for tests that must misbehave as no real
client would (h2spec's cases, floods, oversized bodies). Bounded: every read has a timeout and a
connection reads at most `MAX_READ` bytes, so a test never hangs or grows without bound.

`MemorySink` is the other way in: a transport in memory for the HTTP/2 engine itself."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

import hpack

from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame

MAX_READ = 8 << 20
LIVE = "/inference.GRPCInferenceService/ServerLive"
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"  # a gRPC message prefix for an empty message


@dataclass(frozen=True)
class Frame:
    type: int
    flags: int
    stream_id: int
    payload: bytes

    def code(self) -> int:
        """The error code of a RST_STREAM or GOAWAY."""
        return int.from_bytes(self.payload[4:8] if self.type == h2.GOAWAY else self.payload[:4], "big")


def request_fields(path: str = LIVE, method: str = "POST") -> list[tuple[str, str]]:
    return [
        (":method", method), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ]  # fmt: skip


class Peer:
    """One connection: `send` raw bytes, `next` frame in (None once the server has closed)."""

    def __init__(self, port: int, *, timeout_s: float = 5.0, receive_buffer: int = 0) -> None:
        """`receive_buffer`: the socket's SO_RCVBUF (0: the system's), small for a peer that never reads."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout_s)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = bytearray()
        self.read = 0
        self.closed = False
        self.strict = True  # our server: a connection error must come as GOAWAY
        self.server_settings: dict[int, int] = {}

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    # -- out

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise AssertionError("the server stopped reading") from None
        except OSError:  # reset or closed by the server
            self.closed = True

    def handshake(self, settings: bytes = b"") -> None:
        """h2spec's: preface and SETTINGS, the server's SETTINGS answered, our SETTINGS acknowledged."""
        self.send(h2.PREFACE + frame(h2.SETTINGS, 0, 0, settings))
        acked = got = False
        while not (acked and got):
            f = self.next()
            assert f is not None, "the server closed the connection during the handshake"
            if f.type == h2.SETTINGS and f.flags & h2.ACK:
                acked = True
            elif f.type == h2.SETTINGS:
                got = True
                for offset in range(0, len(f.payload), 6):
                    key, value = struct.unpack_from(">HL", f.payload, offset)
                    self.server_settings[key] = value
                self.send(frame(h2.SETTINGS, h2.ACK, 0))

    def block(self, fields: list[tuple[str, str]]) -> bytes:
        return bytes(self.encoder.encode(fields))

    def headers(
        self, stream_id: int, fields: list[tuple[str, str]] | None = None, *, flags: int = h2.END_HEADERS
    ) -> None:
        self.send(frame(h2.HEADERS, flags, stream_id, self.block(fields or request_fields())))

    def call(self, stream_id: int, path: str = LIVE) -> None:
        """A whole unary call with an empty message."""
        self.headers(stream_id, request_fields(path))
        self.send(frame(h2.DATA, h2.END_STREAM, stream_id, EMPTY_MESSAGE))

    # -- in

    def next(self, timeout_s: float | None = None) -> Frame | None:
        """The next frame, or None once the connection is closed; fails after the timeout."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            if len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) >= 9 + length:
                    ftype, flags = self.buffer[3], self.buffer[4]
                    stream_id = int.from_bytes(self.buffer[5:9], "big") & h2.LAST_STREAM_ID
                    payload = bytes(self.buffer[9 : 9 + length])
                    del self.buffer[: 9 + length]
                    return Frame(ftype, flags, stream_id, payload)
            if self.closed:
                return None
            left = deadline - time.monotonic()
            assert left > 0, "no frame came in time"
            assert self.read < MAX_READ, "the server sent more than a test reads"
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except TimeoutError:
                raise AssertionError("no frame came in time") from None
            if not data:
                self.closed = True
            self.read += len(data)
            self.buffer += data

    def fields(self, f: Frame) -> dict[str, str]:
        """A HEADERS frame's fields (decoded in order: call it for every HEADERS that comes)."""
        return {str(k): str(v) for k, v in self.decoder.decode(f.payload)}

    def ping(self, data: bytes = b"h2spec\x00\x01") -> None:
        self.send(frame(h2.PING, 0, 0, data))


class MemorySink:
    """A transport for `v2kit.h2.connection` in memory: it keeps what is written until `take`.
    With `reads`, the peer takes every write as it comes, so nothing waits; without, all of it waits
    until `take`, as if the peer did not read (the engine's caps on unread answers then count)."""

    def __init__(self, *, reads: bool = False) -> None:
        self.data = bytearray()
        self.closing = False
        self.reads = reads

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for part in list_of_data:
            self.data += part

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0 if self.reads else len(self.data)

    def take(self) -> bytes:
        data, self.data = bytes(self.data), bytearray()
        return data
