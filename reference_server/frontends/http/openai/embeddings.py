"""`/v1/embeddings`: OpenAI's create-embeddings API over a model that answers once with a vector.

*Request* (OpenAI's API reference): `model`; `input`, a string, an array of strings, an array of
token ids or an array of such arrays (at most 2048 items, none empty); `encoding_format`, "float"
(the default) or "base64"; `dimensions`, accepted only when it is the model's own (a model here
cannot shorten its vectors); `user`, accepted and ignored. Any other field is refused with
OpenAI's "Unrecognized request argument supplied", as Triton's front end refuses it too (its
request schema forbids extra fields).

*Model mapping.* The model must answer once (not decoupled) and have an FP32 output `embedding`,
whose last dimension is the vector's size. Each item of `input` is one inference request, all sent
at once so that the model's dynamic batcher can batch them: a string into its BYTES input
`text_input` (UTF-8), token ids into its integer input `input_ids` (the ids along the last
dimension). Triton's front end embeds only with vLLM models, through a JSON `embedding_request`
input and a JSON `text_output`; this is the tensor-native mapping, the demo `tiny_embedder`'s.

*Answer.* `{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
"model", "usage": {"prompt_tokens", "total_tokens"}}`, the data in the order of `input`. A vector
is a list of numbers, or with "base64" its little-endian float32 bytes in base64, as OpenAI
encodes it. The usage adds up the model's `num_input_tokens` outputs, and is null when the model
has none. The request holds one of the data plane's in-flight slots until every item is answered.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_server.frontends.http.messages import HttpResponse
from reference_server.frontends.http.openai.errors import JSON, OpenAiError, dumps, require_model, typed
from reference_server.frontends.plane import Plane
from v2kit import codec as v2
from v2kit.tensors import datatype_to_numpy

__all__ = ["MAX_INPUTS", "EmbeddingRequest", "answer", "embedding_answer", "model_requests", "read_embedding"]

#: The most items one request may embed (OpenAI's "any array must be 2048 dimensions or less").
MAX_INPUTS = 2048
_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_INPUT_SHAPES = "a non-empty string, an array of strings, an array of token ids or an array of arrays of token ids"


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """One /v1/embeddings request, read and checked: each item is a text or its token ids."""

    model: str
    items: tuple[str | tuple[int, ...], ...]
    encoding_format: str
    dimensions: int | None


async def answer(plane: Plane, document: dict[str, Any]) -> HttpResponse:
    """The answer to an embeddings request's body."""
    request = read_embedding(document)
    require_model(plane, request.model)
    decoupled = plane.model_config_proto(request.model).model_transaction_policy.decoupled
    requests = model_requests(request, plane.model_metadata(request.model), decoupled=decoupled)
    with plane.admit():
        results = await asyncio.gather(*(plane.infer(r) for r in requests), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    responses = [r for r in results if isinstance(r, v2.InferResponse)]
    return HttpResponse(200, dumps(embedding_answer(request, responses)), JSON)


def read_embedding(document: dict[str, Any]) -> EmbeddingRequest:
    """A request body, checked; a 400 naming the field that is wrong."""
    for key in document:
        if key not in _FIELDS:
            raise OpenAiError(f"Unrecognized request argument supplied: {key}", param=key)
    model = typed(document, "model", str, "a string")
    if not model:
        raise OpenAiError("'model' is required", param="model")
    encoding = typed(document, "encoding_format", str, "a string") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAiError(
            f"'encoding_format' must be 'float' or 'base64', got {encoding!r:.40}", param="encoding_format"
        )
    dimensions = typed(document, "dimensions", int, "an integer")
    if dimensions is not None and dimensions < 1:
        raise OpenAiError(f"'dimensions' must be at least 1, got {dimensions}", param="dimensions")
    typed(document, "user", str, "a string")
    return EmbeddingRequest(model, _items(document.get("input")), encoding, dimensions)


def _items(raw: Any) -> tuple[str | tuple[int, ...], ...]:
    if raw is None:
        raise OpenAiError("'input' is required", param="input")
    if raw == "" or raw == []:
        raise OpenAiError(f"'input' cannot be empty: send {_INPUT_SHAPES}", param="input")
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list):
        raise OpenAiError(f"'input' must be {_INPUT_SHAPES}, got {json.dumps(raw)[:40]}", param="input")
    if len(raw) > MAX_INPUTS:
        raise OpenAiError(f"'input' holds {len(raw)} items; at most {MAX_INPUTS} per request", param="input")
    if all(_is_id(item) for item in raw):
        return (tuple(raw),)
    items: list[str | tuple[int, ...]] = []
    for index, item in enumerate(raw):
        if isinstance(item, str) and item:
            items.append(item)
        elif isinstance(item, list) and item and all(_is_id(i) for i in item):
            items.append(tuple(item))
        else:
            raise OpenAiError(
                f"'input[{index}]' must be a non-empty string or a non-empty array of token ids (integers >= 0), "
                f"got {json.dumps(item)[:40]}",
                param="input",
            )
    if len({type(item) for item in items}) > 1:
        raise OpenAiError("'input' mixes strings and token arrays: send one kind per request", param="input")
    return tuple(items)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def model_requests(request: EmbeddingRequest, metadata: dict[str, Any], *, decoupled: bool) -> list[v2.InferRequest]:
    """An inference request per item of `request`, shaped by the model's `metadata`."""
    name = request.model
    if decoupled:
        raise OpenAiError(
            f"model '{name}' is decoupled (it generates text): /v1/embeddings serves a model that answers once; "
            "use /v1/completions or /v1/chat/completions for it",
            param="model",
        )
    outputs = {spec["name"]: spec for spec in metadata["outputs"]}
    embedding = outputs.get("embedding")
    if embedding is None or embedding["datatype"] != "FP32":
        raise OpenAiError(
            f"model '{name}' has no FP32 output 'embedding': /v1/embeddings serves embedding models "
            "(the demo repository's tiny_embedder)",
            param="model",
        )
    size = embedding["shape"][-1] if embedding["shape"] else 1
    if request.dimensions is not None and request.dimensions != size:
        made = f"of {size} dimensions" if size > 0 else "whose size its config leaves open"
        fix = f"leave 'dimensions' out or set it to {size}" if size > 0 else "leave 'dimensions' out"
        raise OpenAiError(
            f"model '{name}' makes embeddings {made}, not {request.dimensions}: {fix}", param="dimensions"
        )
    inputs = {spec["name"]: spec for spec in metadata["inputs"]}
    return [_request(name, item, inputs) for item in request.items]


def _request(model: str, item: str | tuple[int, ...], inputs: dict[str, dict[str, Any]]) -> v2.InferRequest:
    if isinstance(item, str):
        spec = inputs.get("text_input")
        if spec is None or spec["datatype"] != "BYTES":
            raise OpenAiError(
                f"model '{model}' has no BYTES input 'text_input' to take text: send token ids", param="input"
            )
        shape = [1] * len(spec["shape"])
        data = np.array([item.encode()], dtype=np.object_).reshape(shape)
    else:
        spec = inputs.get("input_ids")
        if spec is None or spec["datatype"] not in ("INT32", "INT64", "UINT32", "UINT64"):
            raise OpenAiError(
                f"model '{model}' has no integer input 'input_ids' to take token ids: send text", param="input"
            )
        shape = [1] * (len(spec["shape"]) - 1) + [len(item)]
        try:
            data = np.array(item, dtype=datatype_to_numpy(spec["datatype"])).reshape(shape)
        except OverflowError:
            message = f"a token id does not fit model '{model}''s {spec['datatype']} input 'input_ids'"
            raise OpenAiError(message, param="input") from None
    tensor = v2.InferTensor(spec["name"], spec["datatype"], shape, data)
    return v2.InferRequest(model_name=model, inputs=[tensor])


def embedding_answer(request: EmbeddingRequest, responses: list[v2.InferResponse]) -> dict[str, Any]:
    """OpenAI's answer from the model's response to each item, in order."""
    data = []
    tokens: int | None = 0
    for index, response in enumerate(responses):
        outputs = {tensor.name: tensor.data for tensor in response.outputs}
        vector = np.asarray(outputs["embedding"], dtype=np.float32).reshape(-1)
        encoded: Any = (
            base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
            if request.encoding_format == "base64"
            else vector.tolist()
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
        count = outputs.get("num_input_tokens")
        tokens = None if tokens is None or count is None or not count.size else tokens + int(count.reshape(-1)[0])
    usage = None if tokens is None else {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": request.model, "usage": usage}
