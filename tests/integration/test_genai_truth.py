"""perfkit's token figures against the simulated engine's known timing (sim_llm, v2kit/genai/sim_engine.py)
and against real AIPerf on the same server.

The truth is read from sim_llm's config.pbtxt parameters, the file the model itself reads. For a
prompt of P tokens at concurrency 1: TTFT = P · prefill_us_per_token and every ITL = decode_step_us
+ decode_us_per_sequence, plus the transport's time, which the sizes below keep small next to
them (TTFT 200-250 ms, ITL 10-15 ms, against ~3 ms of transport on a loaded 2-core machine).

At concurrency N (closed loop, every request the same P and T output tokens) the engine keeps the
N sequences in step: they are admitted together or in groups a few milliseconds apart, decode
together (each step `decode_step(N)`), and finish in the same step, so the next cycle starts the
same way. A request's decode phase is T-1 steps of `decode_step(N)`, plus the prefill of every group
admitted after it. Over a cycle that stall sums to between 0 (one group) and N(N-1)/2 prefills (all
singly), so the mean ITL lies in [decode_step(N), decode_step(N) + (N-1)/2 · prefill(P)/(T-1)], and the
requests of the last group admitted have an ITL of decode_step(N) exactly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.errors import ExitCode
from perfkit.results.model import LevelResult, read_sweep
from perfkit.target import ServerProcess, reference_server_process
from perfkit.testing.aiperf import aiperf_profile, aiperf_stat, write_byte_tokenizer
from v2kit.genai.repository import write_sim_llm
from v2kit.genai.sim_engine import SimTiming
from v2kit.model_config import read_config

pytestmark = pytest.mark.integration

#: What the OpenAI front end puts around a chat's one user message: "user: {text}\nassistant: ".
CHAT_FRAME_TOKENS = len("user: \nassistant: ")
OUTPUT_TOKENS = 9
#: Within this of the engine's truth at concurrency 1 (the issue's bound).
TRUTH_TOLERANCE = 0.05
#: How far above its truth an ITL may read: the engine makes up a late step only up to 1 ms
#: (sim_engine.CATCH_UP_S), and a late last token lengthens the whole request's ITL, so with both
#: cores saturated (two busy loops beside the test) its 10-15 ms steps read 5-18 % long, while a
#: shared but unsaturated machine reads within 0.2-3 %. Below the truth the 5 % bound stays:
#: nothing makes the engine early.
ITL_ABOVE = 0.25


#: How far above its truth a TTFT may read: the prefill is one timed wait, and a CPU-starved engine
#: or client wakes late, never early (a 200 ms prefill read 210.5 ms in a CI run with the suite
#: alone on both cores). Below the truth the 5 % bound stays.
TTFT_ABOVE = 0.15


def _assert_itl(measured: float, truth: float) -> None:
    assert truth * (1 - TRUTH_TOLERANCE) <= measured <= truth * (1 + ITL_ABOVE), (measured, truth)


def _assert_ttft(measured: float, truth: float) -> None:
    assert truth * (1 - TRUTH_TOLERANCE) <= measured <= truth * (1 + TTFT_ABOVE), (measured, truth)


def _truth(repository: Path) -> SimTiming:
    config = read_config(repository / "sim_llm")
    assert config is not None
    return SimTiming.from_parameters({key: value.string_value for key, value in config.parameters.items()})


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, SimTiming]]:
    """The reference server on sim_llm with costs large next to scheduler noise, and a per-sequence
    decode cost that makes concurrency visible; never "EOS" early."""
    repository = tmp_path_factory.mktemp("sim") / "models"
    write_sim_llm(
        repository,
        SimTiming(prefill_us_per_token=600, decode_step_us=10_000, decode_us_per_sequence=5_000, eos_after_tokens=0),
    )
    with reference_server_process(repository) as server:
        yield server, _truth(repository)


def _sweep(
    tmp_path: Path, url: str | None, endpoint: str, concurrency: int, input_tokens: int, count: int
) -> LevelResult:
    out = tmp_path / f"{endpoint}-{concurrency}"
    target = ["-u", url, "-m", "sim_llm"] if url else []
    code = main(["sweep", *target, "--endpoint-type", endpoint, "--streaming",
                 "--concurrency-range", str(concurrency), "--request-count", str(count),
                 "--warmup-request-count", str(concurrency), "--synthetic-input-tokens-mean", str(input_tokens),
                 "--output-tokens-mean", str(OUTPUT_TOKENS), "--ignore-eos", "--quiet", "--no-report",
                 "--report-dir", str(out)])  # fmt: skip
    assert code in (ExitCode.OK, ExitCode.UNSTABLE)
    path = next(out.glob("sweep-sim_llm-*.json"))
    level = read_sweep(path).levels[0]
    assert level.tokens is not None and level.error_count == 0
    assert level.tokens.output_tokens.p50 == OUTPUT_TOKENS
    return level


def test_the_embedded_default_measures_sim_llm_over_generate_stream_at_its_truth(tmp_path: Path) -> None:
    # No -u: the embedded server on the demo repository with its generative models, sim_llm by default.
    from v2kit.demo import ensure_demo_repository

    truth = _truth(ensure_demo_repository(genai=True))
    level = _sweep(tmp_path, None, "kserve-generate", 1, 1000, 4)
    assert level.tokens is not None
    ttft, itl = truth.prefill_s(1000) * 1e3, truth.decode_step_s(1) * 1e3
    _assert_ttft(level.tokens.ttft_ms.p50, ttft)
    _assert_itl(level.tokens.itl_ms.p50, itl)


def test_chat_streamed_at_concurrency_1_reads_the_engines_truth(
    tmp_path: Path, sim_server: tuple[ServerProcess, SimTiming]
) -> None:
    url, truth = sim_server[0].http_url, sim_server[1]
    level = _sweep(tmp_path, url, "chat", 1, 400, 5)
    assert level.tokens is not None
    ttft, itl = truth.prefill_s(400 + CHAT_FRAME_TOKENS) * 1e3, truth.decode_step_s(1) * 1e3
    _assert_ttft(level.tokens.ttft_ms.p50, ttft)
    _assert_itl(level.tokens.itl_ms.p50, itl)


def test_at_concurrency_4_the_itl_is_the_batched_decode_step(
    tmp_path: Path, sim_server: tuple[ServerProcess, SimTiming]
) -> None:
    url, truth = sim_server[0].http_url, sim_server[1]
    n, prompt = 4, 20 + CHAT_FRAME_TOKENS
    level = _sweep(tmp_path, url, "chat", n, 20, 16)
    assert level.tokens is not None
    step, fewer = truth.decode_step_s(n) * 1e3, truth.decode_step_s(n - 1) * 1e3
    stall = (n - 1) / 2 * truth.prefill_s(prompt) * 1e3 / (OUTPUT_TOKENS - 1)
    itl = level.tokens.itl_ms
    # The requests of the last group admitted see no stall: their ITL is the step of N sequences
    # (30 ms here; of N-1, 25 ms). Noise only adds time, so the least ITL is the robust reading.
    assert itl.min == pytest.approx(step, rel=TRUTH_TOLERANCE) and itl.min > fewer * (1 + TRUTH_TOLERANCE)
    # The median within the model's range (30 to 34.3 ms); its upper margin is 25 %, not 5 %: on a
    # shared 2-core machine a stalled engine thread delays whole cycles (seen: p50 40 ms, mean 71 ms).
    assert step * (1 - TRUTH_TOLERANCE) <= itl.p50 <= (step + stall) * 1.25


def test_grpc_streaming_counts_each_response_as_a_token(
    tmp_path: Path, sim_server: tuple[ServerProcess, SimTiming]
) -> None:
    # --endpoint-type kserve-infer --streaming on a model with a text_output: one token per response
    server, truth = sim_server
    prompt = "x" * 300
    sampling = json.dumps({"max_tokens": OUTPUT_TOKENS, "ignore_eos": True})
    request = {"text_input": [prompt], "stream": [True], "sampling_parameters": [sampling],
               "exclude_input_in_output": [True], "return_num_input_tokens": [False],
               "return_num_output_tokens": [False]}  # fmt: skip
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [request]}))
    out = tmp_path / "grpc"
    code = main(["sweep", "-u", server.grpc_url, "-i", "grpc", "-m", "sim_llm", "--streaming", "--input-data",
                 str(data), "--concurrency-range", "1", "--request-count", "5", "--warmup-request-count", "1",
                 "--quiet", "--no-report", "--report-dir", str(out)])  # fmt: skip
    assert code in (ExitCode.OK, ExitCode.UNSTABLE)
    tokens = read_sweep(next(out.glob("sweep-sim_llm-*.json"))).levels[0].tokens
    assert tokens is not None and tokens.token_source == "responses"
    assert tokens.output_tokens.p50 == OUTPUT_TOKENS
    _assert_ttft(tokens.ttft_ms.p50, truth.prefill_s(len(prompt)) * 1e3)
    _assert_itl(tokens.itl_ms.p50, truth.decode_step_s(1) * 1e3)


@pytest.fixture(scope="module")
def aiperf() -> Path:
    value = os.environ.get("PERFKIT_PEERS")
    if not value:
        pytest.skip("PERFKIT_PEERS is not set: install the peers (AIPerf among them) with `bash peers/install.sh DIR`")
    executable = Path(value) / "bin" / "aiperf"
    if not executable.exists():
        pytest.skip(f"PERFKIT_PEERS={value} has no bin/aiperf; rerun `bash peers/install.sh {value}`")
    return executable


@pytest.mark.peers
def test_aiperf_and_perfkit_agree_on_the_same_server(
    tmp_path: Path, sim_server: tuple[ServerProcess, SimTiming], aiperf: Path
) -> None:
    """Same server, model, endpoint (chat, streamed), concurrency 1 and lengths. TTFT and ITL have the
    same definitions in both; perfkit's per-request output tokens/s (1 / ITL) is AIPerf's
    output_token_throughput_per_user. (AIPerf's output_token_throughput divides by its whole run,
    perfkit's output_tokens_per_s by the measured windows: not compared.)"""
    url = sim_server[0].http_url
    tokenizer = write_byte_tokenizer(tmp_path / "tokenizer", aiperf.parent.parent / "aiperf" / "bin" / "python")
    export = aiperf_profile(aiperf, [
        "--model", "sim_llm", "--url", f"http://{url}", "--endpoint-type", "chat", "--streaming",
        "--concurrency", "1", "--request-count", "6", "--warmup-request-count", "3",
        "--prompt-input-tokens-mean", "200", "--prompt-input-tokens-stddev", "0",
        "--prompt-output-tokens-mean", str(OUTPUT_TOKENS), "--extra-inputs", "ignore_eos:true",
        "--tokenizer", str(tokenizer), "--random-seed", "1", "--workers-max", "1", "--record-processors", "1",
    ], tmp_path / "aiperf")  # fmt: skip
    level = _sweep(tmp_path, url, "chat", 1, 200, 6)
    tokens = level.tokens
    assert tokens is not None
    assert aiperf_stat(export, "output_sequence_length") == OUTPUT_TOKENS
    pairs = {
        "ttft": (tokens.ttft_ms.p50, aiperf_stat(export, "time_to_first_token")),
        "itl": (tokens.itl_ms.p50, aiperf_stat(export, "inter_token_latency")),
        "tokens/s": (tokens.output_tokens_per_s_per_request.p50, aiperf_stat(export, "output_token_throughput_per_user")),
    }  # fmt: skip
    for name, (ours, theirs) in pairs.items():
        assert ours == pytest.approx(theirs, rel=0.10), f"{name}: perfkit {ours:.2f}, AIPerf {theirs:.2f}"
