"""HTTP content codings: a request body sent with `Content-Encoding: gzip | deflate` is inflated
before the handler sees it, and an inference answer is compressed when `Accept-Encoding` prefers a
coding we have, as Triton's HTTP front end does (tritonclient's `request_compression_algorithm`
and `response_compression_algorithm`).

- *Size.* The transport bounds the compressed body (`--http-max-input-size`); the inflated body
  is bounded by the same limit in `compression.inflate`, which stops at the first byte past it:
  413, with Triton's wording, never the whole bomb in memory.
- *Bad data.* A body that is not a whole gzip or deflate stream is 400.
- *Unknown coding.* 415 with `Accept-Encoding: gzip, deflate` (RFC 9110 §15.5.16); Triton answers
  501 (its UNSUPPORTED) for it, with the message this one begins with.
- *Answers.* Only inference answers are compressed, as in Triton; the coding is the one of gzip,
  deflate and identity with the highest q-value (RFC 9110 §12.5.3; `*` stands for those the
  header does not name, q=0 refuses one), the first listed on a tie, identity when none is
  acceptable. Bodies under `MIN_COMPRESS` bytes go out as they are: compressing them gains nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from reference_server.frontends.compression import (
    CODINGS,
    INLINE_COMPRESS,
    Corrupt,
    TooLarge,
    compress,
    compress_async,
    inflate_async,
)  # fmt: skip
from reference_server.frontends.http.messages import (
    Handler,
    HttpRequest,
    HttpResponse,
    Reply,
    Responder,
    error_response,
    internal_error,
    reply_through,
    reply_when_done,
)  # fmt: skip

__all__ = ["MIN_COMPRESS", "ContentCodings", "response_coding"]

#: Answers smaller than this are not compressed.
MIN_COMPRESS = 256

_ACCEPTED = (("Accept-Encoding", ", ".join(CODINGS)),)
_IDENTITY = ("", "identity")


def response_coding(accept_encoding: str) -> str | None:
    """The coding to answer with under `accept_encoding` (one of CODINGS), or None for identity."""
    best, best_q = None, 0.0
    named: set[str] = set()
    wildcard_q: float | None = None
    for item in accept_encoding.split(","):
        token, _, params = item.partition(";")
        coding = token.strip().lower()
        if not coding:
            continue
        q = _q_value(params)
        if q is None:
            continue  # malformed: ignored, as Triton does
        named.add(coding)
        if coding == "*":
            wildcard_q = q
            continue
        if coding in ("identity", *CODINGS) and q > best_q:
            best, best_q = coding, q
    if wildcard_q is not None and wildcard_q > best_q:
        best = next((c for c in CODINGS if c not in named), best)
    return None if best in (None, "identity") else best


def _q_value(params: str) -> float | None:
    """A coding's weight from its parameters (1 without one); None when malformed."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return None
            return q if 0.0 <= q <= 1.0 else None
    return 1.0


class ContentCodings:
    """Wraps a handler: inflates a compressed request body, and compresses the 200 answers of
    paths ending in one of `compresses` as Accept-Encoding asks. A request with neither header
    costs two dictionary lookups, and is handed on as it came: a `Responder` keeps answering from
    its own callback. Inflating a body, or compressing a large answer, takes a task (the work may
    go to a worker thread)."""

    def __init__(
        self, handler: Responder | Handler, *, max_body_bytes: int, compresses: frozenset[str] = frozenset()
    ) -> None:
        self.handler = handler
        self._respond: Callable[[HttpRequest, Reply], None] = reply_through(handler)
        self.max_body_bytes = max_body_bytes
        self.compresses = tuple(compresses)  # path suffixes whose answers may be compressed

    def respond(self, request: HttpRequest, reply: Reply) -> None:
        headers = request.headers
        accept = headers.get("accept-encoding")
        if accept is not None and request.path.endswith(self.compresses):
            reply = partial(_compressing, reply, accept, f"{request.method} {request.path}")
        encoding = headers.get("content-encoding")
        if encoding is None or encoding.strip().lower() in _IDENTITY:
            self._respond(request, reply)
            return
        what = f"{request.method} {request.path}"
        reply_when_done(self._inflated(request, encoding.strip().lower()), reply, partial(internal_error, what=what))

    async def _inflated(self, request: HttpRequest, encoding: str) -> HttpResponse:
        """The answer to `request` once its body is inflated; or the answer refusing it."""
        refusal = await self._inflate(request, encoding)
        if refusal is not None:
            return refusal
        answer: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
        self._respond(request, partial(_settle, answer))
        return await answer

    async def _inflate(self, request: HttpRequest, encoding: str) -> HttpResponse | None:
        """Replace the request's body with its inflated form; or the answer refusing it."""
        if encoding not in CODINGS:
            response = error_response(
                f"Unsupported compression type: Content-Encoding '{encoding}'; this server reads gzip and deflate",
                415,
            )
            response.headers = _ACCEPTED
            return response
        limit = self.max_body_bytes
        try:
            request.body = await inflate_async(request.body, encoding, limit)
        except TooLarge:
            message = (
                f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
                "Use --http-max-input-size to increase the limit."
            )
            return error_response(message, 413)
        except Corrupt as exc:
            return error_response(f"failed to decompress the request body (Content-Encoding: {encoding}): {exc}", 400)
        del request.headers["content-encoding"]
        return None


def _settle(answer: asyncio.Future[HttpResponse], response: HttpResponse) -> None:
    if not answer.done():  # a cancelled wait (the loop stopping) has been answered already
        answer.set_result(response)


def _compressing(reply: Reply, accept_encoding: str, what: str, response: HttpResponse) -> None:
    """`reply` with `response` compressed as `accept_encoding` asks, where it is a 200 worth it."""
    if response.status != 200 or response.stream is not None or len(response.body) < MIN_COMPRESS:
        reply(response)
        return
    coding = response_coding(accept_encoding)
    if coding is None:
        reply(response)
    elif len(response.body) <= INLINE_COMPRESS:
        reply(_coded(response, coding, compress(response.body, coding)))
    else:
        reply_when_done(_compressed(response, coding), reply, partial(internal_error, what=what))


async def _compressed(response: HttpResponse, coding: str) -> HttpResponse:
    return _coded(response, coding, await compress_async(response.body, coding))


def _coded(response: HttpResponse, coding: str, body: bytes) -> HttpResponse:
    response.body = body
    response.headers = (*response.headers, ("Content-Encoding", coding), ("Vary", "Accept-Encoding"))
    return response
