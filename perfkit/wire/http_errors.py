"""How an HTTP/1.1 exchange of `perfkit.wire.http_pool` fails, as the reply carries it.

A module of its own because the pool is compiled (mypyc) and these are not: a compiled class
cannot derive from `ConnectionError` or most other built-in exceptions. `http_pool` re-exports them.
"""

from __future__ import annotations

__all__ = ["BadResponse", "ConnectFailed", "Disconnected", "ReplyTooLarge"]


class Disconnected(ConnectionError):
    """The server closed the connection before the reply's headers were complete."""


class BadResponse(Exception):
    """The reply is not HTTP/1.1, or it ended before its body did."""


class ReplyTooLarge(BadResponse):
    """The reply's head or body is past what any inference answer needs (`perfkit.wire.limits`)."""


class ConnectFailed(Exception):
    """Opening the connection failed; `os_error` says why (refused, name resolution, TLS, ...)."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error) or type(os_error).__name__)
        self.os_error = os_error
