"""Multi-turn chat sessions against the reference server's simulated engine (sim_llm), on the wire:
each turn sends the history as received, so its input tokens grow by the previous prompt and
answer; a session keeps one X-Correlation-ID; its turns never overlap; the session count and
turns are what was asked."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from perfkit.genai.endpoints import GenerativeClient, GenPrepared
from perfkit.genai.sessions import SESSION_HEADER, SessionLoad, synthetic_conversations
from perfkit.genai.tokenizer import ByteTokenizer
from perfkit.genai.workload import GenerativeSpec, SessionSpec, WorkloadSpec, build_prompts
from perfkit.load.generator import LoadGenerator, RealClock
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop
from perfkit.target import ServerProcess, reference_server_process
from perfkit.wire.client import Outcome
from tests.waiting import eventually
from v2kit.genai.repository import write_sim_llm
from v2kit.genai.sim_engine import SimTiming

pytestmark = pytest.mark.integration

SESSIONS, TURNS, OUTPUT_TOKENS = 4, 3, 4


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("sessions") / "models"
    write_sim_llm(repository, SimTiming(prefill_us_per_token=20, decode_step_us=2_000, eos_after_tokens=0))
    with reference_server_process(repository) as server:
        yield server


class _WireClient(GenerativeClient):
    """The real client, keeping what each request sent (with the headers as aiohttp wrote them)
    and got, with when."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exchanges: list[tuple[float, float, GenPrepared, Outcome]] = []
        self.wire_ids: list[str] = []  # each request's correlation header, as aiohttp sent it

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            trace = aiohttp.TraceConfig()

            async def on_headers(session: Any, context: Any, params: aiohttp.TraceRequestHeadersSentParams) -> None:
                self.wire_ids.append(params.headers.get(SESSION_HEADER, ""))

            trace.on_request_headers_sent.append(on_headers)
            self._session = aiohttp.ClientSession(headers=self._headers, trace_configs=[trace])
        return self._session

    async def send(self, prepared: GenPrepared) -> Outcome:
        loop = asyncio.get_running_loop()
        start = loop.time()
        outcome = await super().send(prepared)
        self.exchanges.append((start, loop.time(), prepared, outcome))
        return outcome


def test_chat_sessions_carry_their_history_and_one_correlation_id(sim_server: ServerProcess) -> None:
    spec = GenerativeSpec(
        endpoint_type="chat",
        streaming=True,
        workload=WorkloadSpec(
            input_tokens_mean=12, output_tokens_mean=OUTPUT_TOKENS, ignore_eos=True, prompt_count=5, seed=3
        ),  # fmt: skip
        sessions=SessionSpec(True, count=SESSIONS, turns_mean=TURNS, delay_mean_ms=5),
    )
    tokenizer = ByteTokenizer()
    client = _WireClient(f"127.0.0.1:{sim_server.ports['HTTPService']}", spec, tokenizer)
    conversations = synthetic_conversations(spec.sessions, build_prompts(spec.workload, tokenizer), 3)
    load = SessionLoad(conversations, lambda p, h, c: client.prepare_turn(p, "sim_llm", h, c), seed=3)
    buffer = SampleBuffer()

    async def run() -> None:
        generator = LoadGenerator(client, [], buffer, RealClock(), sequences=load)
        generator.start(ClosedLoop(2))
        await eventually(lambda: len(buffer.sessions()) >= SESSIONS, 30)
        await generator.stop(5)
        await client.close()

    asyncio.run(asyncio.wait_for(run(), 60))
    finished = buffer.sessions()
    assert len(finished) >= SESSIONS and finished.ok.all() and set(finished.requests.tolist()) == {TURNS}
    by_session: dict[str, list[tuple[float, float, GenPrepared, Outcome]]] = defaultdict(list)
    for exchange in client.exchanges:
        assert not exchange[3].error, exchange[3]
        assert exchange[2].headers is not None
        by_session[exchange[2].headers[SESSION_HEADER]].append(exchange)
    # every session started is one correlation id; those not finished when the load stopped (at
    # most one per slot) had fewer turns
    complete = [turns for turns in by_session.values() if len(turns) == TURNS]
    assert len(complete) == len(finished) and len(by_session) - len(complete) <= 2
    assert Counter(client.wire_ids) == {c: len(turns) for c, turns in by_session.items()}  # on the wire
    for turns in by_session.values():
        for (_, done, before, answer), (sent, _, after, _) in zip(turns, turns[1:]):
            assert sent >= done  # serial: never overlapping
            messages = json.loads(after.payload)["messages"]
            prompt = messages[-1]["content"]
            assert messages[:-1] == [*json.loads(before.payload)["messages"],
                                     {"role": "assistant", "content": answer.text}]  # fmt: skip
            # input tokens: the previous turn's (its history and prompt), its answer, the new prompt
            before_in, answer_out = answer.tokens[2], answer.tokens[3]
            assert answer_out == OUTPUT_TOKENS and answer.text
            assert after.tokens_in == before_in + answer_out + len(prompt.encode())
    # and the samples recorded the same growth: turn k's input tokens are larger than turn k-1's
    recorded = buffer.arrays()
    assert recorded.tokens is not None and recorded.sequence_id is not None
    for session in set(recorded.sequence_id.tolist()):
        inputs = recorded.tokens[recorded.sequence_id == session, 2].tolist()
        assert len(inputs) <= TURNS and all(b > a + OUTPUT_TOKENS for a, b in zip(inputs, inputs[1:]))


def test_the_sweep_reports_per_session_figures(sim_server: ServerProcess, tmp_path: Path) -> None:
    from perfkit.cli import main
    from perfkit.results.model import read_sweep

    url = f"127.0.0.1:{sim_server.ports['HTTPService']}"
    code = main(["sweep", "-u", url, "-m", "sim_llm", "--endpoint-type", "completions", "--streaming",
                 "--concurrency-range", "2", "--request-count", "12", "--output-tokens-mean", "3", "--ignore-eos",
                 "--synthetic-input-tokens-mean", "8", "--num-sessions", "3", "--session-turns-mean", "3",
                 "--quiet", "--no-report", "--report-dir", str(tmp_path)])  # fmt: skip
    assert code == 3  # measured, but 12 requests in under a second are too few for a valid p90
    level = read_sweep(next(tmp_path.glob("sweep-*.json"))).levels[0]
    assert {c.name for c in level.checks if not c.passed} <= {"sample_count", "duration"}
    assert level.sessions is not None and level.tokens is not None
    assert level.sessions.count >= 2 and level.sessions.turns.mean == 3.0
    assert 0 < level.sessions.latency_ms.p50 and level.tokens.input_tokens.max > 2 * 8 + 3
