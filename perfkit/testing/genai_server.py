"""A scripted generative server for tests and bench: OpenAI-compatible and Triton generate on
aiohttp.web, loopback only, with fixed token timing and the hostile behaviours the generative
client must count, chosen by model name:

- `ok`: each output token is one byte ("t"), the first after `FIRST_S`, the next ones `GAP_S`
  apart; usage figures in the last event where `stream_options.include_usage` asks; `[DONE]`;
- `short`: ignores max_tokens, answering two tokens fewer (at least one);
- `nodone`: a stream that ends cleanly without `[DONE]`;
- `malformed`: the second event's data is not JSON;
- `cut`: the connection closes inside the third event;
- `nousage`: no usage figures;
- `hang`: never ends the stream after its tokens;
- `words`: each output token is a word ("t "), and its usage counts words, not bytes: a server
  whose tokenizer is not perfkit's.

`make_app(models=(...))` is a non-Triton OpenAI-compatible server instead (vLLM's manners): no
`/v2` routes at all, `GET /v1/models` lists exactly `models`, and a request for any other model
answers 404 with OpenAI's error object (`not_found="detail"`: FastAPI's plain `{"detail": ...}`).

`python -m perfkit.testing.genai_server [--first-ms 40 --gap-ms 10]` serves it on a free port,
printed on the first line, until it is killed (bench/genai_client.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web

FIRST_S = 0.040
GAP_S = 0.010
DEFAULT_TOKENS = 4


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


#: OpenAI's envelope of a chunk or an answer (clients such as AIPerf read `object`).
_OBJECTS = {"chat": "chat.completion.chunk", "completions": "text_completion"}


def _envelope(kind: str, **fields: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": _OBJECTS[kind], "created": 0, "model": "m", **fields}


def _chunk(kind: str, token: str) -> dict[str, Any]:
    if kind == "chat":
        return _envelope(kind, choices=[{"index": 0, "delta": {"content": token}, "finish_reason": None}])
    if kind == "completions":
        return _envelope(kind, choices=[{"index": 0, "text": token, "finish_reason": None}])
    return {"text_output": token, "model_name": "m"}


async def _answer(
    request: web.Request, kind: str, body: dict[str, Any], behaviour: str, stream: bool, timing: tuple[float, float]
) -> web.StreamResponse:
    first_s, gap_s = timing
    prompt = body.get("prompt") or body.get("text_input") or (body.get("messages") or [{}])[0].get("content", "")
    tokens = int(body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_TOKENS)))
    if behaviour == "short":
        tokens = max(1, tokens - 2)
    token = "t " if behaviour == "words" else "t"
    prompt_tokens = len(prompt.split()) if behaviour == "words" else len(prompt.encode())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
    if not stream:
        await asyncio.sleep(first_s + gap_s * (tokens - 1))
        text = token * tokens
        answer: dict[str, Any]
        if kind == "chat":
            message = {"role": "assistant", "content": text}
            answer = {**_envelope(kind, choices=[{"index": 0, "message": message}]), "object": "chat.completion"}
        elif kind == "completions":
            answer = _envelope(kind, choices=[{"index": 0, "text": text}])
        else:
            answer = {"text_output": text}
        if behaviour != "nousage" and kind != "kserve-generate":
            answer["usage"] = usage
        return web.json_response(answer)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if kind == "chat":  # OpenAI's opening event: a role, no text
        await response.write(_event(_envelope(kind, choices=[{"index": 0, "delta": {"role": "assistant"}}])))
    await asyncio.sleep(first_s)
    for i in range(tokens):
        if i:
            await asyncio.sleep(gap_s)
        if behaviour == "malformed" and i == 1:
            await response.write(b"data: {not json\n\n")
        elif behaviour == "cut" and i == 2:
            await response.write(b'data: {"choices": [{"te')
            assert request.transport is not None
            request.transport.close()
            return response
        else:
            await response.write(_event(_chunk(kind, token)))
    if kind != "kserve-generate":
        if behaviour != "nousage" and (body.get("stream_options") or {}).get("include_usage"):  # as vLLM
            await response.write(_event(_envelope(kind, choices=[], usage=usage)))
        if behaviour == "hang":
            await asyncio.sleep(3600)
        if behaviour != "nodone":
            await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _not_found(model: str, style: str) -> web.StreamResponse:
    """An OpenAI-compatible server's answer for a model it does not serve (vLLM's words)."""
    message = f"The model `{model}` does not exist."
    if style == "detail":
        return web.json_response({"detail": message}, status=404)
    error = {"message": message, "type": "NotFoundError", "param": None, "code": 404}
    return web.json_response({"object": "error", "error": error}, status=404)


def make_app(
    first_s: float = FIRST_S, gap_s: float = GAP_S, *, models: tuple[str, ...] = (), not_found: str = "openai"
) -> web.Application:
    """The scripted server; with `models`, a non-Triton one serving only those (module docstring)."""
    timing = (first_s, gap_s)

    async def openai(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if models and body.get("model") not in models:
            return _not_found(str(body.get("model")), not_found)
        kind = "chat" if request.path.endswith("chat/completions") else "completions"
        return await _answer(request, kind, body, body["model"], bool(body.get("stream")), timing)

    async def embeddings(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if models and body.get("model") not in models:
            return _not_found(str(body.get("model")), not_found)
        usage = {"prompt_tokens": len(body["input"].encode()), "total_tokens": len(body["input"].encode())}
        return web.json_response({"data": [{"index": 0, "embedding": [0.1, 0.2]}], "usage": usage})

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stream = request.path.endswith("generate_stream")
        return await _answer(request, "kserve-generate", body, request.match_info["model"], stream, timing)

    async def listing(request: web.Request) -> web.StreamResponse:
        listed = models or ("ok",)
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in listed]})

    served = [0]  # answers begun, for GET /stats (bench: client CPU per request)

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            served[0] += 1
        return await handler(request)  # type: ignore[no-any-return]

    async def stats(request: web.Request) -> web.StreamResponse:
        return web.json_response({"requests": served[0]})

    app = web.Application(middlewares=[count])
    app.router.add_get("/stats", stats)
    app.router.add_post("/v1/chat/completions", openai)
    app.router.add_post("/v1/completions", openai)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", listing)
    if not models:  # a non-Triton server has no /v2 routes at all
        app.router.add_post("/v2/models/{model}/generate", generate)
        app.router.add_post("/v2/models/{model}/generate_stream", generate)
    return app


@contextlib.asynccontextmanager
async def serving(**app: Any) -> AsyncIterator[str]:
    """The fake server (`make_app(**app)`) on this loop; yields its HOST:PORT."""
    runner = web.AppRunner(make_app(**app), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def serving_in_thread(**app: Any) -> Iterator[str]:
    """The fake server (`make_app(**app)`) on a loop of its own thread, for a command that runs its
    own loop."""
    loop = asyncio.new_event_loop()
    started: asyncio.Future[str] = loop.create_future()
    stop = asyncio.Event()

    async def main() -> None:
        async with serving(**app) as url:
            started.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    url = asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(started), 10), loop).result(10)
    try:
        yield url
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="a scripted generative server on a free loopback port")
    parser.add_argument("--first-ms", type=float, default=FIRST_S * 1e3)
    parser.add_argument("--gap-ms", type=float, default=GAP_S * 1e3)
    args = parser.parse_args()

    async def serve() -> None:
        runner = web.AppRunner(make_app(args.first_ms / 1e3, args.gap_ms / 1e3))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
