"""What the HTTP and gRPC front ends share: a listening socket, its connections, and a stop that
lets the requests in progress finish."""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol

__all__ = ["Connection", "Listener"]


class Connection(Protocol):
    def close_when_idle(self) -> None:
        """Take nothing new; close once what is in progress has been answered."""

    def abort(self) -> None: ...


class Listener:
    """Accepts connections made by `connection()`, counts the requests they serve (`busy`), and
    stops with a grace period."""

    def __init__(self) -> None:
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._serving = 0
        self._idle = asyncio.Event()  # nothing is being served
        self._idle.set()

    def connection(self) -> asyncio.Protocol:
        """A protocol for a new connection; it adds itself to `connections` and leaves when lost."""
        raise NotImplementedError

    async def listen(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None = None, *, reuse_port: bool = False
    ) -> int:
        """Bind and start accepting; returns the bound port (`port` 0 picks a free one). With
        `reuse_port`, other processes of this user may listen on the same port, and the kernel
        spreads new connections over them (SO_REUSEPORT)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.connection, host, port, ssl=ssl_context, reuse_address=True, reuse_port=reuse_port or None,
            backlog=128,
        )  # fmt: skip
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let what is being served finish within `grace_s`, then close everything."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        if self._serving and grace_s > 0:
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except asyncio.TimeoutError:
                pass
        for connection in list(self.connections):
            connection.abort()
        if server is not None:
            await server.wait_closed()

    def busy(self, delta: int) -> None:
        """A request started (+1) or ended (-1)."""
        self._serving += delta
        if self._serving:
            self._idle.clear()
        else:
            self._idle.set()
