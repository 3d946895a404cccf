"""One traced request (`RequestTrace`): its timestamps and tensors, and its JSON in the trace file.

`core/tracing.py` decides which requests are traced and writes the traces; this is what one trace
records on its way through the front end, the data plane and the scheduler (see tracing.py's
docstring for the timestamps and when each is taken).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from reference_server.core.trace_tensors import BACKEND_OUTPUT, tensor_records
from reference_server.scheduling.stats import ModelStats

if TYPE_CHECKING:
    from reference_server.core.tracing import TraceSetting

__all__ = ["OFF", "TENSORS", "TIMESTAMPS", "RequestTrace"]

#: The trace levels, as bits.
OFF, TIMESTAMPS, TENSORS = 0, 1, 2
#: The front ends' timestamps, as Triton's HTTP and gRPC front ends name them.
_HTTP_RECV, _HTTP_SEND = ("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_SEND_START", "HTTP_SEND_END")
_GRPC_RECV, _GRPC_SEND = ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"), ("GRPC_SEND_START", "GRPC_SEND_END")
#: How long a stream's trace waits, after its last response, for the scheduler's record: a decoupled
#: model sends its final flag before its `execute` returns, and the record (the COMPUTE timestamps)
#: comes when it does. A sequence model's stream gets no record, so its trace is written after this.
RECORD_WAIT_S = 1.0


class RequestTrace(ModelStats):
    """The timestamps of one traced request. The scheduler records it as the request's secondary
    statistics (`record_success`, `record_failure`, `record_cache_hit`: durations from the request's
    arrival, from which the timestamps are rebuilt); the data plane adds the front end's."""

    def __init__(self, trace_id: int, setting: TraceSetting, model: str, version: int, request_id: str) -> None:
        super().__init__()
        self.trace_id = trace_id
        self.setting = setting
        self.model = model
        self.version = version
        self.request_id = request_id
        self.events: list[tuple[str, int]] = []
        self.received_ns = 0
        self.responses = 0  # a stream's, so far
        self.sending = False  # a stream's response is with the front end
        self.tensors: list[str] = []  # at level TENSORS (`trace_tensors.py`)
        self.stream_end_ns: int | None = None  # a stream ended before the scheduler's record came
        self.written = False

    def record_tensors(self, activity: str, tensors: Mapping[str, Any]) -> None:
        """`tensors` of the request (`trace_tensors.QUEUE_INPUT`, `BACKEND_OUTPUT`), if its level
        is TENSORS."""
        if self.setting.level & TENSORS:
            self.tensors += tensor_records(activity, tensors)

    def results(self, finished: Callable[[Any], None], results: Any) -> None:
        """A scheduler's callback: the outputs in `results` recorded, then `finished` called."""
        if not isinstance(results, Exception):
            self.record_tensors(BACKEND_OUTPUT, results)
        finished(results)

    def start(self, grpc: bool, received_ns: int, read: tuple[int, int] | None = None) -> None:
        """The request reached the data plane at `received_ns`, decoded, from the gRPC front end or
        (not `grpc`) the HTTP one, which began and ended reading it at `read` (if it knows)."""
        self.received_ns = received_ns
        recv = _GRPC_RECV if grpc else _HTTP_RECV
        begun, ended = read if read is not None else (received_ns, received_ns)
        self.events += ((recv[0], begun), (recv[1], ended))
        self.events += (("REQUEST_START", received_ns), ("QUEUE_START", received_ns))

    def record_success(
        self, request_ns: int, queue_ns: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        at = self.received_ns + queue_ns
        for name, span in (
            ("COMPUTE_START", 0),
            ("COMPUTE_INPUT_END", compute_input_ns),
            ("COMPUTE_OUTPUT_START", compute_infer_ns),
            ("COMPUTE_END", compute_output_ns),
        ):
            at += span
            self.events.append((name, at))
        self.events.append(("REQUEST_END", max(at, self.received_ns + request_ns)))
        if self.stream_end_ns is not None:
            self.finish()

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        self.events.append(("REQUEST_END", self.received_ns + request_ns))

    def record_failure(self, request_ns: int, reason: str) -> None:
        self.events.append(("REQUEST_END", self.received_ns + request_ns))
        if self.stream_end_ns is not None:
            self.finish()

    def answered(self, answer: Callable[[Any], None], grpc: bool, response: Any) -> None:
        """Hand `response` to the front end's `answer`, timed as the front end's send, then write
        the trace."""
        send = _GRPC_SEND if grpc else _HTTP_SEND
        now = perf_counter_ns()
        self.events += (("INFER_RESPONSE_COMPLETE", now), (send[0], now))
        try:
            answer(response)
        finally:
            self.events.append((send[1], perf_counter_ns()))
            self.finish()

    def returned(self, grpc: bool) -> None:
        """The answer went back to a front end that awaited it: its send is timed as it leaves."""
        now = perf_counter_ns()
        send = _GRPC_SEND if grpc else _HTTP_SEND
        self.events += (("INFER_RESPONSE_COMPLETE", now), (send[0], now), (send[1], now))
        self.finish()

    def responded(self, grpc: bool, sending: bool) -> None:
        """The scheduler gave a stream its next response: one the front end sends (`sending`:
        its send starts now), or the final flag alone. Triton's INFER_RESPONSE_COMPLETE marks
        each of them over HTTP, only the first over gRPC."""
        now = perf_counter_ns()
        if not grpc or not self.responses:
            self.events.append(("INFER_RESPONSE_COMPLETE", now))
        self.responses += 1
        if sending:
            self.events.append(((_GRPC_SEND if grpc else _HTTP_SEND)[0], now))
            self.sending = True

    def sent(self, grpc: bool) -> None:
        """The front end took the stream's response last handed to it (`responded`)."""
        self.events.append(((_GRPC_SEND if grpc else _HTTP_SEND)[1], perf_counter_ns()))
        self.sending = False

    def ended(self, grpc: bool) -> None:
        """A stream's responses are over: a send not seen to end ends now, and the trace is
        written once the scheduler's record is in; without one within RECORD_WAIT_S (a sequence
        model's stream), with REQUEST_END now."""
        now = perf_counter_ns()
        if self.sending:
            self.sent(grpc)
        if any(name == "REQUEST_END" for name, _ in self.events):
            self.finish()
            return
        self.stream_end_ns = now
        try:
            asyncio.get_running_loop().call_later(RECORD_WAIT_S, self._end_unrecorded)
        except RuntimeError:  # no loop to wait on: written now
            self._end_unrecorded()

    def _end_unrecorded(self) -> None:
        if self.written or self.stream_end_ns is None:
            return
        self.events.append(("REQUEST_END", self.stream_end_ns))
        self.finish()

    def finish(self) -> None:
        """Hand this trace to its setting, to be written (once)."""
        if self.written:
            return
        self.written = True
        self.setting.finished(self)

    def json(self) -> str:
        """This trace's objects in Triton's JSON, without the array's brackets: at TIMESTAMPS its
        model and request, then its timestamps; at TENSORS its tensors (alone, they come without
        the model and request, as Triton writes them)."""
        objects = []
        if self.setting.level & TIMESTAMPS:
            head: dict[str, Any] = {"id": self.trace_id, "model_name": self.model, "model_version": self.version}
            if self.request_id:
                head["request_id"] = self.request_id
            objects.append(json.dumps(head, separators=(",", ":"), ensure_ascii=False))
            objects += (
                f'{{"id":{self.trace_id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}' for name, ns in self.events
            )
        objects += (f'{{"id":{self.trace_id},{record}' for record in self.tensors)
        return ",".join(objects)
