"""What the scheduler (`scheduler.Scheduler`) keeps per request and per model instance; the
decoupled-stream path (`streaming`) works on the same records."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from reference_server.scheduling.execute import BatchItem, ModelInstance, RequestsInstance, ResponseSink, Tensors
from reference_server.scheduling.stats import ModelStats

__all__ = ["Batch", "QueuedRequest", "Slot", "record_failure"]


class QueuedRequest:
    """One request from its admission to its answer."""

    __slots__ = (
        "inputs",
        "output_names",
        "batch_size",
        "key",
        "future",
        "received_ns",
        "enqueued_ns",
        "deadline_ns",
        "queued",
        "request_id",
        "parameters",
        "sink",
        "secondary_stats",
        "done",
        "final_sent",
    )

    def __init__(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        batch_size: int,
        key: object,
        future: asyncio.Future[Tensors],
        received_ns: int,
        enqueued_ns: int,
        deadline_ns: int,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        sink: ResponseSink | None = None,
        secondary_stats: ModelStats | None = None,
        done: Callable[[Tensors | Exception], None] | None = None,
    ) -> None:
        self.inputs = inputs
        self.output_names = output_names
        self.batch_size = batch_size
        self.key = key
        self.future = future
        self.received_ns = received_ns
        self.enqueued_ns = enqueued_ns
        self.deadline_ns = deadline_ns  # perf_counter_ns; 0 = none
        self.queued = True  # False once dispatched, expired, withdrawn or failed by close()
        self.request_id = request_id
        self.parameters = parameters if parameters is not None else {}
        self.sink = sink
        self.secondary_stats = secondary_stats
        # Told the outputs or the error as the future is (`Scheduler.submit`), at once, not a loop pass later.
        self.done = done
        # A decoupled request whose final response went out (`streaming.stream_responses`): answered,
        # whatever its batch does after (`answers.Answers.resolve`).
        self.final_sent = False


# A dispatched batch: its preserve_ordering number and its requests.
Batch = tuple[int, "list[QueuedRequest]"]


class Slot:
    """One instance, its worker thread, and the batches handed to it that have not finished."""

    __slots__ = ("instance", "inbox", "thread", "running", "start")

    def __init__(self, instance: ModelInstance | RequestsInstance) -> None:
        self.instance = instance
        self.inbox: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.running: deque[Batch] = deque()
        # An instance that starts batches from the loop and answers there needs no worker thread.
        self.start: Callable[[Sequence[BatchItem], Callable[[Any], None]], None] | None = getattr(
            instance, "start_requests", None
        )


def record_failure(stats: ModelStats, secondary: ModelStats | None, request_ns: int, reason: str) -> None:
    stats.record_failure(request_ns, reason)
    if secondary is not None:
        secondary.record_failure(request_ns, reason)
