"""What a generative demo model reads and writes: the vLLM backend's request tensors and a
byte-level tokenizer.

*Tokens.* One UTF-8 byte is one token (ids 0..255), so a prompt's token count is its length in
bytes and no vocabulary file is needed. A model's `text_output` carries the bytes of the tokens it
sends; a front end that wants text decodes them incrementally (a character may span tokens).

*Request* (the vLLM backend's inputs, each of one element): `text_input` (BYTES, the prompt),
`stream` (BOOL: a response per token, else one response with the whole text),
`sampling_parameters` (BYTES, a JSON object: `max_tokens`, `min_tokens`, `ignore_eos`; other keys
are accepted and ignored), `exclude_input_in_output` (BOOL: leave the prompt out of a non-streamed
answer; vLLM's default, False, puts it in front), `return_num_input_tokens` and
`return_num_output_tokens` (BOOL, accepted for the vLLM backend's clients).

*Response.* `text_output` and the UINT32 counts `num_input_tokens` and `num_output_tokens` (in a
stream, the tokens of that response, as vLLM's are, so their sum is the completion's). The counts
come with every response, asked for or not: a request that names no outputs asks for all the
config declares, and a response must carry each output asked for.

This module is copied beside each generative model's model.py: standard library and numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "Generation",
    "GenerationError",
    "decode",
    "encode",
    "output_tensors",
    "read_generation",
]

#: max_tokens when sampling_parameters does not say (Triton's OpenAI front end's default too).
DEFAULT_MAX_TOKENS = 16


class GenerationError(ValueError):
    """A request the model cannot run; its message is the error response's."""


def encode(text: bytes) -> list[int]:
    """The token ids of `text`: its bytes."""
    return list(text)


def decode(tokens: list[int]) -> bytes:
    """The bytes of token ids."""
    return bytes(tokens)


@dataclass(frozen=True, slots=True)
class Generation:
    """One request, read and checked."""

    prompt: bytes
    stream: bool
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    exclude_input_in_output: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool


def read_generation(get: Callable[[str], Any], model: str, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> Generation:
    """The request whose input tensors `get(name)` returns (a numpy array, or None when absent)."""

    def scalar(name: str) -> Any:
        array = get(name)
        if array is None:
            return None
        flat = np.asarray(array).reshape(-1)
        if flat.size != 1:
            raise GenerationError(f"{model}: input '{name}' must hold one element, got {flat.size}")
        return flat[0]

    def flag(name: str, default: bool) -> bool:
        value = scalar(name)
        return default if value is None else bool(value)

    prompt = scalar("text_input")
    if prompt is None:
        raise GenerationError(f"{model}: input 'text_input' is required")
    prompt = prompt if isinstance(prompt, bytes) else str(prompt).encode()
    if not prompt:
        raise GenerationError(f"{model}: 'text_input' is empty; send a prompt of at least one byte")
    sampling = _sampling_parameters(scalar("sampling_parameters"), model)
    max_tokens = _count(sampling, "max_tokens", default_max_tokens, 1, model)
    min_tokens = _count(sampling, "min_tokens", 0, 0, model)
    if min_tokens > max_tokens:
        raise GenerationError(f"{model}: min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")
    ignore_eos = sampling.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise GenerationError(f"{model}: sampling parameter 'ignore_eos' must be a boolean, got {ignore_eos!r:.40}")
    return Generation(
        prompt=prompt,
        stream=flag("stream", False),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=ignore_eos,
        exclude_input_in_output=flag("exclude_input_in_output", False),
        return_num_input_tokens=flag("return_num_input_tokens", False),
        return_num_output_tokens=flag("return_num_output_tokens", False),
    )


def _sampling_parameters(raw: Any, model: str) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GenerationError(f"{model}: 'sampling_parameters' is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise GenerationError(f"{model}: 'sampling_parameters' must be a JSON object")
    return document


def _count(sampling: dict[str, Any], key: str, default: int, least: int, model: str) -> int:
    value = sampling.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise GenerationError(f"{model}: sampling parameter '{key}' must be an integer >= {least}, got {value!r:.40}")
    return value


def output_tensors(generation: Generation, text: bytes, output_tokens: int) -> dict[str, Any]:
    """The outputs of one response: `text_output` (with the prompt in front for a non-streamed
    answer that does not exclude it) and the token counts."""
    if not generation.stream and not generation.exclude_input_in_output:
        text = generation.prompt + text
    return {
        "text_output": np.array([text], dtype=np.object_),
        "num_input_tokens": np.array([len(generation.prompt)], dtype=np.uint32),
        "num_output_tokens": np.array([output_tokens], dtype=np.uint32),
    }
