"""An HTTP/1.1 server on asyncio protocols, parsing with llhttp (httptools): the REST front end's transport.

aiohttp builds a request object, a payload stream, a response object and its header multidict for
every request, and runs each through its router and middlewares: at concurrency 8 on the demo MLP
that was 22% of the server's CPU, more than everything but the model's own run (py-spy, bench/README.md).
Here llhttp parses in C and calls back into Python for the URL, each header, body chunks and
completion; a request becomes one `HttpRequest`, handed to the handler (a `messages.Responder`) as
it completes, and its answer, given to the request's `Reply` (an inference's, from the callback
that ends its batch: no task, no loop pass), one `HttpResponse` and one `write`.

Each accepted connection is a `connection.HttpConnection`, which owns what every request must
pass before a handler sees it (size, admission, timeouts, the head's bounds, back-pressure, RFC
9112); its docstring is the theory of operation. This module holds the server's settings, shared
by its connections.

`stop(grace_s)` stops accepting, lets the requests being served finish within the grace period,
then closes every connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from reference_server.core.tracing import Tracing
from reference_server.frontends.http import messages
from reference_server.frontends.http.connection import MAX_PIPELINED, HttpConnection
from reference_server.frontends.http.limits import DEFAULT_LIMITS, HttpLimits
from reference_server.frontends.http.messages import Admission, HttpRequest, HttpResponse, Responder, error_response
from reference_server.frontends.http.read_gate import ReadGate
from reference_server.frontends.listener import Listener

__all__ = ["MAX_PIPELINED", "Admission", "HttpRequest", "HttpResponse", "HttpServer", "error_response"]


class HttpServer(Listener):
    """Serves `handler` on one listening socket; see the module's docstring."""

    def __init__(
        self,
        handler: Responder | messages.Handler,
        *,
        max_body_bytes: int,
        body_timeout_s: float = 60.0,
        admission: Admission | None = None,
        needs_slot: messages.NeedsSlot | None = None,
        refusal: messages.Refusal | None = None,
        read_gate: ReadGate | None = None,
        access_log: logging.Logger | None = None,
        limits: HttpLimits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__()
        limits.validate()
        self.handler = handler
        #: Answers a request through a `Reply`; a coroutine handler runs in a task of its own.
        self.respond: Callable[[HttpRequest, messages.Reply], None] = messages.reply_through(handler)
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.limits = limits
        self.admission = admission
        self.needs_slot = needs_slot if admission is not None else None
        self.refusal = refusal or _default_refusal
        self.read_gate = read_gate
        self.access_log = access_log
        #: The trace settings (the plane's, set by the builder): while active, each request's read
        #: is timed for its trace (`Tracing.received`).
        self.tracing = Tracing()

    def connection(self) -> asyncio.Protocol:
        return HttpConnection(self)


def _default_refusal(exc: Exception) -> HttpResponse:
    return error_response(str(exc), 503)
