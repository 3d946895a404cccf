"""The OpenAI front end's pure parts: reading a request, and mapping it onto a model's inputs as
Triton's OpenAI front end maps it for the vLLM and TensorRT-LLM backends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reference_server.frontends.http.openai.completions import chat_prompt, model_request, read_completion
from reference_server.frontends.http.openai.errors import OpenAiError

VLLM_INPUTS = {
    name: {"name": name, "datatype": datatype, "shape": [1]}
    for name, datatype in (("text_input", "BYTES"), ("stream", "BOOL"), ("sampling_parameters", "BYTES"),
                           ("exclude_input_in_output", "BOOL"), ("return_num_output_tokens", "BOOL"))
}  # fmt: skip
TRTLLM_INPUTS = {
    name: {"name": name, "datatype": datatype, "shape": [-1, 1]}
    for name, datatype in (("text_input", "BYTES"), ("stream", "BOOL"), ("max_tokens", "INT32"),
                           ("temperature", "FP32"))
}  # fmt: skip


def _tensors(request: Any) -> dict[str, Any]:
    return {t.name: (t.datatype, t.shape, t.data.reshape(-1)[0]) for t in request.inputs}


def test_a_vllm_model_gets_sampling_parameters_as_json() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "ignore_eos": True, "user": "u"}
    tensors = _tensors(model_request(read_completion(body, chat=False), VLLM_INPUTS))
    assert tensors["text_input"] == ("BYTES", [1], b"hi")
    assert not tensors["stream"][2]
    assert json.loads(tensors["sampling_parameters"][2]) == {"max_tokens": 7, "temperature": 0.5, "ignore_eos": True}
    assert tensors["exclude_input_in_output"][2] and tensors["return_num_output_tokens"][2]
    assert "return_num_input_tokens" not in tensors  # not an input of this model


def test_a_trtllm_model_gets_tensors_of_its_own_types() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9,
            "max_tokens": 3, "temperature": 0.25, "stream": True}  # fmt: skip
    tensors = _tensors(model_request(read_completion(body, chat=True), TRTLLM_INPUTS))
    assert tensors["text_input"] == ("BYTES", [1, 1], b"user: hi\nassistant: ")
    assert tensors["max_tokens"][:2] == ("INT32", [1, 1]) and tensors["max_tokens"][2] == 9
    assert tensors["temperature"][2] == pytest.approx(0.25) and tensors["stream"][2]


def test_max_tokens_defaults_to_16() -> None:
    assert read_completion({"model": "m", "prompt": "x"}, chat=False).max_tokens == 16


def test_chat_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]
    assert chat_prompt([{"role": "system", "content": "s"}, {"role": "user", "content": parts}]) == (
        "system: s\nuser: ab\nassistant: "
    )


@pytest.mark.parametrize(
    ("body", "chat", "words"),
    [
        ({"prompt": "x"}, False, "'model' is required"),
        ({"model": "m", "prompt": ["a", "b"]}, False, "only single string input"),
        ({"model": "m", "prompt": ""}, False, "prompt must be non-empty"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, False, "max_tokens must be at least 1"),
        ({"model": "m", "prompt": "x", "max_tokens": "5"}, False, "'max_tokens' must be an integer"),
        ({"model": "m", "prompt": "x", "max_tokens": 2, "min_tokens": 3}, False, "min_tokens must be between"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, False, "'stream' must be a boolean"),
        ({"model": "m", "prompt": "x", "logit_bias": {"1": 2}}, False, "logit bias is not supported"),
        ({"model": "m", "prompt": "x", "suffix": "y"}, False, "suffix is not currently supported"),
        ({"model": "m", "messages": [{"content": "x"}]}, True, "string 'role'"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, True, "must be a string or an array"),
    ],
)
def test_bad_fields_are_refused_with_400(body: dict[str, Any], chat: bool, words: str) -> None:
    with pytest.raises(OpenAiError, match=words) as refused:
        read_completion(body, chat=chat)
    assert refused.value.status == 400 and refused.value.body()["error"]["type"] == "invalid_request_error"


def test_a_model_without_llm_inputs_is_refused() -> None:
    completion = read_completion({"model": "m", "prompt": "x"}, chat=False)
    with pytest.raises(OpenAiError, match="neither a 'sampling_parameters'"):
        model_request(completion, {"text_input": VLLM_INPUTS["text_input"]})
