"""Multi-turn sessions: conversations whose every turn carries the history of the turns before it.

A session is one conversation between a user and the model (AIPerf's "conversation", its flags'
names): turn k sends the history, the user prompts and the assistant answers *as received* in
turns 1..k-1, then its own user prompt. For `chat` the history is the message list (user and
assistant messages in order); for `completions` and `kserve-generate` it is their texts joined by
newlines, then the new prompt. A turn's input tokens are counted over all of it (chat: each
message's content; otherwise the joined text), so they grow turn over turn by the previous
prompt and its answer. Every request of a session carries the same `X-Correlation-ID` header
(AIPerf's session-affinity header), `<session id>-<n>`, n counting the sessions of the run.

*Where conversations come from.* Synthetic: `--conversation-num` conversations, each with a turn
count drawn from a normal distribution (`--conversation-turn-mean`, `-stddev`), rounded and
floored at 1; each turn takes the next prompt of the run's prompt pool (`--num-prompts`,
cycled) and a think time before it drawn from another (`--conversation-turn-delay-mean`,
`-stddev`, floored at 0, times `--conversation-turn-delay-ratio`), all from `--seed`. Or
`--input-file` in AIPerf's multi_turn JSONL: `{"session_id": "s1", "turns": [{"text": "Hi",
"delay": 0}, {"text": "More", "delay": 1000}]}`, a turn's `delay` (ms) its think time and its
`output_length` its max_tokens; lines with the same session_id are one conversation, in order (a
line without one is a conversation of its own).
The first turn's delay is not waited: when a session starts is the load's to decide.

*How they run* (`SessionLoad`, on `perfkit.load.sequences`' slots, as a sequence model's
sequences): turns of a session are strictly serial, the next sent its think time after the
previous answer; each new session takes a conversation drawn at random (from `--seed`). In
concurrency mode each of N slots runs one session after another (N users); in request-rate mode
the schedule starts sessions and each later turn follows its predecessor's answer. A session
whose turn fails ends there (it has no answer to carry), counted as failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfkit.errors import PerfkitError
from perfkit.genai.tokenizer import Tokenizer
from perfkit.genai.workload import Prompt, SessionSpec, WorkloadSpec, draw_lengths
from perfkit.load.sequences import LiveSequence, RecordSequence, SequenceLoad, SequenceManager, SequenceSpec

__all__ = [
    "SESSION_HEADER",
    "Conversation",
    "History",
    "SessionLoad",
    "Turn",
    "chat_messages",
    "history_text",
    "is_multi_turn",
    "read_multi_turn",
    "synthetic_conversations",
]

#: AIPerf's default session-affinity header.
SESSION_HEADER = "X-Correlation-ID"
#: What each (user prompt, assistant answer) of a session's history is.
History = Sequence[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Turn:
    prompt: Prompt  # the new user prompt; its input_tokens count it alone
    delay_ms: float = 0.0  # think time after the previous turn's answer


@dataclass(frozen=True, slots=True)
class Conversation:
    session_id: str
    turns: tuple[Turn, ...]


def chat_messages(history: History, text: str) -> list[dict[str, str]]:
    """A chat turn's messages: the history's user and assistant messages, then the new prompt."""
    messages: list[dict[str, str]] = []
    for user, answer in history:
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": text})
    return messages


def history_text(history: History, text: str) -> str:
    """A completions or generate turn's prompt: the history's texts and the new prompt, one per line."""
    return "\n".join([*(part for pair in history for part in pair), text])


def synthetic_conversations(spec: SessionSpec, prompts: Sequence[Prompt], seed: int) -> list[Conversation]:
    """`spec.count` conversations on the prompt pool (cycled), turn counts and think times from `seed`."""
    if not prompts:
        raise ValueError("conversations need at least one prompt")
    rng = np.random.default_rng([seed, 0x5E55])
    counts = draw_lengths(rng, spec.turns_mean, spec.turns_stddev, spec.count)
    conversations = []
    position = 0
    for number, turns in enumerate(counts):
        delays = [0.0, *_delays(rng, spec, turns - 1)]
        chosen = [Turn(prompts[(position + k) % len(prompts)], delays[k]) for k in range(turns)]
        position += turns
        conversations.append(Conversation(f"session_{number}", tuple(chosen)))
    return conversations


def _delays(rng: np.random.Generator, spec: SessionSpec, count: int) -> list[float]:
    if count <= 0:
        return []
    drawn = rng.normal(spec.delay_mean_ms, spec.delay_stddev_ms, count) if spec.delay_stddev_ms > 0 else None
    values = drawn.tolist() if drawn is not None else [spec.delay_mean_ms] * count
    return [max(0.0, float(v)) * spec.delay_ratio for v in values]


def _records(path: Path) -> list[tuple[int, Any]]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"--input-file {path}: cannot read it ({exc})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError:
            records.append((number, None))
    return records


def is_multi_turn(path: Path) -> bool:
    """Whether `--input-file` is in AIPerf's multi_turn format: its first record has `turns`."""
    records = _records(path)
    return bool(records) and isinstance(records[0][1], dict) and "turns" in records[0][1]


def _turn(where: str, value: Any, tokenizer: Tokenizer, output: int) -> Turn:
    if not isinstance(value, dict):
        raise PerfkitError(f"{where}: a turn is a JSON object with a text")
    text = value.get("text")
    texts = value.get("texts")
    if text is None and isinstance(texts, list) and all(isinstance(t, str) for t in texts):
        text = "\n".join(texts)
    if not isinstance(text, str) or not text:
        raise PerfkitError(f'{where}: a turn needs a "text" string (or "texts", a list of strings); '
                           "only text turns are sent")  # fmt: skip
    if "timestamp" in value:
        raise PerfkitError(f'{where}: "timestamp" schedules are not supported; give each turn a "delay" in ms')
    delay = value.get("delay") or 0
    length = value.get("output_length")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise PerfkitError(f'{where}: "delay" is the think time in ms before this turn, a number >= 0')
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise PerfkitError(f'{where}: "output_length" is the max_tokens to ask for, an integer >= 1')
    return Turn(Prompt(text, tokenizer.count(text), output if length is None else length), float(delay))


def read_multi_turn(path: Path, tokenizer: Tokenizer, workload: WorkloadSpec) -> list[Conversation]:
    """The conversations of a multi_turn JSONL file (module docstring); a turn without
    `output_length` asks for one drawn from --output-tokens-mean/-stddev."""
    records = _records(path)
    outputs = iter(draw_lengths(np.random.default_rng(workload.seed), workload.output_tokens_mean,
                                workload.output_tokens_stddev, sum(_turn_count(r) for _, r in records)))  # fmt: skip
    sessions: dict[str, list[Turn]] = {}
    for number, record in records:
        where = f"--input-file {path}:{number}"
        if not isinstance(record, dict) or not isinstance(record.get("turns"), list) or not record["turns"]:
            raise PerfkitError(f'{where}: a multi_turn line is a JSON object with "turns", a non-empty list')
        session_id = record.get("session_id", f"line_{number}")  # a line without one is a session of its own
        if not isinstance(session_id, str):
            raise PerfkitError(f'{where}: "session_id" must be a string')
        sessions.setdefault(session_id, []).extend(
            _turn(f"{where} turn {k + 1}", value, tokenizer, next(outputs)) for k, value in enumerate(record["turns"])
        )
    if not sessions:
        raise PerfkitError(f"--input-file {path}: no sessions in it")
    return [Conversation(session_id, tuple(turns)) for session_id, turns in sessions.items()]


def _turn_count(record: Any) -> int:
    turns = record.get("turns") if isinstance(record, dict) else None
    return len(turns) if isinstance(turns, list) else 0


# (the turn's prompt, the session's history so far, the session's correlation id) -> a request
PrepareTurn = Callable[[Prompt, History, str], Any]


class SessionLoad(SequenceLoad):
    """Sessions run on the sequence slots (module docstring): a live sequence is a session, its
    steps the conversation's turns, and its `context` the history received so far."""

    chained = True

    def __init__(self, conversations: Sequence[Conversation], prepare: PrepareTurn, seed: int = 0) -> None:
        if not conversations:
            raise ValueError("a session load needs at least one conversation")
        spec = SequenceSpec(enabled=True, length_specified=False)
        manager = SequenceManager(spec, [len(c.turns) for c in conversations], seed, from_data=True)
        super().__init__(spec, manager, _no_step, seed)
        self.conversations = list(conversations)
        self._prepare_turn = prepare

    def send(self, slot: int, sent_ns: int, *, last: bool = False) -> tuple[Any, LiveSequence]:
        live, step, start, _ = self.manager.next_step(slot)
        if start:
            live.context = []
        if live.first_sent_ns < 0:
            live.first_sent_ns = sent_ns
        live.outstanding += 1
        conversation = self.conversations[live.stream]
        correlation = f"{conversation.session_id}-{live.sequence_id}"
        return self._prepare_turn(conversation.turns[step].prompt, live.context, correlation), live

    def answered(self, live: LiveSequence, done_ns: int, ok: bool, record: RecordSequence, answer: str = "") -> None:
        if ok:
            prompt = self.conversations[live.stream].turns[live.sent - 1].prompt
            live.context.append((prompt.text, answer))
        else:
            live.remaining = 0  # no answer to carry: the session ends here, failed
        super().answered(live, done_ns, ok, record, answer)

    def think_ns(self, live: LiveSequence) -> int:
        turns = self.conversations[live.stream].turns
        return int(turns[live.sent].delay_ms * 1e6) if live.remaining > 0 and live.sent < len(turns) else 0


def _no_step(stream: int, step: int, sequence_id: int, start: bool, end: bool) -> Any:
    raise AssertionError("a session's turns are prepared by SessionLoad.send")
