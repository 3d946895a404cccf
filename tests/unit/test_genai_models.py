"""The generative demo models' parts that need no server: the simulated engine's scheduler (on a
simulated clock), the vLLM-style request reading, and the ONNX decoder's KV cache."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from v2kit.genai.llm_io import GenerationError, output_tensors, read_generation
from v2kit.genai.sim_engine import SimScheduler, SimSequence, SimTiming, output_length

TIMING = SimTiming(prefill_us_per_token=100, decode_step_us=1000, decode_us_per_sequence=50, max_num_seqs=2,
                   kv_cache_tokens=100, eos_after_tokens=0)  # fmt: skip


def simulate(timing: SimTiming, requests: list[tuple[float, int, int]]) -> list[list[float]]:
    """Token times (s) of each request (arrival s, prompt tokens, output tokens), running the
    scheduler on a simulated clock as SimEngine runs it on a real one."""
    scheduler = SimScheduler(timing)
    times: list[list[float]] = [[] for _ in requests]
    pending = sorted(range(len(requests)), key=lambda i: requests[i][0])
    clock = [0.0]
    while True:
        now = clock[0]
        while pending and requests[pending[0]][0] <= now:
            index = pending.pop(0)
            _, prompt, output = requests[index]
            scheduler.add(SimSequence(prompt, output, lambda _i, _f, index=index: times[index].append(clock[0])))
        step = scheduler.next_step()
        if step is None:
            if not pending:
                return times
            clock[0] = requests[pending[0]][0]
            continue
        clock[0] = now + step.duration_s
        for sequence, token, final in scheduler.complete(step):
            sequence.on_token(token, final)


def test_one_request_has_the_documented_ttft_and_itl() -> None:
    [times] = simulate(TIMING, [(0.0, 40, 5)])
    assert times[0] == pytest.approx(40 * 100e-6)  # TTFT: prompt tokens x prefill cost
    gaps = np.diff(times)
    assert gaps == pytest.approx([1000e-6 + 50e-6] * 4)  # ITL: one decode step of one sequence


def test_running_sequences_share_decode_steps_up_to_the_limit() -> None:
    first, second, third = simulate(TIMING, [(0.0, 10, 3), (0.0, 10, 3), (0.0, 10, 3)])
    # The first two are admitted together (one prefill of 20 tokens), then decode as a batch of 2.
    assert first[0] == second[0] == pytest.approx(20 * 100e-6)
    assert np.diff(first) == pytest.approx([1000e-6 + 2 * 50e-6] * 2)
    # The third waits for a running slot: admitted only when the first two have finished.
    assert third[0] == pytest.approx(first[-1] + 10 * 100e-6)


def test_the_kv_budget_queues_what_does_not_fit() -> None:
    big, small = simulate(TIMING, [(0.0, 60, 10), (0.0, 30, 5)])  # 70 + 35 > 100 KV tokens
    assert small[0] > big[-1]
    with pytest.raises(ValueError, match="more than the cache's 100"):
        SimScheduler(TIMING).add(SimSequence(95, 10, lambda _i, _f: None))


def test_dropped_sequences_free_their_slot_and_reservation() -> None:
    scheduler = SimScheduler(TIMING)
    sequence = SimSequence(10, 50, lambda _i, _f: None)
    scheduler.add(sequence)
    scheduler.complete(scheduler.next_step())  # type: ignore[arg-type]
    assert scheduler.kv_used == 60 and scheduler.running == [sequence]
    scheduler.drop(sequence)
    assert scheduler.kv_used == 0 and scheduler.running == [] and scheduler.next_step() is None


@pytest.mark.parametrize(
    ("max_tokens", "min_tokens", "ignore_eos", "expected"),
    [(100, 0, False, 48), (10, 0, False, 10), (100, 0, True, 100), (100, 60, False, 60)],
)
def test_output_length_follows_eos_min_tokens_and_ignore_eos(
    max_tokens: int, min_tokens: int, ignore_eos: bool, expected: int
) -> None:
    assert output_length(SimTiming(eos_after_tokens=48), max_tokens, min_tokens, ignore_eos) == expected


def test_timing_comes_from_config_parameters_and_bad_ones_are_named() -> None:
    timing = SimTiming.from_parameters({"decode_step_us": "2500", "max_num_seqs": "4"})
    assert (timing.decode_step_us, timing.max_num_seqs, timing.prefill_us_per_token) == (2500.0, 4, 200.0)
    with pytest.raises(ValueError, match="'max_num_seqs' must be >= 1"):
        SimTiming.from_parameters({"max_num_seqs": "0"})
    with pytest.raises(ValueError, match="'decode_step_us' must be a number"):
        SimTiming.from_parameters({"decode_step_us": "fast"})


def _inputs(**values: Any) -> Any:
    return lambda name: None if name not in values else np.array([values[name]], dtype=object)


def test_a_vllm_request_is_read_and_answered_with_counts() -> None:
    sampling = json.dumps({"max_tokens": 7, "min_tokens": 2, "ignore_eos": True, "temperature": 0.5})
    generation = read_generation(_inputs(text_input=b"hello", stream=True, sampling_parameters=sampling), "m")
    assert (generation.max_tokens, generation.min_tokens, generation.ignore_eos, generation.stream) == (
        7,
        2,
        True,
        True,
    )
    outputs = output_tensors(generation, b"x", 1)
    assert outputs["text_output"].tolist() == [b"x"]
    assert (outputs["num_input_tokens"].tolist(), outputs["num_output_tokens"].tolist()) == ([5], [1])
    whole = read_generation(_inputs(text_input=b"hi "), "m")
    assert whole.max_tokens == 16 and output_tensors(whole, b"there", 5)["text_output"].tolist() == [b"hi there"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "'text_input' is required"),
        ({"text_input": b""}, "is empty"),
        ({"text_input": b"x", "sampling_parameters": "{"}, "not valid JSON"),
        ({"text_input": b"x", "sampling_parameters": "[]"}, "must be a JSON object"),
        ({"text_input": b"x", "sampling_parameters": '{"max_tokens": 0}'}, "'max_tokens' must be an integer >= 1"),
        ({"text_input": b"x", "sampling_parameters": '{"max_tokens": 2, "min_tokens": 3}'}, "must not exceed"),
        ({"text_input": b"x", "sampling_parameters": '{"ignore_eos": "yes"}'}, "'ignore_eos' must be a boolean"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(values: dict[str, Any], message: str) -> None:
    with pytest.raises(GenerationError, match=message):
        read_generation(_inputs(**values), "m")


def test_the_decoder_s_kv_cache_gives_the_logits_of_a_full_pass() -> None:
    ort = pytest.importorskip("onnxruntime")
    from v2kit.genai.decoder import HEADS, LAYERS, WIDTH, build_decoder

    session = ort.InferenceSession(build_decoder().SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    empty = np.zeros((1, HEADS, 0, WIDTH // HEADS), dtype=np.float32)
    past = {f"past_{kind}_{layer}": empty for layer in range(LAYERS) for kind in ("key", "value")}

    def run(tokens: list[int], start: int, cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(tokens)
        bias = np.triu(np.full((n, n), -1e9, dtype=np.float32), 1)
        bias = np.concatenate([np.zeros((n, start), dtype=np.float32), bias], axis=1)
        feeds = {"input_ids": np.array([tokens]), "position_ids": np.arange(start, start + n)[None],
                 "attention_bias": bias, **cache}  # fmt: skip
        return dict(zip(names, session.run(None, feeds)))

    tokens = list(b"tiny decoder")
    full = run(tokens, 0, past)["logits"][0, -1]
    prefix = run(tokens[:-1], 0, past)
    cache = {name: prefix[name.replace("past_", "present_")] for name in past}
    step = run(tokens[-1:], len(tokens) - 1, cache)["logits"][0, -1]
    assert np.abs(step - full).max() < 1e-3 * np.abs(full).max()
    assert full.std() > 0.1  # the random weights give logits that vary with the token
