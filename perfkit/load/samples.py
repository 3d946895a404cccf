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
        return SampleArrays(**columns, error_names=names)


_COLUMNS = ("intended_ns", "sent_ns", "done_ns", "error_kind", "bytes_out", "bytes_in", "send_ns", "recv_ns")


@dataclass(frozen=True, slots=True)
class SequenceArrays:
    """Finished sequences of a sequence model's load (`perfkit.load.sequences`): each one's first
    send, the answer to its last request, whether all its requests succeeded, its request count."""

    first_sent_ns: I64
    done_ns: I64
    ok: npt.NDArray[np.bool_]
    requests: I64

    def __len__(self) -> int:
        return len(self.done_ns)


class SampleBuffer:
    """Append-only store of samples for one run; the load generator is its only writer."""

    __slots__ = ("_columns", "_error_index", "_error_names", "_sequences")

    def __init__(self) -> None:
        self._columns: tuple[list[int], ...] = tuple([] for _ in _COLUMNS)
        self._sequences: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
        self._error_names: list[str] = [""]
        self._error_index: dict[str, int] = {"": 0}

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
    ) -> None:
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

    def record_sequence(self, first_sent_ns: int, done_ns: int, ok: bool, requests: int) -> None:
        """A sequence whose last request was answered (sequence models only)."""
        c = self._sequences
        c[0].append(first_sent_ns)
        c[1].append(done_ns)
        c[2].append(ok)
        c[3].append(requests)

    def sequences(self) -> SequenceArrays:
        """Every finished sequence recorded so far (select a level's by time)."""
        first, done, ok, requests = self._sequences
        return SequenceArrays(
            np.asarray(first, dtype=np.int64), np.asarray(done, dtype=np.int64),
            np.asarray(ok, dtype=np.bool_), np.asarray(requests, dtype=np.int64),
        )  # fmt: skip

    def add(self, sample: Sample) -> None:
        self.record(
            sample.intended_ns, sample.sent_ns, sample.done_ns, sample.error,
            sample.bytes_out, sample.bytes_in, sample.send_ns, sample.recv_ns,
        )  # fmt: skip

    def arrays(self, start: int = 0) -> SampleArrays:
        """Samples recorded from index `start` on, as numpy columns (a copy)."""
        columns = {f: np.asarray(col[start:], dtype=np.int64) for f, col in zip(_COLUMNS, self._columns)}
        return SampleArrays(**columns, error_names=tuple(self._error_names))
