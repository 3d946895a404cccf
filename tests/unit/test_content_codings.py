"""The bounded inflater (`frontends/compression.py`) and HTTP's content-coding negotiation
(`frontends/http/encoding.py`): bombs stop at the limit, broken streams are refused, deflate is
read zlib-wrapped and raw, and Accept-Encoding's q-values choose the answer's coding."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
import zlib
from collections.abc import Callable

import pytest

from reference_server.frontends.compression import (
    CHUNK,
    INLINE_COMPRESS,
    INLINE_INFLATE,
    Corrupt,
    TooLarge,
    compress,
    compress_async,
    inflate,
    inflate_async,
)
from reference_server.frontends.http.encoding import ContentCodings, response_coding
from reference_server.frontends.http.messages import HttpRequest, HttpResponse


def gzip_bomb(inflated_mib: int) -> bytes:
    """A valid gzip stream of `inflated_mib` MiB of zeros, about a thousandth of that on the wire,
    built without compressing it all: after a full flush, each MiB of zeros compresses to the same bytes."""
    mib = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    first = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeated = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    end = compressor.flush()[:-8]  # the last block; the trailer is for the whole stream
    crc = 0
    for _ in range(inflated_mib):
        crc = zlib.crc32(mib, crc)
    trailer = crc.to_bytes(4, "little") + ((inflated_mib << 20) & 0xFFFFFFFF).to_bytes(4, "little")
    return first + repeated * (inflated_mib - 1) + end + trailer


def test_the_bomb_is_what_it_claims() -> None:
    bomb = gzip_bomb(3)
    assert gzip.decompress(bomb) == bytes(3 << 20)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),  # RFC 9110's deflate: zlib-wrapped
        ("deflate", _raw_deflate),  # what many clients send instead
        ("gzip", zlib.compress),  # either wrapper under either name, as Triton's inflateInit2(15 | 32)
    ],
)
def test_inflate_reads_each_wrapper(coding: str, encode: object) -> None:
    data = bytes(range(256)) * 5000
    assert callable(encode)
    assert inflate(encode(data), coding, len(data)) == data


def test_compress_round_trips_through_the_standard_library() -> None:
    data = b"perfkit " * 1000
    assert gzip.decompress(compress(data, "gzip")) == data
    assert zlib.decompress(compress(data, "deflate")) == data  # zlib-wrapped, per RFC 9110


@pytest.mark.parametrize("size", [INLINE_COMPRESS // 2, INLINE_COMPRESS * 8])  # on the loop; in a thread
def test_the_async_forms_agree_with_the_plain_ones(size: int) -> None:
    data = bytes(range(256)) * (size // 256)

    async def both() -> tuple[bytes, bytes]:
        packed = await compress_async(data, "gzip")
        return packed, await inflate_async(packed, "gzip", len(data))

    packed, unpacked = asyncio.run(both())
    assert gzip.decompress(packed) == data == unpacked
    with pytest.raises(TooLarge):
        asyncio.run(inflate_async(gzip_bomb(8), "gzip", 1 << 20))  # > INLINE_INFLATE: in a thread
    assert len(gzip_bomb(8)) > INLINE_INFLATE


def test_a_bomb_stops_at_the_limit_without_inflating_it() -> None:
    bomb = gzip_bomb(256)  # ~260 KB; inflating it whole would take 256 MiB
    limit = 4 << 20
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge) as caught:
            inflate(bomb, "gzip", limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.limit == limit
    assert peak < limit + 4 * CHUNK + len(bomb), f"held {peak} bytes for a {limit}-byte limit"


def test_exactly_the_limit_is_allowed() -> None:
    data = b"x" * 10_000
    assert inflate(gzip.compress(data), "gzip", 10_000) == data
    with pytest.raises(TooLarge):
        inflate(gzip.compress(data), "gzip", 9_999)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (gzip.compress(b"hello world" * 100)[:-12], "ends early"),  # truncated
        (b"this is not gzip at all", "not valid"),
        (b"", "ends early"),
        (gzip.compress(b"one") + b"trailing", "after the end"),
    ],
)
def test_broken_streams_are_corrupt(body: bytes, why: str) -> None:
    with pytest.raises(Corrupt, match=why):
        inflate(body, "gzip", 1 << 20)


@pytest.mark.parametrize(
    ("header", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("identity", None),
        ("br", None),
        ("gzip;q=0.5, deflate", "deflate"),
        ("deflate;q=0.4, gzip;q=0.9", "gzip"),
        ("gzip, deflate", "gzip"),  # a tie: the first listed
        ("gzip;q=0", None),
        ("identity;q=1, gzip;q=0.5", None),
        ("*", "gzip"),
        ("gzip;q=0, *", "deflate"),  # * stands for those not named
        ("GZIP ; Q=0.8", "gzip"),
        ("gzip;q=2", None),  # malformed weights are ignored
        ("gzip;q=abc, deflate;q=0.1", "deflate"),
        ("", None),
    ],
)
def test_response_coding_follows_q_values(header: str, coding: str | None) -> None:
    assert response_coding(header) == coding


def _served(headers: dict[str, str], body: bytes, path: str = "/v2/models/m/infer") -> tuple[HttpResponse, bytes]:
    seen: list[bytes] = []

    async def echo(request: HttpRequest) -> HttpResponse:
        seen.append(request.body)
        return HttpResponse(200, b'{"echo":"' + b"y" * 1000 + b'"}', "application/json")

    codings = ContentCodings(echo, max_body_bytes=1 << 16, compresses=frozenset({"/infer"}))

    async def served() -> HttpResponse:
        answer: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
        codings.respond(HttpRequest("POST", path, headers, body), answer.set_result)
        return await answer

    return asyncio.run(served()), (seen[0] if seen else b"")


def test_the_handler_sees_the_inflated_body_and_the_answer_is_compressed() -> None:
    response, seen = _served({"content-encoding": "gzip", "accept-encoding": "deflate"}, gzip.compress(b"{}"))
    assert seen == b"{}"
    assert ("Content-Encoding", "deflate") in response.headers
    assert json.loads(zlib.decompress(response.body))["echo"].startswith("yyy")


def test_answers_off_the_compressed_routes_stay_identity() -> None:
    response, _ = _served({"accept-encoding": "gzip"}, b"", path="/v2/models/m/config")
    assert not any(name == "Content-Encoding" for name, _ in response.headers)


def test_refusals_name_the_cause_in_tritons_wording() -> None:
    bomb = gzip.compress(bytes(1 << 20))
    response, seen = _served({"content-encoding": "gzip"}, bomb)
    assert response.status == 413 and seen == b""
    assert json.loads(response.body)["error"].startswith("Decompressed data size exceeds the maximum allowed value")
    response, _ = _served({"content-encoding": "gzip"}, b"garbage")
    assert response.status == 400 and "Content-Encoding: gzip" in json.loads(response.body)["error"]
    response, _ = _served({"content-encoding": "br"}, b"xx")
    assert response.status == 415
    assert ("Accept-Encoding", "gzip, deflate") in response.headers
    assert json.loads(response.body)["error"].startswith("Unsupported compression type")


class _CallbackApi:
    """A handler that answers from its own call, as RestApi answers an inference from the scheduler's callback."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.seen: list[bytes] = []

    def respond(self, request: HttpRequest, reply: Callable[[HttpResponse], None]) -> None:
        self.seen.append(request.body)
        reply(HttpResponse(200, b"z" * self.size, "application/json"))


def test_a_callback_handler_without_coding_headers_is_answered_in_the_same_call() -> None:
    api = _CallbackApi(1000)
    codings = ContentCodings(api, max_body_bytes=1 << 16, compresses=frozenset({"/infer"}))
    answers: list[HttpResponse] = []
    codings.respond(HttpRequest("POST", "/v2/models/m/infer", {}, b"{}"), answers.append)  # no loop running
    assert api.seen == [b"{}"] and answers[0].body == b"z" * 1000
    # A small answer is compressed inline, still within the call.
    answers.clear()
    codings.respond(HttpRequest("POST", "/v2/models/m/infer", {"accept-encoding": "gzip"}, b"{}"), answers.append)
    assert ("Content-Encoding", "gzip") in answers[0].headers and gzip.decompress(answers[0].body) == b"z" * 1000


@pytest.mark.parametrize("size", [1000, INLINE_COMPRESS + 1])
def test_a_callback_handler_gets_the_inflated_body_and_its_answer_compressed(size: int) -> None:
    api = _CallbackApi(size)
    codings = ContentCodings(api, max_body_bytes=1 << 16, compresses=frozenset({"/infer"}))
    headers = {"content-encoding": "deflate", "accept-encoding": "gzip"}

    async def served() -> HttpResponse:
        answer: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
        codings.respond(
            HttpRequest("POST", "/v2/models/m/infer", headers, zlib.compress(b'{"a":1}')), answer.set_result
        )
        return await answer

    response = asyncio.run(served())
    assert api.seen == [b'{"a":1}']
    assert ("Content-Encoding", "gzip") in response.headers and gzip.decompress(response.body) == b"z" * size
