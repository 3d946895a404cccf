"""Sequence models: which sequence each request belongs to, with perf_analyzer's rules.

A model with `sequence_batching` keeps state per sequence: every request carries a correlation id
and the START / END flags (HTTP parameters `sequence_id`, `sequence_start`, `sequence_end`; the
same names in the gRPC request's parameters, as tritonclient sends them). perf_analyzer
(src/sequence_manager.cc, concurrency_worker.cc, request_rate_worker.cc) decides them so:

- *Slots.* Concurrency N runs N sequence slots, each with one request outstanding at a time: a
  closed loop whose every worker walks its own sequences. Request-rate mode keeps
  `--num-of-sequences` slots (default 4) live; each scheduled send goes to a slot drawn at random
  (`RandCtxIdTracker`), without waiting for that sequence's previous answer, unless
  `--serial-sequences`, where a slot with a request in flight is not drawn and a send waits for a
  free slot (`FifoCtxIdTracker`; the send is then late, which the delayed share shows).
- *Ids.* A new sequence takes `next % range + start` (`--sequence-id-range START:END`, END
  excluded; default start 1, range 2^32 - 1); an id still used by another live slot is not taken
  twice: the slot keeps its previous id instead (`GetNextSeqId`).
- *Lengths.* `--sequence-length` L (default 20) varied uniformly by up to ±`--sequence-length-variation`
  percent (default 20), truncated towards zero, at least 1 (`GetRandomSequenceLength`). With
  `--input-data` streams and no `--sequence-length`, a sequence is as long as its stream; each new
  sequence takes a stream drawn at random, and step k of a sequence sends the stream's step
  k % stream length (`UpdateSeqJsonData`).
- *Flags.* The first request of a sequence has START, its last END (both for a length of 1).
- *Ends of a level.* When a level stops, every sequence still open gets one more request carrying
  END (`CompleteOngoingSequences`), so the server frees its slots before the next level.

Where perf_analyzer draws from an unseeded `rand()`, perfkit draws from `--seed`.

The per-sequence latency is from a sequence's first send to the answer of its last request; a
sequence counts as failed when any of its requests failed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.wire.prepared import MAX_SEQUENCE_ID

__all__ = [
    "DEFAULT_ID_RANGE",
    "LiveSequence",
    "SequenceLoad",
    "SequenceManager",
    "SequenceSpec",
    "parse_id_range",
]

DEFAULT_ID_RANGE = 2**32 - 1  # perf_analyzer's sequence_id_range default (UINT32_MAX)


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """The sequence flags. `enabled` once any of them is given (or the data holds streams)."""

    enabled: bool = False
    length: int = 20
    length_specified: bool = False
    length_variation_pct: float = 20.0
    start_id: int = 1
    id_range: int = DEFAULT_ID_RANGE
    num_of_sequences: int = 4
    serial: bool = False

    def validate(self) -> None:
        if self.length < 1:
            raise PerfkitError(f"--sequence-length must be at least 1, got {self.length}")
        if self.length_variation_pct < 0:
            raise PerfkitError(f"--sequence-length-variation must be >= 0 (percent), got {self.length_variation_pct:g}")
        if self.start_id < 1:
            raise PerfkitError(f"--start-sequence-id must be at least 1 (0 means 'no sequence'), got {self.start_id}")
        if self.id_range < 1:
            raise PerfkitError("--sequence-id-range START:END must have END > START")
        if self.start_id + self.id_range - 1 > MAX_SEQUENCE_ID:
            raise PerfkitError(f"--sequence-id-range: ids go up to {MAX_SEQUENCE_ID} (int64); lower START or END")
        if self.num_of_sequences < 1:
            raise PerfkitError(f"--num-of-sequences must be at least 1, got {self.num_of_sequences}")

    def check_slots(self, slots: int, flag: str) -> None:
        """perf_analyzer's refusal: more live sequences than ids would reuse an id still in use."""
        if self.id_range < slots:
            raise PerfkitError(
                f"--sequence-id-range holds {self.id_range} ids, fewer than the {slots} sequences {flag} keeps "
                "live: ids would collide; widen the range or lower the load"
            )


def parse_id_range(text: str) -> tuple[int, int]:
    """`--sequence-id-range START[:END]` → (start, range); END is excluded, absent: 2^32 - 1 ids (perf_analyzer's default range)."""
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not 1 <= len(values) <= 2 or len(values) != len(parts):
        raise PerfkitError(f"--sequence-id-range '{text}' must look like START:END (END excluded) or START")
    start = values[0]
    if start < 1 or (len(values) == 2 and values[1] <= start):
        raise PerfkitError(f"--sequence-id-range '{text}': want 1 <= START < END")
    return start, (values[1] - start if len(values) == 2 else DEFAULT_ID_RANGE)


@dataclass(slots=True)
class LiveSequence:
    """One sequence as it runs: what its slot sends next, and what its per-sequence record needs."""

    sequence_id: int
    stream: int
    length: int
    remaining: int
    first_sent_ns: int = -1
    last_done_ns: int = 0
    sent: int = 0
    outstanding: int = 0
    failed: bool = False
    context: Any = None  # what the load keeps of this sequence between steps (a session's history)


class SequenceManager:
    """Ids, lengths and streams of the sequences of a load (module docstring), slot by slot."""

    def __init__(
        self, spec: SequenceSpec, stream_lengths: Sequence[int], seed: int = 0, *, from_data: bool = False
    ) -> None:
        """`stream_lengths`: the steps of each `--input-data` stream (`from_data`), else [1]."""
        if not stream_lengths or min(stream_lengths) < 1:
            raise ValueError("every stream needs at least one step")
        self.spec = spec
        self.stream_lengths = list(stream_lengths)
        self._lengths_from_data = from_data and not spec.length_specified
        self._rng = random.Random(seed)
        self._next_id = 0
        self.slots: list[LiveSequence | None] = []

    def reset(self, slots: int) -> None:
        """A new level: `slots` slots, none with a live sequence (ids go on where they were)."""
        self.slots = [None] * slots

    def _length(self) -> int:
        spec = self.spec
        offset = int(self._rng.uniform(-1.0, 1.0) * spec.length_variation_pct / 100.0 * spec.length)
        return max(spec.length + offset, 1)

    def _new_id(self, previous: int) -> int:
        candidate = self._next_id % self.spec.id_range + self.spec.start_id
        self._next_id += 1
        if any(s is not None and s.sequence_id == candidate for s in self.slots):
            return previous
        return candidate

    def begin(self, slot: int) -> LiveSequence:
        old = self.slots[slot]
        stream = self._rng.randrange(len(self.stream_lengths)) if len(self.stream_lengths) > 1 else 0
        length = self.stream_lengths[stream] if self._lengths_from_data else self._length()
        live = LiveSequence(self._new_id(old.sequence_id if old is not None else 0), stream, length, length)
        self.slots[slot] = live
        return live

    def next_step(self, slot: int, *, last: bool = False) -> tuple[LiveSequence, int, bool, bool]:
        """The slot's next request: (its sequence, the stream step, START, END). With `last` the
        request ends the sequence whatever its length (a level's end)."""
        live = self.slots[slot]
        if live is None or live.remaining == 0:
            live = self.begin(slot)
        step = live.sent % self.stream_lengths[live.stream]
        if last:
            live.remaining = 1
        live.remaining -= 1
        live.sent += 1
        return live, step, live.sent == 1, live.remaining == 0

    def open_slots(self) -> list[int]:
        """Slots whose sequence has not sent its END yet."""
        return [i for i, s in enumerate(self.slots) if s is not None and s.remaining > 0]


# (stream, step, sequence id, start, end) -> a request encoded for the client
PrepareStep = Callable[[int, int, int, bool, bool], Any]
RecordSequence = Callable[[int, int, bool, int], None]


class SequenceLoad:
    """What the load generator asks in sequence mode: the next request of a slot, and the
    bookkeeping of its answer. `prepare` encodes one step of one stream with its sequence fields.

    A `chained` load (generative sessions, `perfkit.genai.sessions`) sends a sequence's next step
    only once the previous one is answered, `think_ns` later; in an open loop its schedule starts
    sequences, each on a slot of its own (`take_slot`), and no END is owed at a level's end."""

    chained = False

    def __init__(self, spec: SequenceSpec, manager: SequenceManager, prepare: PrepareStep, seed: int = 0) -> None:
        self.spec = spec
        self.manager = manager
        self._prepare = prepare
        self._draw = random.Random(seed + 1)  # which slot an open-loop send goes to
        self._free: list[int] = []  # serial request-rate mode: slots with nothing in flight, FIFO

    @property
    def serial(self) -> bool:
        return self.spec.serial

    def begin_level(self, slots: int) -> None:
        self.manager.reset(slots)
        self._free = list(range(slots))

    def send(self, slot: int, sent_ns: int, *, last: bool = False) -> tuple[Any, LiveSequence]:
        live, step, start, end = self.manager.next_step(slot, last=last)
        if live.first_sent_ns < 0:
            live.first_sent_ns = sent_ns
        live.outstanding += 1
        return self._prepare(live.stream, step, live.sequence_id, start, end), live

    def answered(self, live: LiveSequence, done_ns: int, ok: bool, record: RecordSequence, answer: str = "") -> None:
        """A request of `live` came back (`answer`: its text, for a load that carries it on); once
        its END is answered and nothing of it is in flight, the sequence is recorded: (first send,
        last answer, ok, length)."""
        live.outstanding -= 1
        live.last_done_ns = max(live.last_done_ns, done_ns)
        live.failed = live.failed or not ok
        if live.remaining == 0 and live.outstanding == 0:
            record(live.first_sent_ns, live.last_done_ns, not live.failed, live.sent)

    def think_ns(self, live: LiveSequence) -> int:
        """A chained load: how long after an answer the sequence's next step is sent."""
        return 0

    def take_slot(self) -> int:
        """A chained open loop: a slot for a new sequence, a free one or a new one."""
        if self._free:
            return self._free.pop()
        self.manager.slots.append(None)
        return len(self.manager.slots) - 1

    def release_slot(self, slot: int) -> None:
        self.manager.slots[slot] = None
        self._free.append(slot)

    def draw_slot(self) -> int:
        """Request-rate mode: the slot a send goes to, drawn at random (RandCtxIdTracker)."""
        return self._draw.randrange(len(self.manager.slots))

    # --- serial request-rate mode: slot hand-out ---

    def take_free(self) -> int | None:
        return self._free.pop(0) if self._free else None

    def release(self, slot: int) -> None:
        self._free.append(slot)
