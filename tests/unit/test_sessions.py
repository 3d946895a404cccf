"""Multi-turn sessions (perfkit.genai.sessions): turn drawing, history building per endpoint type,
the multi_turn file, the session scheduling on virtual time, the per-session figures, and the
flags' errors."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfkit.cli import main
from perfkit.errors import ExitCode
from perfkit.genai.endpoints import GenerativeClient
from perfkit.genai.records import session_figures
from perfkit.genai.sessions import (
    SESSION_HEADER,
    Conversation,
    SessionLoad,
    Turn,
    chat_messages,
    history_text,
    is_multi_turn,
    read_multi_turn,
    synthetic_conversations,
)
from perfkit.genai.tokenizer import ByteTokenizer
from perfkit.genai.workload import GenerativeSpec, Prompt, SessionSpec, WorkloadSpec
from perfkit.load.generator import FakeClock, LoadGenerator
from perfkit.load.samples import SampleBuffer, SequenceArrays
from perfkit.load.schedule import ClosedLoop, OpenLoop
from perfkit.report.export import render_summary_table
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.model import WindowResult, sweep_from_json, sweep_to_json
from tests.fakes import FakeOutcome
from tests.synthetic import make_level, make_sweep

MS = 1_000_000
TOKENS = ByteTokenizer()


def _prompts(*texts: str) -> list[Prompt]:
    return [Prompt(t, len(t), 4) for t in texts]


# --- turn drawing ---


def test_turn_counts_and_think_times_are_drawn_from_the_seed() -> None:
    spec = SessionSpec(True, count=400, turns_mean=4, turns_stddev=2.0, delay_mean_ms=100, delay_stddev_ms=80)
    conversations = synthetic_conversations(spec, _prompts("a", "b", "c"), seed=7)
    counts = [len(c.turns) for c in conversations]
    assert len(conversations) == 400 and min(counts) == 1 and 3.6 < np.mean(counts) < 4.4 and len(set(counts)) > 3
    assert conversations == synthetic_conversations(spec, _prompts("a", "b", "c"), seed=7)
    assert conversations != synthetic_conversations(spec, _prompts("a", "b", "c"), seed=8)
    delays = [t.delay_ms for c in conversations for t in c.turns[1:]]
    assert all(c.turns[0].delay_ms == 0 for c in conversations)  # a session's start is the load's to decide
    assert min(delays) == 0 and 85 < np.mean(delays) < 125  # floored at 0 (so the mean moves up a little)
    # the prompt pool is cycled turn after turn, over all conversations
    texts = [t.prompt.text for c in conversations for t in c.turns]
    assert texts[:6] == ["a", "b", "c", "a", "b", "c"]


def test_fixed_turns_and_the_delay_ratio() -> None:
    spec = SessionSpec(True, count=3, turns_mean=2, delay_mean_ms=50, delay_ratio=0.5)
    conversations = synthetic_conversations(spec, _prompts("x"), seed=0)
    assert [[t.delay_ms for t in c.turns] for c in conversations] == [[0.0, 25.0]] * 3
    assert [c.session_id for c in conversations] == ["session_0", "session_1", "session_2"]


# --- history per endpoint type ---


def test_history_for_chat_is_messages_and_for_completions_text() -> None:
    history = [("hi", "hello there"), ("more", "ok")]
    assert chat_messages(history, "last") == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"},
        {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last"},
    ]  # fmt: skip
    assert chat_messages([], "first") == [{"role": "user", "content": "first"}]
    assert history_text(history, "last") == "hi\nhello there\nmore\nok\nlast"
    assert history_text([], "first") == "first"


@pytest.mark.parametrize("kind", ["chat", "completions", "kserve-generate"])
def test_a_turn_carries_the_history_counts_it_and_names_its_session(kind: str) -> None:
    client = GenerativeClient("127.0.0.1:1", GenerativeSpec(endpoint_type=kind), TOKENS)
    prompt = Prompt("next", 4, 8)
    prepared = client.prepare_turn(prompt, "m", [("abc", "de")], "s-1")
    body = json.loads(prepared.payload)
    if kind == "chat":
        assert [m["content"] for m in body["messages"]] == ["abc", "de", "next"]
        assert prepared.tokens_in == 3 + 2 + 4
    else:
        assert body["prompt" if kind == "completions" else "text_input"] == "abc\nde\nnext"
        assert prepared.tokens_in == len("abc\nde\nnext")
    assert prepared.headers == {SESSION_HEADER: "s-1"} and prepared.tokens_asked == 8
    first = client.prepare_turn(prompt, "m", [], "s-1")
    assert first.tokens_in == 4 and first.payload == client.prepare(prompt, "m").payload


# --- the multi_turn file ---


def test_a_multi_turn_file_gives_conversations(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    lines = [
        {"session_id": "a", "turns": [{"text": "Hello", "delay": 0}, {"text": "More", "delay": 1000}]},
        {"session_id": "b", "turns": [{"texts": ["one", "two"], "output_length": 7}]},
        {"session_id": "a", "turns": [{"text": "Again"}]},
        {"turns": [{"text": "anonymous"}]},
    ]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    assert is_multi_turn(path)
    conversations = read_multi_turn(path, TOKENS, WorkloadSpec(output_tokens_mean=3))
    by_id = {c.session_id: c for c in conversations}
    assert [t.prompt.text for t in by_id["a"].turns] == ["Hello", "More", "Again"]
    assert [t.delay_ms for t in by_id["a"].turns] == [0.0, 1000.0, 0.0]
    assert by_id["b"].turns[0].prompt == Prompt("one\ntwo", 7, 7)
    assert by_id["a"].turns[0].prompt.max_tokens == 3  # --output-tokens-mean where the turn names none
    assert len(conversations) == 3 and by_id["line_4"].turns[0].prompt.text == "anonymous"
    single = tmp_path / "single.jsonl"
    single.write_text('{"text": "a prompt"}\n')
    assert not is_multi_turn(single)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"turns": []}', '"turns", a non-empty list'),
        ("{not json", '"turns", a non-empty list'),
        ('{"turns": [{"image": "x.png"}]}', 'turn 1: a turn needs a "text"'),
        ('{"turns": [{"text": "a", "delay": -5}]}', '"delay" is the think time in ms'),
        ('{"turns": [{"text": "a", "timestamp": 10}]}', '"timestamp" schedules are not supported'),
        ('{"turns": [{"text": "a", "output_length": 0}]}', '"output_length" is the max_tokens'),
        ('{"session_id": 3, "turns": [{"text": "a"}]}', '"session_id" must be a string'),
    ],
)
def test_a_bad_multi_turn_file_is_named_with_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"turns": [{"text": "fine"}]}\n' + line + "\n")
    with pytest.raises(Exception, match=f"--input-file {path}:2") as info:
        read_multi_turn(path, TOKENS, WorkloadSpec())
    assert message in str(info.value)


# --- scheduling on virtual time ---


class _Turn(dict[str, Any]):
    bytes_out = 1


class _EchoClient:
    """Answers each turn after `latency_ns`, on the fake clock, with `answer<request index>`."""

    url, protocol = "fake:0", "fake"

    def __init__(self, clock: FakeClock, latency_ns: int, fail_at: int = -1) -> None:
        self.clock, self.latency_ns, self.fail_at = clock, latency_ns, fail_at
        self.requests: list[tuple[int, int, _Turn]] = []  # (sent, done, the turn), in the order sent

    async def send(self, turn: _Turn) -> FakeOutcome:
        index = len(self.requests)
        sent = self.clock.now_ns()
        self.requests.append((sent, -1, turn))
        await self.clock.sleep_until(sent + self.latency_ns)
        self.requests[index] = (sent, self.clock.now_ns(), turn)
        return FakeOutcome("boom" if index == self.fail_at else "", 10, text=f"answer{index}")


def _session_load(turns: int, delay_ms: float, conversations: int = 2) -> SessionLoad:
    convs = [
        Conversation(f"c{n}", tuple(Turn(Prompt(f"c{n}t{k}", 4), delay_ms if k else 0.0) for k in range(turns)))
        for n in range(conversations)
    ]

    def prepare(prompt: Prompt, history: Any, correlation: str) -> _Turn:
        return _Turn(prompt=prompt.text, history=list(history), id=correlation)

    return SessionLoad(convs, prepare, seed=3)


def _run(load: SessionLoad, client: _EchoClient, clock: FakeClock, shape: Any, run_ns: int) -> SampleBuffer:
    buffer = SampleBuffer()

    async def go() -> None:
        generator = LoadGenerator(client, [], buffer, clock, sequences=load)
        generator.start(shape)
        await clock.sleep_until(clock.now_ns() + run_ns)
        await generator.stop()

    asyncio.run(go())
    return buffer


def _by_session(client: _EchoClient) -> dict[str, list[tuple[int, int, _Turn, str]]]:
    """Each session's requests in order, with the answer each got."""
    sessions: dict[str, list[tuple[int, int, _Turn, str]]] = defaultdict(list)
    for index, (sent, done, turn) in enumerate(client.requests):
        sessions[turn["id"]].append((sent, done, turn, f"answer{index}"))
    return sessions


def _most_in_flight(client: _EchoClient) -> int:
    return max(sum(s <= t < d for s, d, _ in client.requests) for t, _, _ in client.requests)


def test_concurrency_runs_sessions_serially_with_think_time_and_carries_answers() -> None:
    clock = FakeClock()
    client = _EchoClient(clock, 10 * MS)
    buffer = _run(_session_load(3, 25), client, clock, ClosedLoop(2), 400 * MS)
    sessions = _by_session(client)
    finished = buffer.sessions()
    assert len(finished) >= 4 and set(finished.requests.tolist()) == {3} and finished.ok.all()
    assert _most_in_flight(client) == 2  # one session per slot at a time
    for turns in sessions.values():
        assert [len(t[2]["history"]) for t in turns] == list(range(len(turns)))
        assert len({t[2]["prompt"][:2] for t in turns}) == 1  # one conversation per session
        for (_, done, before, answer), (sent, _, after, _) in zip(turns, turns[1:]):
            assert sent == done + 25 * MS  # serial, the think time after the answer exactly
            assert after["history"] == [*before["history"], (before["prompt"], answer)]  # as received
    # each finished session's latency is first send to last answer, think times included
    assert set((finished.done_ns - finished.first_sent_ns).tolist()) == {3 * 10 * MS + 2 * 25 * MS}


def test_request_rate_starts_sessions_on_schedule_and_later_turns_follow_answers() -> None:
    clock = FakeClock()
    client = _EchoClient(clock, 30 * MS)
    buffer = _run(_session_load(3, 5, conversations=1), client, clock, OpenLoop(rate=20.0), 500 * MS)
    arrays = buffer.arrays()
    sessions = _by_session(client)
    first_sends = sorted(turns[0][0] for turns in sessions.values())
    assert np.diff(first_sends).tolist() == [50 * MS] * (len(first_sends) - 1)  # 20 sessions/s
    assert _most_in_flight(client) >= 2  # sessions overlap (a new one every 50 ms, each 100 ms long)...
    for turns in sessions.values():
        for (_, done, _, _), (sent, _, _, _) in zip(turns, turns[1:]):
            assert sent == done + 5 * MS  # ...yet each is serial
    # a later turn is intended at its predecessor's answer plus the think time: never late
    later = arrays.sent_ns != arrays.intended_ns
    assert not later.any()
    assert len(buffer.sessions()) >= 6


def test_a_failed_turn_ends_its_session_and_stop_cuts_think_time_short() -> None:
    clock = FakeClock()
    client = _EchoClient(clock, 10 * MS, fail_at=0)
    buffer = _run(_session_load(3, 10_000), client, clock, ClosedLoop(1), 50 * MS)
    finished = buffer.sessions()
    assert finished.requests.tolist() == [1] and not finished.ok.any()  # ended on its failed first turn
    assert len(client.requests) == 2  # the next session's first turn, then a 10 s think time...
    assert clock.now_ns() < 1000 * MS  # ...that stop did not wait out


# --- figures, results, flags ---


def test_session_figures_count_the_windows_sessions() -> None:
    sessions = SequenceArrays(
        np.array([0, 100, 200, 900], dtype=np.int64) * MS, np.array([500, 700, 800, 1500], dtype=np.int64) * MS,
        np.array([True, True, False, True]), np.array([3, 2, 1, 4], dtype=np.int64),
    )  # fmt: skip
    window = WindowResult(600 * MS, 1100 * MS, 0, 0, 0, 0.0, 0.0)
    figures = session_figures(sessions, [window])
    assert (figures.count, figures.ok_count, figures.throughput_per_s) == (2, 1, 2.0)
    assert figures.turns.mean == 1.5 and figures.latency_ms.count == 1 and figures.latency_ms.p50 == 600.0
    level = dataclasses.replace(make_level(1, [10.0, 10.0, 10.0]), sessions=figures)
    sweep = make_sweep([level])
    assert sweep_from_json(sweep_to_json(sweep)).levels[0].sessions == figures
    title, _, row = render_summary_table([level])
    assert "sessions/s  turns  session p50 ms" in title and "2.00    1.5          600.00" in row
    tidy = next(csv.DictReader(io.StringIO(render_tidy_csv(sweep))))
    assert (tidy["session_count"], tidy["session_p50_ms"], tidy["session_turns_mean"]) == ("2", "600", "1.5")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--conversation-turn-mean", "3"],
            "--conversation-num/--conversation-turn-* needs a generative --endpoint-type",
        ),
        (["--endpoint-type", "embeddings", "-u", "h:1", "--num-sessions", "2"], "embeddings have no answer to carry"),
        (["--endpoint-type", "chat", "--session-turns-mean", "0"], "--conversation-turn-mean must be >= 1"),
        (["--endpoint-type", "chat", "--session-delay-ratio", "-1"], "must not be negative"),
        (["--endpoint-type", "chat", "--session-turns-mean", "2", "--sequence-length", "3"], "drop the sequence flags"),
        (["--endpoint-type", "chat", "--session-turns-mean", "2", "--trace-file", "TRACE"], "--trace-file replays"),
    ],
)
def test_session_flags_in_the_wrong_place_exit_2_naming_the_fix(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 4, "output_length": 2}\n')
    flags = [str(trace) if f == "TRACE" else f for f in flags]
    assert main(["sweep", *flags, "--report-dir", str(tmp_path), "--quiet"]) == ExitCode.USAGE
    assert message in capsys.readouterr().err
