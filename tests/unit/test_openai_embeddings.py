"""`/v1/embeddings`' pure parts: reading a request, mapping it onto an embedding model's inputs,
building OpenAI's answer; and tiny_embedder's ONNX graph against its numpy definition."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from reference_server.frontends.http.openai.embeddings import (
    MAX_INPUTS,
    EmbeddingRequest,
    embedding_answer,
    model_requests,
    read_embedding,
)
from reference_server.frontends.http.openai.errors import OpenAiError
from v2kit import codec as v2

METADATA = {
    "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
    ],
    "outputs": [
        {"name": "embedding", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "num_input_tokens", "datatype": "UINT32", "shape": [-1, 1]},
    ],
}


@pytest.mark.parametrize(
    ("raw", "items"),
    [
        ("hello", ("hello",)),
        (["a", "bc"], ("a", "bc")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1], [2, 3]], ((1,), (2, 3))),
    ],
)
def test_each_documented_input_shape_is_read(raw: Any, items: tuple[Any, ...]) -> None:
    request = read_embedding({"model": "m", "input": raw, "user": "u"})
    assert request == EmbeddingRequest("m", items, "float", None)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x"}, "model", "'model' is required"),
        ({"model": "m"}, "input", "'input' is required"),
        ({"model": "m", "input": ""}, "input", "cannot be empty"),
        ({"model": "m", "input": []}, "input", "cannot be empty"),
        ({"model": "m", "input": 7}, "input", "must be a non-empty string, an array"),
        ({"model": "m", "input": ["a", ""]}, "input", r"'input\[1\]' must be a non-empty string"),
        ({"model": "m", "input": [[1], [True]]}, "input", r"'input\[1\]'"),
        ({"model": "m", "input": [[1], [-1]]}, "input", "integers >= 0"),
        ({"model": "m", "input": ["a", [1]]}, "input", "mixes strings and token arrays"),
        ({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
        ({"model": "m", "input": "x", "dimensions": "4"}, "dimensions", "must be an integer"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", "at least 1"),
        ({"model": "m", "input": "x", "temperature": 1}, "temperature", "Unrecognized request argument supplied"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(OpenAiError, match=words) as raised:
        read_embedding(body)
    assert raised.value.status == 400 and raised.value.param == param


def test_each_input_is_one_request_of_the_model_s_shape_and_type() -> None:
    texts = model_requests(read_embedding({"model": "m", "input": ["hé", "b"]}), METADATA, decoupled=False)
    assert [(t.name, t.datatype, t.shape, t.data.tolist()) for r in texts for t in r.inputs] == [
        ("text_input", "BYTES", [1, 1], [["hé".encode()]]),
        ("text_input", "BYTES", [1, 1], [[b"b"]]),
    ]
    [ids] = model_requests(
        read_embedding({"model": "m", "input": [5, 6, 7], "dimensions": 4}), METADATA, decoupled=False
    )
    [tensor] = ids.inputs
    assert (ids.model_name, tensor.name, tensor.datatype, tensor.shape) == ("m", "input_ids", "INT64", [1, 3])
    assert tensor.data.dtype == np.int64 and tensor.data.tolist() == [[5, 6, 7]]


@pytest.mark.parametrize(
    ("body", "metadata", "decoupled", "words"),
    [
        ({"input": "x"}, METADATA, True, r"is decoupled \(it generates text\).*use /v1/completions"),
        ({"input": "x"}, {**METADATA, "outputs": METADATA["outputs"][1:]}, False, "no FP32 output 'embedding'"),
        ({"input": "x", "dimensions": 3}, METADATA, False, "embeddings of 4 dimensions, not 3.*set it to 4"),
        (
            {"input": "x", "dimensions": 3},
            {**METADATA, "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}]},
            False,
            "whose size its config leaves open, not 3: leave 'dimensions' out",
        ),
        ({"input": [1, 2]}, {**METADATA, "inputs": METADATA["inputs"][:1]}, False, "no integer input 'input_ids'"),
        ({"input": "x"}, {**METADATA, "inputs": METADATA["inputs"][1:]}, False, "no BYTES input 'text_input'"),
    ],
)
def test_a_model_that_cannot_embed_the_request_is_named(
    body: dict[str, Any], metadata: dict[str, Any], decoupled: bool, words: str
) -> None:
    with pytest.raises(OpenAiError, match=words) as raised:
        model_requests(read_embedding({"model": "m", **body}), metadata, decoupled=decoupled)
    assert raised.value.status == 400


def _response(vector: list[float], tokens: int | None) -> v2.InferResponse:
    outputs = [v2.InferTensor("embedding", "FP32", [1, len(vector)], np.array([vector], dtype=np.float32))]
    if tokens is not None:
        outputs.append(v2.InferTensor("num_input_tokens", "UINT32", [1, 1], np.array([[tokens]], dtype=np.uint32)))
    return v2.InferResponse("m", "1", outputs=outputs)


def test_the_answer_keeps_input_order_sums_usage_and_base64_is_little_endian_float32() -> None:
    vectors = [[0.1, -0.2, 0.3, 1e-8], [1.0, 0.0, -1.0, 0.5]]
    responses = [_response(vectors[0], 3), _response(vectors[1], 5)]
    floats = embedding_answer(EmbeddingRequest("m", ("abc", "defgh"), "float", None), responses)
    packed = embedding_answer(EmbeddingRequest("m", ("abc", "defgh"), "base64", None), responses)
    assert floats["object"] == "list" and floats["model"] == "m"
    assert floats["usage"] == packed["usage"] == {"prompt_tokens": 8, "total_tokens": 8}
    assert [(d["object"], d["index"]) for d in floats["data"]] == [("embedding", 0), ("embedding", 1)]
    for as_float, as_base64, vector in zip(floats["data"], packed["data"], vectors, strict=True):
        decoded = np.frombuffer(base64.b64decode(as_base64["embedding"]), dtype="<f4")
        assert decoded.tolist() == as_float["embedding"] == np.array(vector, dtype=np.float32).tolist()
    without_counts = embedding_answer(EmbeddingRequest("m", ("a",), "float", None), [_response(vectors[0], None)])
    assert without_counts["usage"] is None


def test_the_embedder_graph_is_its_numpy_definition_and_padding_does_not_count() -> None:
    ort = pytest.importorskip("onnxruntime")
    from v2kit.genai.embedder import DIM, build_embedder, embed_reference

    session = ort.InferenceSession(build_embedder().SerializeToString(), providers=["CPUExecutionProvider"])
    short, long = list(b"hi"), list(b"a longer sentence")
    ids = np.zeros((2, len(long)), dtype=np.int64)
    mask = np.zeros((2, len(long)), dtype=np.float32)
    for row, tokens in enumerate((short, long)):
        ids[row, : len(tokens)], mask[row, : len(tokens)] = tokens, 1.0
    ids[0, len(short) :] = 200  # padding with a real token: the mask must keep it out
    (batched,) = session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
    assert batched.shape == (2, DIM)
    for row, tokens in enumerate((short, long)):
        assert np.abs(batched[row] - embed_reference(tokens)).max() < 1e-6
    assert np.linalg.norm(batched, axis=1) == pytest.approx([1.0, 1.0], abs=1e-6)
    assert float(batched[0] @ batched[1]) < 0.99  # different texts, different vectors
