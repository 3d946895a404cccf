"""A fault-injecting TCP proxy for tests: put it between perfkit and a server, then break the link.

`fault_proxy(upstream)` listens on 127.0.0.1 (a free port) in a background thread and forwards
every connection to `upstream` until told otherwise with `set_fault`:

- `"none"`: forward bytes both ways (the default).
- `"stall"`: stop forwarding in both directions; connections stay open and nothing more arrives,
  so requests hang until the client gives up. `set_fault("none")` lets the parked bytes through.
- `"reset"`: abort every connection with a TCP RST (SO_LINGER 0), open ones at once and new ones
  on accept.
- `"close"`: close connections cleanly (FIN) without answering.
- `"garbage"`: answer the next bytes the client sends with bytes that are not HTTP (or HTTP/2),
  then close.
- `"bad_body"`: answer the next HTTP request with `200 OK` and a body that is not a KServe
  response, keeping the connection.
- `"endless_head"`: answer the next HTTP request with a head whose header line never ends, and
  `"huge_body"` with a Content-Length of 10 GB and zeros: a hostile server's replies, streamed
  until the client hangs up (at most `HOSTILE_BUDGET` bytes a connection, so the proxy stays bounded).

With `upstream=None` there is nothing to forward to, and a connection under `"none"` is closed.
Being at the TCP level, it serves HTTP/1.1 and gRPC alike (`"bad_body"` is HTTP only). Loopback
only, and it stops with its context: nothing outlives a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["FAULTS", "FaultProxy", "fault_proxy"]

FAULTS = ("none", "stall", "reset", "close", "garbage", "bad_body", "endless_head", "huge_body")
GARBAGE = b"\x00\xff\xfe this is not a protocol reply \x00\r\n\r\n\x13\x37"
_NOT_KSERVE = b"{not: json \xff\xfe}!"
BAD_BODY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(_NOT_KSERVE),
    _NOT_KSERVE,
)
_CHUNK = 1 << 16
HOSTILE_BUDGET = 256 << 20
_HOSTILE = {
    "endless_head": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Endless: ", b"a" * _CHUNK),
    "huge_body": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n",
        bytes(_CHUNK),
    ),
}


@dataclass(slots=True, eq=False)  # identity-hashed: links live in a set
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    """The proxy's state; build it with `fault_proxy()`. Methods are safe to call from any thread."""

    def __init__(self, upstream: tuple[str, int] | None, fault: str = "none") -> None:
        _check(fault)
        self.upstream = upstream
        self.fault = fault
        self.port = 0
        self.connections = 0  # accepted so far
        self._links: set[_Link] = set()
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_fault(self, fault: str) -> None:
        _check(fault)
        assert self._loop is not None, "the proxy is not running"
        done = threading.Event()

        def apply() -> None:
            self.fault = fault
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()
            if fault in ("reset", "close"):
                for link in list(self._links):
                    self._drop(link, rst=fault == "reset")
            done.set()

        self._loop.call_soon_threadsafe(apply)
        done.wait(10)

    # --- on the proxy's loop ---------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.fault = "close"  # parked pumps wake up and drop their links
        if self._changed is not None:
            self._changed.set()
        for link in list(self._links):
            self._drop(link, rst=False)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            if self.fault in ("reset", "close") or (self.fault == "none" and self.upstream is None):
                self._drop(link, rst=self.fault == "reset")
                return
            if self.upstream is not None and self.fault == "none":
                try:
                    up_reader, upstream = await asyncio.open_connection(*self.upstream)
                except OSError:
                    self._drop(link, rst=True)  # the server is down: the client sees its connection fail
                    return
                if link not in self._links:  # a fault dropped the link while it was connecting
                    upstream.close()
                    return
                link.upstream = upstream
                link.tasks = [
                    asyncio.create_task(self._pump(reader, link.upstream, link, to_client=False)),
                    asyncio.create_task(self._pump(up_reader, writer, link, to_client=True)),
                ]
                await asyncio.gather(*link.tasks, return_exceptions=True)
            else:  # a fault from the start, with nothing to forward to
                await self._pump(reader, None, link, to_client=False)
        finally:
            self._drop(link, rst=False)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, link: _Link, *, to_client: bool
    ) -> None:
        try:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    break
                while self.fault == "stall":
                    assert self._changed is not None
                    await self._changed.wait()
                fault = self.fault
                if fault in ("reset", "close"):
                    self._drop(link, rst=fault == "reset")
                    return
                if fault == "garbage":
                    link.client.write(GARBAGE)
                    await link.client.drain()
                    self._drop(link, rst=False)
                    return
                if fault == "bad_body" and not to_client:
                    link.client.write(BAD_BODY)
                    await link.client.drain()
                    continue  # the request is swallowed; the connection stays up
                if fault in _HOSTILE and not to_client:
                    await _stream_hostile(link.client, *_HOSTILE[fault])
                    self._drop(link, rst=False)
                    return
                if dst is None:
                    continue
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if dst is not None and not dst.is_closing():
                with contextlib.suppress(OSError, RuntimeError):
                    dst.write_eof()

    def _drop(self, link: _Link, *, rst: bool) -> None:
        if link not in self._links:
            return
        self._links.discard(link)
        for writer in (link.client, link.upstream):
            if writer is None:
                continue
            if rst:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()
        for task in link.tasks:
            if task is not asyncio.current_task():
                task.cancel()


async def _stream_hostile(client: asyncio.StreamWriter, head: bytes, endless: bytes) -> None:
    """`head`, then `endless` over and over, until the client hangs up or HOSTILE_BUDGET is sent."""
    client.write(head)
    sent = len(head)
    while sent < HOSTILE_BUDGET and not client.is_closing():
        client.write(endless)
        sent += len(endless)
        await client.drain()


def _check(fault: str) -> None:
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")


@contextlib.contextmanager
def fault_proxy(upstream: tuple[str, int] | str | None, fault: str = "none") -> Iterator[FaultProxy]:
    """Run a FaultProxy to `upstream` ("HOST:PORT" or (host, port)) on a free loopback port."""
    if isinstance(upstream, str):
        host, _, port = upstream.rpartition(":")
        upstream = (host, int(port))
    proxy = FaultProxy(upstream, fault)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fault-proxy", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
        yield proxy
    finally:
        try:
            asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
