"""`/v1/completions` and `/v1/chat/completions` for text-generation models, as Triton's OpenAI
front end (server/python/openai) serves them.

*Request mapping.* A model is driven through its inputs, as Triton maps them for its two LLM
backends. With a `sampling_parameters` input (the vLLM backend's; our demo models'): `text_input`
(the prompt), `stream`, `sampling_parameters` (JSON: `max_tokens` and every other field of the
request that is not the front end's own, e.g. `temperature`, `min_tokens`, `ignore_eos`),
`exclude_input_in_output` (not `echo`), and `return_num_input_tokens` / `return_num_output_tokens`
where the model has them. With a `max_tokens` input instead (TensorRT-LLM's): `text_input`,
`stream`, `max_tokens`, and `temperature`, `top_p`, `seed`, `presence_penalty`,
`frequency_penalty` where the model has those inputs. Each input gets the model's datatype and
its one-element shape. `max_tokens` defaults to 16 (Triton's `--default-max-tokens`); for chat,
`max_completion_tokens` comes first. A chat's messages become one prompt, "role: content" lines
and "assistant: " after them (there is no tokenizer's chat template here).

*Answer.* Non-streamed: one JSON object, the text of every response joined. Streamed: server-sent
events (`data: {json}\\n\\n`), a chunk per model response (for chat, a first chunk with the
role), `finish_reason` on the last, a last chunk with `usage` and no choices when
`stream_options.include_usage` asks (then every chunk has `"usage": null`, as OpenAI's do), and
`data: [DONE]`. `usage` comes from the model's `num_input_tokens` and `num_output_tokens` outputs
(summed over a stream's responses), and is null when the model has none. `finish_reason` is
"length" when the completion used all of `max_tokens`, else "stop". Text is decoded from the
model's bytes incrementally, so a character split across responses is whole in one chunk.

*Errors* (`errors.py`) use Triton's words where it has them. An error once a stream has begun is a
last `data: {"error": ...}` event before `[DONE]`; one in the model's first response still gets
its status. A request holds one of the data plane's in-flight slots until its answer is out, and
a client that goes away cancels it (both answers are streamed for that reason).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reference_server.core.dataplane import StreamResponse
from reference_server.errors import ServerError, server_error
from reference_server.frontends.http.messages import HttpResponse
from reference_server.frontends.http.openai.errors import JSON, OpenAiError, dumps, from_server, require_model, typed
from reference_server.frontends.plane import Plane
from v2kit import codec as v2
from v2kit.tensors import datatype_to_numpy

__all__ = ["DEFAULT_MAX_TOKENS", "Completion", "answer", "chat_prompt", "model_request", "read_completion"]

_SSE = "text/event-stream; charset=utf-8"
#: max_tokens when a request does not say (Triton's OpenAI front end's --default-max-tokens).
DEFAULT_MAX_TOKENS = 16
#: Request fields that are the front end's, not sampling parameters (Triton's exclusion list).
_NOT_SAMPLING = frozenset(
    {
        "model", "stream", "messages", "prompt", "echo", "store", "metadata", "response_format",
        "service_tier", "stream_options", "tools", "tool_choice", "parallel_tool_calls", "user",
        "function_call", "functions", "suffix", "max_completion_tokens", "max_tokens", "logprobs",
        "top_logprobs", "best_of", "n", "logit_bias",
    }
)  # fmt: skip
#: Sampling fields a model with TensorRT-LLM's inputs takes as tensors of the same name.
_TRTLLM_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


@dataclass(slots=True)
class Completion:
    """One /v1/completions or /v1/chat/completions request, read and checked."""

    chat: bool
    model: str
    prompt: str
    stream: bool
    include_usage: bool
    max_tokens: int
    echo: bool
    sampling: dict[str, Any] = field(default_factory=dict)


async def answer(plane: Plane, document: dict[str, Any], *, chat: bool) -> HttpResponse:
    """The answer to a completion (`chat` False) or chat completion request's body."""
    completion = read_completion(document, chat=chat)
    require_model(plane, completion.model)
    inputs = {spec["name"]: spec for spec in plane.model_metadata(completion.model)["inputs"]}
    responses = plane.infer_stream(model_request(completion, inputs))  # checks; runs nothing yet
    response = HttpResponse(200, content_type=_SSE if completion.stream else JSON)
    events = _events(plane, responses)
    write = _stream if completion.stream else _single
    response.stream = write(response, completion, events)
    return response


# -- the request ----------------------------------------------------------------------------


def read_completion(document: dict[str, Any], *, chat: bool) -> Completion:
    """A request body, checked as Triton's front end checks it (its words where it has them)."""
    model = typed(document, "model", str, "a string")
    if not model:
        raise OpenAiError("'model' is required", param="model")
    stream = bool(typed(document, "stream", bool, "a boolean"))
    options = typed(document, "stream_options", dict, "an object")
    if options is not None and not stream:
        raise OpenAiError("`stream_options` can only be used when `stream` is True", param="stream_options")
    include_usage = bool(typed(options or {}, "include_usage", bool, "a boolean"))
    n = typed(document, "n", int, "an integer")
    if n is not None and n > 1:
        raise OpenAiError(f"Received n={n}, but only single choice (n=1) is currently supported", param="n")
    if document.get("logit_bias") is not None:
        raise OpenAiError("logit bias is not supported", param="logit_bias")
    limit = typed(document, "max_tokens", int, "an integer")
    if chat:
        limit = typed(document, "max_completion_tokens", int, "an integer") or limit
        prompt = chat_prompt(document.get("messages"))
        echo = False
    else:
        raw = document.get("prompt")
        if isinstance(raw, list):
            raise OpenAiError("only single string input is supported", param="prompt")
        if not isinstance(raw, str) or not raw:
            raise OpenAiError("prompt must be non-empty", param="prompt")
        prompt = raw
        if document.get("suffix") is not None:
            raise OpenAiError("suffix is not currently supported", param="suffix")
        echo = bool(typed(document, "echo", bool, "a boolean"))
    max_tokens = DEFAULT_MAX_TOKENS if limit is None else limit
    if max_tokens < 1:
        raise OpenAiError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    for key in ("min_tokens",):
        count = typed(document, key, int, "an integer")
        if count is not None and not 0 <= count <= max_tokens:
            raise OpenAiError(f"{key} must be between 0 and max_tokens ({max_tokens}), got {count}", param=key)
    typed(document, "ignore_eos", bool, "a boolean")
    sampling = {k: v for k, v in document.items() if k not in _NOT_SAMPLING and v is not None}
    return Completion(chat, model, prompt, stream, include_usage, max_tokens, echo, sampling)


def chat_prompt(messages: Any) -> str:
    """A chat's messages as one prompt: a "role: content" line each, then "assistant: "."""
    if not isinstance(messages, list) or not messages:
        raise OpenAiError("'messages' must be a non-empty array", param="messages")
    lines = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAiError(f"messages[{index}] must be an object with a string 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise OpenAiError(f"messages[{index}].content must be a string or an array of parts", param="messages")
        lines.append(f"{message['role']}: {content}\n")
    return "".join(lines) + "assistant: "


def model_request(completion: Completion, inputs: dict[str, dict[str, Any]]) -> v2.InferRequest:
    """The inference request for `completion`, shaped by the model's inputs (its metadata's)."""
    if inputs.get("text_input", {}).get("datatype") != "BYTES":
        raise OpenAiError(
            f"model '{completion.model}' has no BYTES input 'text_input': the OpenAI routes serve models "
            "with the vLLM or TensorRT-LLM backend's inputs",
            param="model",
        )
    values: dict[str, Any] = {"text_input": completion.prompt.encode(), "stream": completion.stream}
    if "sampling_parameters" in inputs:
        sampling = {**completion.sampling, "max_tokens": completion.max_tokens}
        values["sampling_parameters"] = json.dumps(sampling).encode()
        values["return_num_input_tokens"] = True
        values["return_num_output_tokens"] = True
    elif "max_tokens" in inputs:
        values["max_tokens"] = completion.max_tokens
        values.update({k: completion.sampling[k] for k in _TRTLLM_SAMPLING if k in completion.sampling})
    else:
        raise OpenAiError(
            f"model '{completion.model}' has neither a 'sampling_parameters' (vLLM) nor a 'max_tokens' "
            "(TensorRT-LLM) input",
            param="model",
        )
    values["exclude_input_in_output"] = not completion.echo
    request = v2.InferRequest(model_name=completion.model)
    for name, value in values.items():
        spec = inputs.get(name)
        if spec is None:
            continue
        datatype = spec["datatype"]
        shape = [1 if d == -1 else d for d in spec["shape"]]
        if int(np.prod(shape)) != 1:
            raise OpenAiError(f"model '{completion.model}': input '{name}' must take one element, its shape is {shape}")
        if datatype == "BYTES":
            data = np.array([value], dtype=np.object_).reshape(shape)
        else:
            try:
                data = np.array([value], dtype=datatype_to_numpy(datatype)).reshape(shape)
            except (TypeError, ValueError, OverflowError) as exc:
                raise OpenAiError(f"'{name}' does not fit the model's {datatype} input: {exc}", param=name) from None
        request.inputs.append(v2.InferTensor(name, datatype, shape, data))
    return request


# -- the answer -----------------------------------------------------------------------------


@dataclass(slots=True)
class Delta:
    """One model response: its text bytes, token counts (None where the model sent none), and
    whether it is the last; or the final flag alone (`text` b"")."""

    text: bytes
    input_tokens: int | None
    output_tokens: int | None
    final: bool


async def _events(
    plane: Plane, responses: AsyncGenerator[tuple[StreamResponse, bool], None]
) -> AsyncGenerator[Delta | OpenAiError, None]:
    """Each model response as a Delta, or the error that ends the answer. Holds an in-flight slot
    from the first step to the end."""
    try:
        plane.acquire()
    except ServerError as exc:
        await responses.aclose()
        yield from_server(exc)
        return
    try:
        async with contextlib.aclosing(responses):
            try:
                async for response, final in responses:
                    if isinstance(response, ServerError):
                        yield from_server(response)
                        return
                    yield Delta(b"", None, None, final) if response is None else _delta(response, final)
            except Exception as exc:  # the execution failed
                error = server_error(exc)
                yield from_server(error) if error is not None else OpenAiError(f"internal error: {exc}", 500)
    finally:
        plane.release()


def _delta(response: v2.InferResponse, final: bool) -> Delta:
    outputs = {tensor.name: tensor.data.reshape(-1) for tensor in response.outputs}
    text = b"".join(bytes(item) for item in outputs.get("text_output", ()))
    counts = [int(outputs[name][0]) if outputs.get(name) is not None and outputs[name].size else None
              for name in ("num_input_tokens", "num_output_tokens")]  # fmt: skip
    return Delta(text, counts[0], counts[1], final)


class _Tally:
    """What an answer has added up: text decoded so far, and the usage."""

    def __init__(self, completion: Completion) -> None:
        self.completion = completion
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.id = f"{'chatcmpl' if completion.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def add(self, delta: Delta) -> str:
        if self.input_tokens is None:
            self.input_tokens = delta.input_tokens
        if delta.output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + delta.output_tokens
        return self.decoder.decode(delta.text, delta.final)

    def finish_reason(self) -> str:
        return (
            "length" if self.output_tokens is not None and self.output_tokens >= self.completion.max_tokens else "stop"
        )

    def usage(self) -> dict[str, int] | None:
        if self.input_tokens is None or self.output_tokens is None:
            return None
        total = self.input_tokens + self.output_tokens
        return {"prompt_tokens": self.input_tokens, "completion_tokens": self.output_tokens, "total_tokens": total}

    def envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.completion.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.completion.model,
                "system_fingerprint": None, "choices": choices}  # fmt: skip

    def choice(self, text: str, finish_reason: str | None, *, chunk: bool, role: bool = False) -> dict[str, Any]:
        if not self.completion.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        content: dict[str, Any] = {"role": "assistant", "content": text} if role or not chunk else {"content": text}
        return {"index": 0, "delta" if chunk else "message": content, "logprobs": None, "finish_reason": finish_reason}


async def _single(
    response: HttpResponse, completion: Completion, events: AsyncGenerator[Delta | OpenAiError, None]
) -> AsyncGenerator[bytes, None]:
    """The whole answer as one JSON object (or the error, with its status)."""
    tally = _Tally(completion)
    parts: list[str] = []
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, OpenAiError):
                response.status = event.status
                yield dumps(event.body())
                return
            parts.append(tally.add(event))
    parts.append(tally.add(Delta(b"", None, None, True)))
    answer = tally.envelope([tally.choice("".join(parts), tally.finish_reason(), chunk=False)], chunk=False)
    answer["usage"] = tally.usage()
    yield dumps(answer)


async def _stream(
    response: HttpResponse, completion: Completion, events: AsyncGenerator[Delta | OpenAiError, None]
) -> AsyncGenerator[bytes, None]:
    """The answer as server-sent events; an error before the first response answers with its status."""
    tally = _Tally(completion)
    usage_field: Callable[[dict[str, Any]], dict[str, Any]] = (
        (lambda chunk: {**chunk, "usage": None}) if completion.include_usage else (lambda chunk: chunk)
    )
    first = True
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, OpenAiError):
                if first:
                    response.status, response.content_type = event.status, JSON
                    yield dumps(event.body())
                    return
                yield _event(event.body())
                break
            if first and completion.chat:
                yield _event(usage_field(tally.envelope([tally.choice("", None, chunk=True, role=True)], chunk=True)))
            first = False
            text = tally.add(event)
            reason = tally.finish_reason() if event.final else None
            if text or event.final:
                yield _event(usage_field(tally.envelope([tally.choice(text, reason, chunk=True)], chunk=True)))
    if completion.include_usage and tally.usage() is not None:
        yield _event({**tally.envelope([], chunk=True), "usage": tally.usage()})
    yield b"data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"
