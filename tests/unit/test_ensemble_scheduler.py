"""The ensemble scheduler on fake composing schedulers: independent steps are in flight together,
tensors pass between steps as the same arrays, a step's failure is the request's, and the
request's id, parameters and timeout reach every step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference_server.core.ensemble import EnsembleScheduler
from reference_server.core.ensemble_config import ensemble_plan
from reference_server.core.model_config import parse_config_text
from reference_server.errors import InternalError
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.stats import ModelStats

CONFIG = """
name: "fork_join"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "left" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "l" } },
  { model_name: "right" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "r" } },
  { model_name: "join" input_map { key: "A" value: "l" } input_map { key: "B" value: "r" }
    output_map { key: "Y" value: "OUT" } }
] }
"""


class FakeScheduler:
    """A composing model: `compute` on its inputs, after `gate` (if any) lets it through."""

    def __init__(self, compute: Callable[[Tensors], np.ndarray], gate: Callable[[], Any] | None = None) -> None:
        self.compute = compute
        self.gate = gate
        self.calls: list[dict[str, Any]] = []

    async def infer(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> Tensors:
        self.calls.append({"inputs": inputs, "id": request_id, "parameters": parameters, "timeout_us": timeout_us})
        if self.gate is not None:
            await self.gate()
        result = self.compute(inputs)
        if secondary_stats is not None:
            secondary_stats.record_success(1000, 10, 1, 100, 2)
        return {"Y": result}

    def infer_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[Tensors | None, bool]]:
        raise NotImplementedError

    async def close(self, grace_s: float) -> None:
        pass


class Served:
    def __init__(self, scheduler: FakeScheduler) -> None:
        self.scheduler = scheduler


def make(models: dict[str, FakeScheduler]) -> tuple[EnsembleScheduler, ModelStats]:
    config = parse_config_text(CONFIG, Path("fork_join/config.pbtxt"))
    stats = ModelStats()
    plan = ensemble_plan(config, Path("fork_join/config.pbtxt"))
    return EnsembleScheduler(plan, 8, stats, lambda name, version: Served(models[name])), stats


def test_independent_steps_are_in_flight_together_and_tensors_are_not_copied() -> None:
    async def main() -> None:
        both_started = asyncio.Barrier(2)  # passes only while left and right wait at once

        async def gate() -> None:
            await both_started.wait()

        left = FakeScheduler(lambda t: t["X"] + 1, gate)
        right = FakeScheduler(lambda t: t["X"] * 2, gate)
        join = FakeScheduler(lambda t: t["A"] + t["B"])
        ensemble, stats = make({"left": left, "right": right, "join": join})
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        out = await asyncio.wait_for(
            ensemble.infer({"IN": x}, [], request_id="r1", parameters={"k": 1}, timeout_us=500), 5
        )
        np.testing.assert_array_equal(out["OUT"], (x + 1) + x * 2)
        # The request's own array reaches both first steps, unchanged and uncopied.
        assert left.calls[0]["inputs"]["X"] is x and right.calls[0]["inputs"]["X"] is x
        for model in (left, right, join):
            assert model.calls[0]["id"] == "r1" and model.calls[0]["parameters"] == {"k": 1}
            assert model.calls[0]["timeout_us"] == 500
        # One execution of the ensemble; its compute times are its three steps' sums.
        assert stats.success_count == 1 and stats.execution_count == 1 and stats.inference_count == 1
        assert stats.compute_infer_ns_total == 300 and stats.compute_input_ns_total == 3

    if not hasattr(asyncio, "Barrier"):
        pytest.skip("asyncio.Barrier needs Python 3.11")
    asyncio.run(main())


def test_a_failing_step_fails_the_request_and_cancels_its_sibling() -> None:
    async def main() -> None:
        never = asyncio.Event()
        cancelled = []

        async def hang() -> None:
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        def boom(inputs: Tensors) -> np.ndarray:
            raise InternalError("model 'left' failed: boom")

        join = FakeScheduler(lambda t: t["A"])
        ensemble, stats = make(
            {"left": FakeScheduler(boom), "right": FakeScheduler(lambda t: t["X"], hang), "join": join}
        )
        with pytest.raises(InternalError, match="model 'left' failed: boom"):
            await asyncio.wait_for(ensemble.infer({"IN": np.zeros((1, 2), np.float32)}, []), 5)
        await asyncio.sleep(0)
        assert cancelled == [True] and not join.calls
        assert stats.fail_count == 1 and stats.success_count == 0

    asyncio.run(main())
