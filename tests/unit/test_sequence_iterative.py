"""Iterative sequences in the sequence batcher (core's IterativeSequencer), against a fake instance:
a request without an id gets one of its own and STARTs, a `Rescheduled` answer runs the same
request again on its slot without START or END, and each request ends its sequence."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import InvalidArgument
from reference_server.scheduling.execute import BatchItem, RequestsOutcome, Rescheduled, Tensors
from reference_server.scheduling.sequence.batcher import make_scheduler
from reference_server.scheduling.stats import ModelStats


def config(iterative: bool) -> mc.ModelConfig:
    flag = "iterative_sequence: true" if iterative else ""
    return text_format.Parse(f'name: "it" max_batch_size: 0\nsequence_batching {{ {flag} }}', mc.ModelConfig())


class Rescheduler:
    """Reschedules each request (by its IN value) `again` times, then answers OUT = IN; keeps the
    (sequence id, start, end) of every run."""

    runs_on_loop = True
    name = "it_0"

    def __init__(self, again: int) -> None:
        self.again = again
        self.runs: list[tuple[Any, bool, bool]] = []
        self.left: dict[float, int] = {}

    def run(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        raise AssertionError("run_requests only")

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        t = perf_counter_ns()
        results: list[Tensors | Exception] = []
        for request in batch:
            p = request.parameters
            self.runs.append((p["sequence_id"], p["sequence_start"], p["sequence_end"]))
            key = float(request.inputs["IN"][0])
            left = self.left.setdefault(key, self.again)
            self.left[key] = left - 1
            results.append(Rescheduled() if left else {"OUT": request.inputs["IN"]})
        return results, t, t


def test_a_request_without_an_id_is_a_sequence_of_its_own_run_until_released() -> None:
    async def scenario() -> tuple[list[float], list[tuple[Any, bool, bool]]]:
        instance = Rescheduler(again=2)
        scheduler = make_scheduler(config(iterative=True), [instance], ModelStats())
        outs = []
        for value in (5.0, 6.0):
            out = await scheduler.infer({"IN": np.array([value], dtype=np.float32)}, ["OUT"], parameters={})
            outs.append(float(out["OUT"][0]))
        await scheduler.close(1.0)
        return outs, instance.runs

    outs, runs = asyncio.run(scenario())
    assert outs == [5.0, 6.0]
    # Ids from 1, START on the first run only, never END (core's RescheduleRequest sets flags 0).
    assert runs == [(1, True, False), (1, False, False), (1, False, False)] + [
        (2, True, False), (2, False, False), (2, False, False)
    ]  # fmt: skip


def test_each_request_ends_its_iterative_sequence() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(config(iterative=True), [Rescheduler(again=0)], ModelStats())
        tensor = {"IN": np.array([1.0], dtype=np.float32)}
        await scheduler.infer(tensor, [], parameters={"sequence_id": 9, "sequence_start": True})
        with pytest.raises(InvalidArgument, match="must specify the START flag"):
            await scheduler.infer(tensor, [], parameters={"sequence_id": 9})
        await scheduler.close(1.0)

    asyncio.run(scenario())


def test_a_sequence_model_that_is_not_iterative_still_wants_an_id() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(config(iterative=False), [Rescheduler(again=0)], ModelStats())
        with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty correlation ID"):
            await scheduler.infer({"IN": np.array([1.0], dtype=np.float32)}, [], parameters={})
        await scheduler.close(1.0)

    asyncio.run(scenario())


def test_a_request_that_ends_its_sequence_cannot_be_rescheduled() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(config(iterative=True), [Rescheduler(again=1)], ModelStats())
        tensor = {"IN": np.array([1.0], dtype=np.float32)}
        ends = {"sequence_id": 7, "sequence_start": True, "sequence_end": True}
        with pytest.raises(InvalidArgument, match="while the model is not configured to handle such a flag"):
            await scheduler.infer(tensor, [], parameters=ends)
        await scheduler.close(1.0)

    asyncio.run(scenario())
