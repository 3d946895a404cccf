"""Triton's generate extension (docs/protocol/extension_generate.md): `POST .../generate` and
`.../generate_stream`, a flat JSON schema over the data plane's streaming inference.

*Request.* A JSON object. Each key that names a model input is that input: a scalar or a flat
array, shaped as Triton shapes it from the model's metadata (each fixed dimension takes its
share of the elements, the innermost variable one the rest, the others 1). `id` is the request
id; `parameters` is an object whose keys are mapped the same way; any other key is a request
parameter (a string, number or boolean).

*Response.* One JSON object per model response, its keys sorted as Triton's are: each output
(one element as a scalar, more as a flat array), the response's parameters, `id` when the
request had one, `model_name` and `model_version`. An error is `{"error": message}`.

- `/generate` wants exactly one response: any other count is Triton's error, in the body (sent
  once the model's final flag is in, in one chunk).
- `/generate_stream` sends each response as it comes, as a server-sent event (`data: {json}\n\n`,
  `text/event-stream`), and ends when the model's final flag arrives.

In both, the status is the first response's (200, or its error's status), as Triton's is: a later
error comes in the body with the 200 already sent. A request refused before it runs (unknown
model, bad input) is answered with the usual JSON error and its status. The request holds one of
the data plane's in-flight slots until its last response is out, and a client that goes away
closes the stream, which cancels the request.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from reference_server.core.dataplane import StreamResponse
from reference_server.errors import InvalidArgument, ServerError, server_error
from reference_server.frontends.http.messages import HttpRequest, HttpResponse
from reference_server.frontends.plane import Plane
from v2kit import codec as v2
from v2kit.tensors import tensor_from_json, tensor_to_json

__all__ = ["ONE_RESPONSE", "generate", "generate_event", "generate_request"]

log = logging.getLogger(__name__)

_JSON = "application/json"
_SSE = "text/event-stream; charset=utf-8"
#: Triton's answer on /generate to a model that did not answer exactly once.
ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


async def generate(plane: Plane, request: HttpRequest, model: str, version: str, *, stream: bool) -> HttpResponse:
    """The answer to a generate (`stream` False) or generate_stream request."""
    inputs = {t["name"]: t for t in plane.model_metadata(model, version)["inputs"]}
    infer_request = generate_request(request.body, model, version, inputs)
    tracing = plane.tracing
    if not tracing.active:
        responses = plane.infer_stream(infer_request)  # checks the request; runs nothing yet
    else:  # its read's times go with it to the data plane, for its trace
        tracing.received = getattr(request, "received", None)
        try:
            responses = plane.infer_stream(infer_request)
        finally:
            tracing.received = None
    # Streamed either way, as Triton's are: the head waits for the first response (whose status
    # it carries), and a client that goes away meanwhile cancels the request.
    response = HttpResponse(200, content_type=_SSE if stream else _JSON)
    events = _events(plane, responses)
    response.stream = _sse(response, events) if stream else _single(response, events)
    return response


async def _events(
    plane: Plane, responses: AsyncGenerator[tuple[StreamResponse, bool], None]
) -> AsyncGenerator[tuple[dict[str, Any], int], None]:
    """Each response as its JSON object and the status it gives when it comes first. The request
    holds an in-flight slot from its first step to the end of its stream: a stream never started
    (its client gone before) takes none and runs nothing."""
    try:
        plane.acquire()
    except ServerError as exc:
        await responses.aclose()
        yield {"error": exc.message}, exc.http_status
        return
    try:
        async with contextlib.aclosing(responses):
            try:
                async for response, _final in responses:
                    if isinstance(response, ServerError):
                        yield {"error": response.message}, response.http_status
                    elif response is not None:
                        yield generate_event(response), 200
            except Exception as exc:  # the execution failed: Triton's last, failed response
                error = server_error(exc)
                if error is None:
                    log.exception("internal error serving a generate request")
                    yield {"error": f"internal error: {type(exc).__name__}: {exc}"}, 500
                else:
                    yield {"error": error.message}, error.http_status
    finally:
        plane.release()


async def _sse(
    response: HttpResponse, events: AsyncGenerator[tuple[dict[str, Any], int], None]
) -> AsyncGenerator[bytes, None]:
    """Each response as a server-sent event; the first sets the answer's status."""
    first = True
    async with contextlib.aclosing(events):
        async for event, status in events:
            if first:
                response.status, first = status, False
            yield b"data: " + _dumps(event) + b"\n\n"


async def _single(
    response: HttpResponse, events: AsyncGenerator[tuple[dict[str, Any], int], None]
) -> AsyncGenerator[bytes, None]:
    """The one response as the body, or Triton's error when there are more or none."""
    async with contextlib.aclosing(events):
        answers = [item async for item in events]
    response.status = answers[0][1] if answers else 200
    yield _dumps(answers[0][0] if len(answers) == 1 else {"error": ONE_RESPONSE})


def _dumps(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def generate_event(response: v2.InferResponse) -> dict[str, Any]:
    """A response as the generate extension's flat JSON object, keys in Triton's order."""
    fields: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        fields["id"] = response.id
    fields.update(response.parameters)
    for tensor in response.outputs:
        values = tensor_to_json(tensor.data, tensor.datatype, name=tensor.name)
        fields[tensor.name] = values[0] if len(values) == 1 else values
    # Triton gathers them in a std::map: byte order, upper case before lower.
    return dict(sorted(fields.items()))


def generate_request(body: bytes, model: str, version: str, inputs: Mapping[str, Mapping[str, Any]]) -> v2.InferRequest:
    """The inference request of a generate body, given the model's inputs as its metadata lists them."""
    try:
        document = json.loads(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"generate request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("generate request body must be a JSON object")
    request = v2.InferRequest(model_name=model, model_version=version)
    request_id = document.pop("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id': the request id must be a JSON string")
    request.id = request_id
    nested = document.get("parameters")
    if "parameters" in inputs and "parameters" in document:
        raise InvalidArgument("Keyword 'parameters' for nested schema also given as input tensor name")
    for key, value in document.items():
        if key == "parameters":
            if not isinstance(nested, dict):
                raise InvalidArgument("Expected JSON object for keyword: 'parameters'")
            for inner, inner_value in nested.items():
                try:
                    _map_key(request, inner, inner_value, inputs)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"Converting keyword: 'parameters': {exc.message}") from None
        else:
            _map_key(request, key, value, inputs)
    return request


def _map_key(request: v2.InferRequest, key: str, value: Any, inputs: Mapping[str, Mapping[str, Any]]) -> None:
    spec = inputs.get(key)
    if spec is None:
        # Triton's SetTritonParameterFromJsonParameter: strings, integers, booleans and numbers.
        if not isinstance(value, (str, int, float, bool)):
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
        request.parameters[key] = value
        return
    if any(t.name == key for t in request.inputs):
        raise InvalidArgument(f"input '{key}' already exists in request")
    values = value if isinstance(value, list) else [value]
    shape = _shape(key, len(values), spec["shape"])
    datatype = spec["datatype"]
    try:
        data = tensor_from_json(values, datatype, shape, key)
    except v2.CodecError as exc:
        raise InvalidArgument(f"Unable to parse 'data': {exc}") from None
    request.inputs.append(v2.InferTensor(key, datatype, shape, data))


def _shape(name: str, count: int, dims: list[int]) -> list[int]:
    """Triton's two passes: fixed dimensions take their share of `count` (innermost first), then
    the innermost variable one takes the rest and the other variable ones 1."""
    shape = list(dims)
    for d in reversed(shape):
        if d != -1:
            if d == 0 or count % d:
                raise InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")
            count //= d
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], count = count, 1
    if count != 1:
        raise InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape
