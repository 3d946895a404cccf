"""Raw per-request records, kept columnar so that recording one costs a few list appends.

Every statistic perfkit reports is computed later from these records: a request belongs to the
window in which it *completed* (perf_analyzer's rule), and all times are on one monotonic clock
(`time.perf_counter_ns` in real runs, a fake clock in tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

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
    error_names: tuple[str, ...]
    tokens: I64 | None = None  # shape (n, len(TOKEN_COLUMNS)); None when no request had a token record

    def __len__(self) -> int:
        return len(self.done_ns)

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        ok: npt.NDArray[np.bool_] = self.error_kind == 0
        return ok

    def select(self, mask: npt.NDArray[np.bool_]) -> SampleArrays:
        return SampleArrays(
            self.intended_ns[mask], self.sent_ns[mask], self.done_ns[mask], self.error_kind[mask],
            self.bytes_out[mask], self.bytes_in[mask], self.send_ns[mask], self.recv_ns[mask], self.error_names,
            None if self.tokens is None else self.tokens[mask],
        )  # fmt: skip

    def completed_between(self, start_ns: int, end_ns: int) -> SampleArrays:
        """Requests whose completion lies in [start_ns, end_ns)."""
        return self.select((self.done_ns >= start_ns) & (self.done_ns < end_ns))

    def error_counts(self) -> dict[str, int]:
        kinds, counts = np.unique(self.error_kind[self.error_kind != 0], return_counts=True)
        return {self.error_names[int(k)]: int(c) for k, c in zip(kinds, counts)}

    def samples(self) -> list[Sample]:
        return [
            Sample(int(i), int(s), int(d), self.error_names[int(e)], int(bo), int(bi), int(sn), int(rn))
            for i, s, d, e, bo, bi, sn, rn in zip(
                self.intended_ns,
                self.sent_ns,
                self.done_ns,
                self.error_kind,
                self.bytes_out,
                self.bytes_in,
                self.send_ns,
                self.recv_ns,
            )  # fmt: skip
        ]

    @staticmethod
    def concat(parts: list[SampleArrays]) -> SampleArrays:
        if not parts:
            return SampleBuffer().arrays()
        names = parts[0].error_names
        for part in parts[1:]:
            if part.error_names[: len(names)] != names[: len(part.error_names)]:
                raise ValueError("sample sets from different buffers cannot be concatenated")
            names = max(names, part.error_names, key=len)
        columns = {f: np.concatenate([getattr(p, f) for p in parts]) for f in _COLUMNS}
        tokens = None
        if any(p.tokens is not None for p in parts):
            tokens = np.concatenate([_token_rows(p) for p in parts])
        return SampleArrays(**columns, error_names=names, tokens=tokens)


def _token_rows(part: SampleArrays) -> I64:
    if part.tokens is not None:
        return part.tokens
    return np.tile(np.asarray(NO_TOKENS, dtype=np.int64), (len(part), 1))


_COLUMNS = ("intended_ns", "sent_ns", "done_ns", "error_kind", "bytes_out", "bytes_in", "send_ns", "recv_ns")


class SampleBuffer:
    """Append-only store of samples for one run; the load generator is its only writer."""

    __slots__ = ("_columns", "_error_index", "_error_names", "_has_tokens", "_tokens")

    def __init__(self) -> None:
        self._columns: tuple[list[int], ...] = tuple([] for _ in _COLUMNS)
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
        *tokens: int,
    ) -> None:
        """`tokens`: a generative request's token record (TOKEN_COLUMNS), or nothing."""
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
        if tokens:
            self._has_tokens = True
            self._tokens.append(tokens)
        else:
            self._tokens.append(NO_TOKENS)

    def add(self, sample: Sample) -> None:
        self.record(
            sample.intended_ns, sample.sent_ns, sample.done_ns, sample.error,
            sample.bytes_out, sample.bytes_in, sample.send_ns, sample.recv_ns,
        )  # fmt: skip

    def arrays(self, start: int = 0) -> SampleArrays:
        """Samples recorded from index `start` on, as numpy columns (a copy)."""
        columns = {f: np.asarray(col[start:], dtype=np.int64) for f, col in zip(_COLUMNS, self._columns)}
        tokens = None
        if self._has_tokens:
            tokens = np.asarray(self._tokens[start:], dtype=np.int64).reshape(-1, len(TOKEN_COLUMNS))
        return SampleArrays(**columns, error_names=tuple(self._error_names), tokens=tokens)
