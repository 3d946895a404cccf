"""The generative client against a fake server with scripted token timing (tests/genai_fakes.py):
what it measures per request, and each hostile answer counted as its own kind, never a hang."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from perfkit.genai import endpoints
from perfkit.genai.endpoints import GenerativeClient
from perfkit.genai.tokenizer import ByteTokenizer
from perfkit.genai.workload import GenerativeSpec, Prompt, WorkloadSpec
from perfkit.testing.genai_server import DEFAULT_TOKENS, FIRST_S, GAP_S, serving
from perfkit.wire.client import Outcome

T = TypeVar("T")
MS = 1_000_000


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))


async def _send(kind: str, model: str, *, streaming: bool = True, tokenizer: str = "bytes",
                max_tokens: int = 0, timeout_s: float = 5.0, exact: bool = False) -> Outcome:  # fmt: skip
    workload = WorkloadSpec(output_tokens_mean=max_tokens, deterministic_output=exact)
    spec = GenerativeSpec(kind, streaming=streaming, tokenizer=tokenizer, workload=workload)
    async with serving() as url:
        client = GenerativeClient(url, spec, ByteTokenizer(), request_timeout_s=timeout_s)
        try:
            return await client.send(client.prepare(Prompt("hello world", 11, max_tokens), model))
        finally:
            await client.close()


@pytest.mark.parametrize("kind", ["chat", "completions", "kserve-generate"])
def test_a_streamed_answer_gives_ttft_ttst_and_counts(kind: str) -> None:
    outcome = _run(_send(kind, "ok", max_tokens=6))
    assert outcome.error == ""
    ttft, ttst, tokens_in, tokens_out, asked = outcome.tokens
    assert FIRST_S * 1e9 * 0.9 <= ttft < FIRST_S * 1e9 + 150 * MS  # the role-only chat event is not a token
    assert GAP_S * 1e9 * 0.5 <= ttst < ttft  # a gap, not a time since the send
    assert (tokens_in, tokens_out, asked) == (11, 6, 6)


def test_an_unstreamed_answer_has_no_token_times() -> None:
    outcome = _run(_send("completions", "ok", streaming=False))
    assert outcome.error == "" and outcome.tokens == (-1, -1, 11, DEFAULT_TOKENS, 0)


def test_usage_counts_come_from_the_server() -> None:
    outcome = _run(_send("chat", "ok", tokenizer="usage", max_tokens=3))
    assert outcome.error == "" and outcome.tokens[2:] == (11, 3, 3)
    embedded = _run(_send("embeddings", "ok", streaming=False, tokenizer="usage"))
    assert embedded.error == "" and embedded.tokens == (-1, -1, 11, 0, 0)


def test_a_stream_asks_for_usage_and_tallies_it_beside_the_tokenizers_count() -> None:
    # as AIPerf does on every stream, so that a server's other tokenizer shows without --tokenizer usage
    async def send() -> tuple[Outcome, endpoints.UsageTally]:
        async with serving() as url:
            client = GenerativeClient(url, GenerativeSpec("chat", streaming=True), ByteTokenizer())
            try:
                outcome = await client.send(client.prepare(Prompt("hello big world", 15, 3), "words"))
                return outcome, client.take_tally()
            finally:
                await client.close()

    outcome, tally = _run(send())
    assert outcome.error == "" and outcome.tokens[2:] == (15, 6, 3)  # the tokenizer's counts: "t t t "
    assert tally == endpoints.UsageTally(with_usage=1, server_in=3, own_in=15, server_out=3, own_out=6)


def test_an_answer_without_usage_is_counted_by_the_tokenizer_not_failed() -> None:
    # --tokenizer usage asks for the server's counts; a server that sends none is counted in bytes
    outcome = _run(_send("chat", "nousage", tokenizer="usage", max_tokens=3))
    assert outcome.error == "" and outcome.tokens[2:] == (11, 3, 3)


@pytest.mark.parametrize(
    ("model", "kind", "tokenizer"),
    [
        ("nodone", endpoints.NO_DONE, "bytes"),
        ("malformed", endpoints.MALFORMED, "bytes"),
        ("cut", endpoints.CUT, "bytes"),
        ("hang", "timeout", "bytes"),
    ],
)
def test_hostile_streams_are_counted_errors_of_their_own_kinds(model: str, kind: str, tokenizer: str) -> None:
    outcome = _run(_send("chat", model, tokenizer=tokenizer, timeout_s=0.5))
    assert outcome.error == kind
    assert outcome.message  # the first ones of a kind say what happened


def test_triton_generate_stream_needs_no_done_marker() -> None:
    assert _run(_send("kserve-generate", "nodone")).error == ""


@pytest.mark.parametrize("streaming", [True, False])
def test_a_generate_body_asks_the_vllm_backends_inputs(streaming: bool) -> None:
    # `stream` for a token per response, no prompt in an unstreamed answer, and the sampling
    # parameters both flat (TensorRT-LLM's inputs) and as the vLLM backend's JSON input.
    workload = WorkloadSpec(output_tokens_mean=5, deterministic_output=True, ignore_eos=True)
    client = GenerativeClient("127.0.0.1:1", GenerativeSpec("kserve-generate", streaming=streaming, workload=workload),
                              ByteTokenizer())  # fmt: skip
    body = client.body(Prompt("hi", 2, 5), "m")
    sampling = {"max_tokens": 5, "min_tokens": 5, "ignore_eos": True}
    assert body == {"text_input": "hi", "stream": streaming, "exclude_input_in_output": True, **sampling,
                    "sampling_parameters": json.dumps(sampling)}  # fmt: skip
    chat = GenerativeClient(
        "127.0.0.1:1", GenerativeSpec("chat", streaming=streaming, workload=workload), ByteTokenizer()
    )
    assert "sampling_parameters" not in chat.body(Prompt("hi", 2, 5), "m")
