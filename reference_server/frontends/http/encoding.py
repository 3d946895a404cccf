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

from reference_server.frontends.compression import CODINGS, Corrupt, TooLarge, compress_async, inflate_async
from reference_server.frontends.http.messages import Handler, HttpRequest, HttpResponse, error_response

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
    costs two dictionary lookups."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, compresses: frozenset[str] = frozenset()) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.compresses = compresses  # path suffixes whose answers may be compressed

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        headers = request.headers
        encoding = headers.get("content-encoding")
        if encoding is not None:
            refusal = await self._inflate(request, encoding.strip().lower())
            if refusal is not None:
                return refusal
        response = await self.handler(request)
        accept = headers.get("accept-encoding")
        if accept is not None and response.status == 200 and request.path.endswith(tuple(self.compresses)):
            await _compress_answer(response, accept)
        return response

    async def _inflate(self, request: HttpRequest, encoding: str) -> HttpResponse | None:
        """Replace the request's body with its inflated form; or the answer refusing it."""
        if encoding in _IDENTITY:
            return None
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


async def _compress_answer(response: HttpResponse, accept_encoding: str) -> None:
    if response.stream is not None or len(response.body) < MIN_COMPRESS:
        return
    coding = response_coding(accept_encoding)
    if coding is None:
        return
    response.body = await compress_async(response.body, coding)
    response.headers = (*response.headers, ("Content-Encoding", coding), ("Vary", "Accept-Encoding"))
