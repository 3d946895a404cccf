"""The client of generative endpoints: OpenAI-compatible `/v1/chat/completions`, `/v1/completions`
and `/v1/embeddings`, and Triton's generate extension (`/v2/models/M/generate`, and
`generate_stream` with `--streaming`), over aiohttp.

`prepare()` encodes a prompt's JSON body once. `send()` posts it and times the answer on
`time.perf_counter_ns`: with `--streaming`, the body is read as it arrives through our own bounded
server-sent-events parser (`sse.py`), and the arrival of the first and second event that carries
output text give the time to first token and the gap to the second response (AIPerf's TTFT and
TTST; a chat stream's opening event with only a role carries no text and is not a token). The
output is counted once the answer is complete, with the counting tokenizer or the server's
`usage`; `UsageTally` keeps what the server's usage said beside perfkit's own count of the same
text, and how many answers came without usage (counted by perfkit's tokenizer instead), for the
sweep to say and record (`records.usage_notes`).

`check_model()` asks, before the load, whether an OpenAI-compatible server serves `-m` at all: its
404 for an unknown model is a usage error, not a run of failed requests.

Like `perfkit.wire.client`, `send()` never raises (except `asyncio.CancelledError`): every
failure is a short kind, counted. A peer that breaks the protocol gets a kind of its own:

- `stream cut`: the connection ended inside an event (or inside a chunk of the body);
- `stream ended without [DONE]`: an OpenAI stream ended between events but never said `[DONE]`
  (Triton's generate_stream has no such marker: its end is the body's end);
- `malformed SSE`: an event whose data is not a JSON object, a line that is not UTF-8, or one
  longer than `sse.MAX_LINE_BYTES`;
- `error event`: the server sent `{"error": ...}` inside a stream that had begun with 200;
- `malformed reply`: a non-streamed answer without the field its endpoint defines;
- `timeout`: no complete answer within `--request-timeout`, which is also what a server that
  keeps a stream open and never ends it gets: no request waits longer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from perfkit.errors import PerfkitError, TargetError
from perfkit.genai.sessions import SESSION_HEADER, History, chat_messages, history_text
from perfkit.genai.sse import SseError, SseParser
from perfkit.genai.tokenizer import USAGE, Tokenizer
from perfkit.genai.workload import GenerativeSpec, Prompt
from perfkit.wire.limits import MAX_CONTROL_REPLY
from perfkit.wire.replies import MESSAGES_PER_KIND, Outcome
from perfkit.wire.sniff import sniff, wrong_port_hint

__all__ = ["CUT", "ERROR_EVENT", "MALFORMED", "NO_DONE", "BAD_REPLY", "GenerativeClient", "GenPrepared", "UsageTally"]

CUT = "stream cut"
NO_DONE = "stream ended without [DONE]"
MALFORMED = "malformed SSE"
ERROR_EVENT = "error event"
BAD_REPLY = "malformed reply"
TOO_LARGE = "reply too large"
#: Bound on one answer, streamed or not: an embeddings batch or a long generation is a few MiB.
MAX_ANSWER_BYTES = 64 << 20

_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
#: The OpenAI-compatible endpoint types: none of the KServe v2 extensions (statistics among them) behind them.
OPENAI_ENDPOINT_TYPES = tuple(_PATHS)
_now = time.perf_counter_ns


class _Failed(Exception):
    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(message or kind)
        self.kind = kind


@dataclass(slots=True)
class UsageTally:
    """The answers of a stretch of the run, by whether they carried `usage`: the server's token
    counts summed beside perfkit's own count of the same text (prompt for the input, answer for
    the output), and the answers without usage, whose tokens perfkit's tokenizer counted."""

    with_usage: int = 0
    server_in: int = 0
    own_in: int = 0
    server_out: int = 0
    own_out: int = 0
    without_usage: int = 0


@dataclass(frozen=True, slots=True)
class GenPrepared:
    """A prompt's request, encoded once."""

    url: yarl.URL
    payload: bytes
    bytes_out: int
    tokens_in: int  # as the counting tokenizer counts the prompt
    tokens_asked: int  # max_tokens sent; 0 when none
    headers: Mapping[str, str] | None = None  # a session's turn: its correlation header


def _text_of(endpoint_type: str, body: Mapping[str, Any], streamed: bool) -> str:
    """The output text an answer (or a stream's event) carries; raises _Failed when the field is
    not where the endpoint defines it."""
    try:
        if endpoint_type == "kserve-generate":
            text = body.get("text_output", "")
            return text if isinstance(text, str) else " ".join(map(str, text))
        choices = body.get("choices")
        if streamed and not choices:  # OpenAI's usage-only last event
            return ""
        choice = choices[0]  # type: ignore[index]
        if endpoint_type == "chat":
            part = choice["delta" if streamed else "message"]
            return str(part.get("content") or "")
        return str(choice.get("text") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise _Failed(MALFORMED if streamed else BAD_REPLY, f"no output text in {str(body)[:200]}") from None


class GenerativeClient:
    protocol = "http"

    def __init__(
        self,
        url: str,
        spec: GenerativeSpec,
        tokenizer: Tokenizer,
        *,
        request_timeout_s: float = 30.0,
        headers: Mapping[str, str] = {},  # read only
        connections: int = 0,
    ) -> None:
        self.url = url
        self._base = yarl.URL(url if "://" in url else f"http://{url}")
        if self._base.scheme not in ("http", "https") or not self._base.host:
            raise PerfkitError(f"-u {url}: expected HOST:PORT or http(s)://HOST:PORT")
        self.spec = spec
        self.tokenizer = tokenizer
        self._openai = spec.endpoint_type in OPENAI_ENDPOINT_TYPES
        self._usage = spec.tokenizer == USAGE
        self._timeout_s = request_timeout_s
        self._headers = {"Content-Type": "application/json", **headers}
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._seen: dict[str, int] = {}
        self._tally = UsageTally()

    def take_tally(self) -> UsageTally:
        """The usage tally since the last call (a level's answers), and a fresh one begun."""
        tally, self._tally = self._tally, UsageTally()
        return tally

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, limit_per_host=0),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None),  # send() bounds each request itself
            )
        return self._session

    def endpoint_url(self, model: str) -> yarl.URL:
        if self.spec.endpoint:
            return self._base.with_path(self.spec.endpoint.replace("{model}", model))
        if self._openai:
            return self._base.with_path(_PATHS[self.spec.endpoint_type])
        return self._base / "v2" / "models" / model / ("generate_stream" if self.spec.streaming else "generate")

    def body(self, prompt: Prompt, model: str, history: History = ()) -> dict[str, Any]:
        """The JSON request of `prompt` for this endpoint type; with a session's `history`, its
        turns before (`perfkit.genai.sessions`)."""
        kind, w = self.spec.endpoint_type, self.spec.workload
        body: dict[str, Any]
        if kind == "embeddings":
            return {"model": model, "input": prompt.text}
        if kind == "chat":
            body = {"model": model, "messages": chat_messages(history, prompt.text)}
        elif kind == "completions":
            body = {"model": model, "prompt": history_text(history, prompt.text)}
        else:  # Triton's generate: inputs and parameters by name, flat
            # `stream` and `exclude_input_in_output` are the vLLM backend's inputs (a model without
            # them takes them as request parameters): a token per response, and no prompt counted
            # as output in an answer that is not streamed.
            text = history_text(history, prompt.text)
            body = {"text_input": text, "stream": self.spec.streaming, "exclude_input_in_output": True}
        if self._openai:
            body["stream"] = self.spec.streaming
            if self.spec.streaming:
                # as AIPerf asks on every stream: the server's usage, taken with --tokenizer usage and
                # otherwise compared with the tokenizer's counts (records.usage_notes)
                body["stream_options"] = {"include_usage": True}
        sampling: dict[str, Any] = {}
        if prompt.max_tokens:
            sampling["max_tokens"] = prompt.max_tokens
            if w.deterministic_output:
                sampling["min_tokens"] = prompt.max_tokens
            if w.ignore_eos:
                sampling["ignore_eos"] = True
        body.update(sampling)
        if sampling and not self._openai:  # the vLLM backend reads them from this input (TensorRT-LLM: flat)
            body["sampling_parameters"] = json.dumps(sampling)
        return body

    def prepare(self, prompt: Prompt, model: str) -> GenPrepared:
        payload = json.dumps(self.body(prompt, model), separators=(",", ":")).encode()
        return GenPrepared(self.endpoint_url(model), payload, len(payload), prompt.input_tokens, prompt.max_tokens)

    def prepare_turn(self, prompt: Prompt, model: str, history: History, correlation_id: str) -> GenPrepared:
        """A session's turn, encoded when it is sent: the history in the body, its input tokens
        counted over all of it (chat: each message's content), the session's correlation header."""
        body = self.body(prompt, model, history)
        if not history:
            tokens_in = prompt.input_tokens
        elif self.spec.endpoint_type == "chat":
            tokens_in = sum(self.tokenizer.count(m["content"]) for m in body["messages"])
        else:
            tokens_in = self.tokenizer.count(history_text(history, prompt.text))
        payload = json.dumps(body, separators=(",", ":")).encode()
        return GenPrepared(self.endpoint_url(model), payload, len(payload), tokens_in, prompt.max_tokens,
                           {SESSION_HEADER: correlation_id})  # fmt: skip

    async def send(self, prepared: GenPrepared) -> Outcome:
        start = _now()
        received = [0]
        try:
            return await asyncio.wait_for(self._exchange(prepared, start, received), self._timeout_s)
        except _Failed as exc:
            return self._failure(exc.kind, str(exc), received[0])
        except asyncio.TimeoutError:
            return self._failure("timeout", f"no complete answer in {self._timeout_s:g} s", received[0])
        except SseError as exc:
            return self._failure(MALFORMED, str(exc), received[0])
        except aiohttp.ClientPayloadError as exc:
            return self._failure(CUT, str(exc), received[0])
        except aiohttp.ServerDisconnectedError as exc:
            return self._failure("disconnected", str(exc), received[0])
        except (aiohttp.ClientConnectionError, OSError) as exc:
            return self._failure("connection", str(exc) or type(exc).__name__, received[0])
        except aiohttp.ClientError as exc:
            return self._failure(f"client {type(exc).__name__}", str(exc), received[0])

    def _failure(self, kind: str, message: str, received: int) -> Outcome:
        seen = self._seen.get(kind, 0)
        self._seen[kind] = seen + 1
        return Outcome(kind, received, 0, 0, message if seen < MESSAGES_PER_KIND else "")

    async def _exchange(self, prepared: GenPrepared, start: int, received: list[int]) -> Outcome:
        async with self._open().post(prepared.url, data=prepared.payload, headers=prepared.headers) as response:
            if response.status != 200:
                body = await response.content.read(4096)
                received[0] = len(body)
                raise _Failed(f"HTTP {response.status}", body.decode(errors="replace")[:300])
            if self.spec.streaming:
                return await self._stream(response, prepared, start, received)
            body_bytes = await _read_bounded(response, received)
        t = _now()
        answer = _answer_object(body_bytes, BAD_REPLY, "")
        if self.spec.endpoint_type == "embeddings":
            if not isinstance(answer.get("data"), list) or not answer["data"]:
                raise _Failed(BAD_REPLY, "an embeddings answer without data")
            text = ""
        else:
            text = _text_of(self.spec.endpoint_type, answer, False)
        tokens_in, tokens_out = self._counts(prepared, text, answer.get("usage"))
        return Outcome(
            "", received[0], 0, _now() - t, tokens=(-1, -1, tokens_in, tokens_out, prepared.tokens_asked), text=text
        )

    async def _stream(
        self, response: aiohttp.ClientResponse, prepared: GenPrepared, start: int, received: list[int]
    ) -> Outcome:
        parser = SseParser()
        kind, openai = self.spec.endpoint_type, self._openai
        first = second = -1
        pieces: list[str] = []
        usage: Any = None
        done = False
        parse_ns = 0
        async for chunk in response.content.iter_any():
            t = _now()
            received[0] += len(chunk)
            if received[0] > MAX_ANSWER_BYTES:
                raise _Failed(TOO_LARGE, f"a stream longer than {MAX_ANSWER_BYTES} bytes")
            for event in parser.feed(chunk):
                if done:
                    continue  # after [DONE] nothing counts
                if openai and event.data.strip() == "[DONE]":
                    done = True
                    continue
                data = _answer_object(event.data, MALFORMED, "event data is ")
                if data.get("usage"):
                    usage = data["usage"]
                text = _text_of(kind, data, True)
                if text:
                    pieces.append(text)
                    if first < 0:
                        first = t - start
                    elif second < 0:
                        second = t - start - first
            parse_ns += _now() - t
        if parser.pending:
            raise _Failed(CUT, "the stream ended inside an event")
        if openai and not done:
            raise _Failed(NO_DONE, "the stream ended without data: [DONE]")
        text = "".join(pieces)
        tokens_in, tokens_out = self._counts(prepared, text, usage)
        return Outcome(
            "",
            received[0],
            0,
            parse_ns,
            tokens=(first, second, tokens_in, tokens_out, prepared.tokens_asked),
            text=text,
        )

    def _counts(self, prepared: GenPrepared, text: str, usage: Any) -> tuple[int, int]:
        """The answer's (input, output) tokens: the server's usage with `--tokenizer usage`, the
        counting tokenizer's otherwise, and where the answer carries no usage (tallied)."""
        own = prepared.tokens_in, self.tokenizer.count(text)
        server = _usage_counts(usage, self.spec.endpoint_type)
        tally = self._tally
        if server is None:
            tally.without_usage += 1
            return own
        tally.with_usage += 1
        tally.server_in += server[0]
        tally.own_in += own[0]
        tally.server_out += server[1]
        tally.own_out += own[1]
        return server if self._usage else own

    async def check_model(self, model: str) -> None:
        """Before the load: a PerfkitError (exit 2) naming -m, the server's words and the models it
        lists when an OpenAI-compatible server has no model `model` (its 404 would otherwise fail
        every request). A listed model is taken as served; an unlisted one is asked once, with a
        one-token request, since a server may serve names it does not list."""
        if not self._openai:
            return
        try:
            listed: list[str] | None = await self.model_names()
        except (PerfkitError, aiohttp.ClientError, OSError, ValueError, AttributeError, TypeError):
            listed = None  # no listing: the one request is all there is to ask
        if listed is not None and model in listed:
            return
        try:
            status, words = await self._ask_once(model)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return  # the sweep's requests will say what is wrong, each counted
        if status != 404:
            return
        has = f"; GET /v1/models lists {', '.join(listed) or 'none'}" if listed is not None else ""
        if model in words:  # the server's words name the model: it is -m that is wrong
            raise PerfkitError(f"-m {model}: the server at {self.url} has no such model (HTTP 404: {words}){has}")
        # a bare 404 ("Not Found"): as likely a route the server does not serve
        path = self.endpoint_url(model).path
        raise PerfkitError(
            f"POST {path} for -m {model}: HTTP 404 ({words}) from {self.url}: it serves no such endpoint or no such "
            f"model; check --endpoint-type (or --endpoint) and -m{has}"
        )

    async def _ask_once(self, model: str) -> tuple[int, str]:
        """One minimal request for `model` (a one-token answer): its status and the server's words."""
        tiny = Prompt("hi", 1, 1)
        body = self.body(tiny, model)
        body["stream"] = False
        body.pop("stream_options", None)
        async with self._open().post(
            self.endpoint_url(model), json=body, timeout=aiohttp.ClientTimeout(total=self._timeout_s)
        ) as response:
            text = (await response.content.read(4096)).decode(errors="replace")
            return response.status, _error_words(text)

    # The few control-plane calls a sweep makes (health, model list, statistics).

    async def _get_json(self, path: str, method: str = "GET") -> Any:
        async with self._open().request(
            method, self._base.with_path(path), timeout=aiohttp.ClientTimeout(total=self._timeout_s)
        ) as r:
            body = await r.content.read(MAX_CONTROL_REPLY)
            if r.status != 200:
                raise PerfkitError(f"{method} {path}: HTTP {r.status} {body[:200].decode(errors='replace')}")
            return json.loads(body) if body else {}

    async def live(self) -> bool:
        """Whether the server answers on the endpoint type's side; a TargetError saying what did
        not answer when it does not."""
        path = "/v1/models" if self._openai else "/v2/health/live"
        try:
            await self._get_json(path)
        except (PerfkitError, aiohttp.ClientError, OSError, ValueError) as exc:
            if isinstance(exc, aiohttp.ClientError) and not isinstance(exc, aiohttp.ClientConnectorError):
                spoken = await sniff(self._base.raw_host or "", self._base.port or 0)  # (a TLS port says neither)
                hint = wrong_port_hint(spoken, "http")  # it answered, but in HTTP/2 (a gRPC port?)
                if hint:
                    raise TargetError(f"-u {self.url}: {hint}") from None
            raise TargetError(
                f"{self.url}: GET {path} failed ({exc}); is this the server's "
                f"{'OpenAI-compatible' if self._openai else 'KServe'} front end? check -u and --endpoint-type"
            ) from None
        return True

    async def server_metadata(self) -> dict[str, Any]:
        if self._openai:
            return {"name": "OpenAI-compatible", "endpoint_type": self.spec.endpoint_type}
        try:
            return dict(await self._get_json("/v2"))
        except PerfkitError:
            return {}

    async def model_names(self) -> list[str]:
        """The models an OpenAI-compatible server lists (GET /v1/models)."""
        listing = await self._get_json("/v1/models")
        return [str(m.get("id")) for m in listing.get("data", [])]

    async def repository_index(self) -> list[dict[str, Any]]:
        if self._openai:
            return [{"name": name, "state": "READY"} for name in await self.model_names()]
        return list(await self._get_json("/v2/repository/index", "POST"))

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        if self._openai:
            raise PerfkitError("OpenAI-compatible endpoints have no statistics extension")
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/stats"
        return dict(await self._get_json(path))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _answer_object(text: str | bytes, kind: str, what: str) -> dict[str, Any]:
    """A reply (or an event's data) as the JSON object it must be: `kind` when it is not one, the
    error kind when it is the server's error object."""
    try:
        answer = json.loads(text)
    except ValueError:
        raise _Failed(kind, f"{what}not JSON: {text[:200]!r}") from None
    if not isinstance(answer, dict):
        raise _Failed(kind, f"{what}not a JSON object: {text[:200]!r}")
    if "error" in answer:
        raise _Failed(ERROR_EVENT, str(answer["error"])[:300])
    return answer


def _usage_counts(usage: Any, endpoint_type: str) -> tuple[int, int] | None:
    """The (prompt, completion) tokens of an answer's `usage`; None when it has none (an
    embeddings answer has no completion tokens)."""
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    out = usage.get("completion_tokens", 0 if endpoint_type == "embeddings" else None)
    return (usage["prompt_tokens"], out) if isinstance(out, int) else None


def _error_words(text: str) -> str:
    """The server's own message in an error answer: OpenAI's `error.message`, FastAPI's `detail`,
    else the body's start."""
    try:
        answer = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        for key in ("detail", "message", "error"):
            if answer.get(key):
                return str(answer[key])[:300]
    return text.strip()[:300]


async def _read_bounded(response: aiohttp.ClientResponse, received: list[int]) -> bytes:
    parts: list[bytes] = []
    async for chunk in response.content.iter_any():
        received[0] += len(chunk)
        if received[0] > MAX_ANSWER_BYTES:
            raise _Failed(TOO_LARGE, f"an answer longer than {MAX_ANSWER_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)
