"""Raw per-request records, kept columnar so that recording one costs a few list appends.

Every statistic perfkit reports is computed later from these records: a request belongs to the
window in which it *completed* (perf_analyzer's rule), and all times are on one monotonic clock
(`time.perf_counter_ns` in real runs, a fake clock in tests).

A streamed request (`--streaming`) is recorded with every response it got: `first_ns` (the first
response's arrival), `responses` (how many carried outputs; -1 for a request that was not streamed)
and the gaps between consecutive responses, kept in one flat column (`gaps_ns`) in the order of
the requests, `max(responses - 1, 0)` of them each. Its `done_ns` is its last response, as
perf_analyzer's: a final flag that came alone, after it, is not a response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from v2kit.compiled import by_constructor

# Explicitly an alias: should numpy be absent from pip's build environment, its types read as Any,
# and an implicit alias of Any is a variable that mypyc refuses as a type.
I64: TypeAlias = npt.NDArray[np.int64]

#: The columns of a generative request's token record (`SampleArrays.tokens`), in order: time to
#: first and second response (ns from the send; -1 when there was none), input and output tokens,
#: and the output tokens asked for (0: none asked).
TOKEN_COLUMNS = ("ttft_ns", "ttst_ns", "tokens_in", "tokens_out", "tokens_asked")
NO_TOKENS = (-1, -1, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Sample:
    """One request. `intended_ns` is when the schedule wanted it sent (== `sent_ns` in closed-loop
    concurrency mode); `error` is "" for success, else the error's kind (e.g. "HTTP 503",
    "grpc UNAVAILABLE", "timeout", "connection")."""

    intended_ns: int
    sent_ns: int
    done_ns: int
    error: str
    bytes_out: int
    bytes_in: int
    send_ns: int = 0  # client time spent handing the request to the transport
    recv_ns: int = 0  # client time spent reading and checking the response
    first_ns: int = 0  # streamed: the first response's arrival (0: none came)
    responses: int = -1  # streamed: responses with outputs; -1: not streamed
    gaps_ns: tuple[int, ...] = ()  # streamed: between consecutive responses
    sequence_id: int = 0  # a sequence model's request: its sequence's id (0: none)

    def __reduce__(self) -> tuple[type[Sample], tuple[Any, ...]]:
        return by_constructor(self)


@dataclass(frozen=True, slots=True)
class SampleArrays:
    """A set of samples as numpy columns; `error_kind` indexes `error_names` (0 is success, "")."""

    intended_ns: I64
    sent_ns: I64
    done_ns: I64
    error_kind: I64
    bytes_out: I64
    bytes_in: I64
    send_ns: I64
    recv_ns: I64
    first_ns: I64
    responses: I64
    gaps_ns: I64  # flat, in request order: max(responses - 1, 0) per request
    error_names: tuple[str, ...]
    tokens: I64 | None = None  # shape (n, len(TOKEN_COLUMNS)); None when no request had a token record
    sequence_id: I64 | None = None  # each request's sequence id (0: none); None: no column at all

    def __reduce__(self) -> tuple[type[SampleArrays], tuple[Any, ...]]:
        return by_constructor(self)

    def __len__(self) -> int:
        return len(self.done_ns)

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        ok: npt.NDArray[np.bool_] = self.error_kind == 0
        return ok

    def gap_counts(self) -> I64:
        counts: I64 = np.maximum(self.responses - 1, 0)
        return counts

    def select(self, mask: npt.NDArray[np.bool_]) -> SampleArrays:
        gaps = self.gaps_ns[np.repeat(mask, self.gap_counts())] if len(self.gaps_ns) else self.gaps_ns
        return SampleArrays(
            self.intended_ns[mask], self.sent_ns[mask], self.done_ns[mask], self.error_kind[mask],
            self.bytes_out[mask], self.bytes_in[mask], self.send_ns[mask], self.recv_ns[mask],
            self.first_ns[mask], self.responses[mask], gaps, self.error_names,
            None if self.tokens is None else self.tokens[mask],
            None if self.sequence_id is None else self.sequence_id[mask],
        )  # fmt: skip

    def completed_between(self, start_ns: int, end_ns: int) -> SampleArrays:
        """Requests whose completion lies in [start_ns, end_ns)."""
        return self.select((self.done_ns >= start_ns) & (self.done_ns < end_ns))

    def error_counts(self) -> dict[str, int]:
        kinds, counts = np.unique(self.error_kind[self.error_kind != 0], return_counts=True)
        return {self.error_names[int(k)]: int(c) for k, c in zip(kinds, counts)}

    def samples(self) -> list[Sample]:
        ends = np.cumsum(self.gap_counts()).tolist()
        gaps = self.gaps_ns.tolist()
        return [
            Sample(int(i), int(s), int(d), self.error_names[int(e)], int(bo), int(bi), int(sn), int(rn), int(f),
                   int(r), tuple(gaps[end - max(int(r) - 1, 0) : end]), int(q))
            for i, s, d, e, bo, bi, sn, rn, f, r, end, q in zip(
                self.intended_ns, self.sent_ns, self.done_ns, self.error_kind, self.bytes_out, self.bytes_in,
                self.send_ns, self.recv_ns, self.first_ns, self.responses, ends, _sequence_ids(self),
            )
        ]  # fmt: skip

    @staticmethod
    def concat(parts: list[SampleArrays]) -> SampleArrays:
        if not parts:
            return SampleBuffer().arrays()
        names = parts[0].error_names
        for part in parts[1:]:
            if part.error_names[: len(names)] != names[: len(part.error_names)]:
                raise ValueError("sample sets from different buffers cannot be concatenated")
            names = max(names, part.error_names, key=len)
        columns = {f: np.concatenate([getattr(p, f) for p in parts]) for f in (*_COLUMNS[:-1], "gaps_ns")}
        columns["sequence_id"] = np.concatenate([_sequence_ids(p) for p in parts])
        tokens = None
        if any(p.tokens is not None for p in parts):
            tokens = np.concatenate([_token_rows(p) for p in parts])
        return SampleArrays(**columns, error_names=names, tokens=tokens)


def _sequence_ids(part: SampleArrays) -> I64:
    return np.zeros(len(part), np.int64) if part.sequence_id is None else part.sequence_id


def _token_rows(part: SampleArrays) -> I64:
    if part.tokens is not None:
        return part.tokens
    return np.tile(np.asarray(NO_TOKENS, dtype=np.int64), (len(part), 1))


_COLUMNS = (
    "intended_ns", "sent_ns", "done_ns", "error_kind", "bytes_out", "bytes_in", "send_ns", "recv_ns",
    "first_ns", "responses", "sequence_id",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SequenceArrays:
    """Finished sequences of a sequence model's load (`perfkit.load.sequences`): each one's first
    send, the answer to its last request, whether all its requests succeeded, its request count."""

    first_sent_ns: I64
    done_ns: I64
    ok: npt.NDArray[np.bool_]
    requests: I64

    def __reduce__(self) -> tuple[type[SequenceArrays], tuple[Any, ...]]:
        return by_constructor(self)

    def __len__(self) -> int:
        return len(self.done_ns)


class SampleBuffer:
    """Append-only store of samples for one run; the load generator is its only writer."""

    __slots__ = (
        "_columns", "_error_index", "_error_names", "_gaps", "_has_tokens", "_sequences", "_sessions", "_tokens",
    )  # fmt: skip

    def __init__(self) -> None:
        self._columns: tuple[list[int], ...] = tuple([] for _ in _COLUMNS)
        self._gaps: list[int] = []
        self._sequences: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
        self._sessions: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
        self._error_names: list[str] = [""]
        self._error_index: dict[str, int] = {"": 0}
        self._tokens: list[tuple[int, ...]] = []
        self._has_tokens = False

    def __len__(self) -> int:
        return len(self._columns[0])

    def record(
        self,
        intended_ns: int,
        sent_ns: int,
        done_ns: int,
        error: str = "",
        bytes_out: int = 0,
        bytes_in: int = 0,
        send_ns: int = 0,
        recv_ns: int = 0,
        first_ns: int = 0,
        responses: int = -1,
        tokens: Sequence[int] = (),
        sequence_id: int = 0,
    ) -> None:
        """`tokens`: a generative request's token record (TOKEN_COLUMNS), or nothing; `sequence_id`:
        a sequence model's request's sequence (0: none)."""
        kind = self._error_index.get(error)
        if kind is None:
            kind = self._error_index[error] = len(self._error_names)
            self._error_names.append(error)
        c = self._columns
        c[0].append(intended_ns)
        c[1].append(sent_ns)
        c[2].append(done_ns)
        c[3].append(kind)
        c[4].append(bytes_out)
        c[5].append(bytes_in)
        c[6].append(send_ns)
        c[7].append(recv_ns)
        c[8].append(first_ns)
        c[9].append(responses)
        c[10].append(sequence_id)
        if tokens:
            self._has_tokens = True
            self._tokens.append(tuple(tokens))
        else:
            self._tokens.append(NO_TOKENS)

    def record_streamed(
        self,
        intended_ns: int,
        sent_ns: int,
        ended_ns: int,
        error: str,
        bytes_out: int,
        bytes_in: int,
        send_ns: int,
        recv_ns: int,
        response_ns: Sequence[int],
    ) -> None:
        """A streamed request, from the arrival of each of its responses (`response_ns`) and when it
        ended (`ended_ns`: its final flag, or its failure); done at its last response if any."""
        if response_ns:
            gaps = self._gaps
            previous = response_ns[0]
            for t in response_ns[1:]:
                gaps.append(t - previous)
                previous = t
            self.record(intended_ns, sent_ns, previous if not error else ended_ns, error, bytes_out, bytes_in,
                        send_ns, recv_ns, response_ns[0], len(response_ns))  # fmt: skip
        else:
            self.record(intended_ns, sent_ns, ended_ns, error, bytes_out, bytes_in, send_ns, recv_ns, 0, 0)

    def record_sequence(self, first_sent_ns: int, done_ns: int, ok: bool, requests: int) -> None:
        """A sequence whose last request was answered (sequence models only)."""
        _append(self._sequences, first_sent_ns, done_ns, ok, requests)

    def record_session(self, first_sent_ns: int, done_ns: int, ok: bool, turns: int) -> None:
        """A generative session whose last turn was answered (or that ended on a failed turn)."""
        _append(self._sessions, first_sent_ns, done_ns, ok, turns)

    def sequences(self) -> SequenceArrays:
        """Every finished sequence recorded so far (select a level's by time)."""
        return _sequence_arrays(self._sequences)

    def sessions(self) -> SequenceArrays:
        """Every finished session recorded so far, `requests` its turns (select a level's by time)."""
        return _sequence_arrays(self._sessions)

    def add(self, sample: Sample) -> None:
        if sample.responses >= 0:
            self._gaps.extend(sample.gaps_ns)
        self.record(
            sample.intended_ns, sample.sent_ns, sample.done_ns, sample.error, sample.bytes_out, sample.bytes_in,
            sample.send_ns, sample.recv_ns, sample.first_ns, sample.responses, sequence_id=sample.sequence_id,
        )  # fmt: skip

    def arrays(self, start: int = 0) -> SampleArrays:
        """Samples recorded from index `start` on, as numpy columns (a copy)."""
        columns = {f: np.asarray(col[start:], dtype=np.int64) for f, col in zip(_COLUMNS, self._columns)}
        responses = self._columns[9]
        skipped = np.asarray(responses[:start], dtype=np.int64) if start and self._gaps else np.zeros(0, np.int64)
        first_gap = int(np.maximum(skipped - 1, 0).sum())
        gaps = np.asarray(self._gaps[first_gap:], dtype=np.int64)
        tokens = None
        if self._has_tokens:
            tokens = np.asarray(self._tokens[start:], dtype=np.int64).reshape(-1, len(TOKEN_COLUMNS))
        return SampleArrays(**columns, gaps_ns=gaps, error_names=tuple(self._error_names), tokens=tokens)


def _append(
    columns: tuple[list[int], list[int], list[int], list[int]], first: int, done: int, ok: bool, n: int
) -> None:
    columns[0].append(first)
    columns[1].append(done)
    columns[2].append(ok)
    columns[3].append(n)


def _sequence_arrays(columns: tuple[list[int], list[int], list[int], list[int]]) -> SequenceArrays:
    first, done, ok, requests = columns
    return SequenceArrays(
        np.asarray(first, dtype=np.int64), np.asarray(done, dtype=np.int64),
        np.asarray(ok, dtype=np.bool_), np.asarray(requests, dtype=np.int64),
    )  # fmt: skip
