"""The ensemble scheduler on fake composing schedulers: independent steps are in flight together,
tensors pass between steps as the same arrays, a step's failure is the request's, and the
request's id, parameters and timeout reach every step; `submit` chains a line of steps through
their schedulers' callbacks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference_server.core.ensemble.config import ensemble_plan
from reference_server.core.ensemble.scheduler import EnsembleScheduler
from reference_server.core.model_config import parse_config_text
from reference_server.errors import InternalError, Unavailable
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
        self.submitted = 0  # calls of submit
        self.refusal: Exception | None = None  # what submit raises, if anything

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

    def submit(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        done: Callable[[Tensors | Exception], None],
        **kwargs: Any,
    ) -> None:
        """`Scheduler.submit`'s contract: a refusal raises, else `done` is called once, later, on the loop."""
        self.submitted += 1
        if self.refusal is not None:
            raise self.refusal
        self.calls.append({"inputs": inputs, "id": kwargs["request_id"], "parameters": kwargs["parameters"]})
        try:
            answer: Tensors | Exception = {"Y": self.compute(inputs)}
            kwargs["secondary_stats"].record_success(1000, 10, 1, 100, 2)
        except Exception as error:
            answer = error
        asyncio.get_running_loop().call_soon(done, answer)

    def infer_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[Tensors | None, bool]]:
        raise NotImplementedError

    async def close(self, grace_s: float) -> None:
        pass


class Served:
    def __init__(self, scheduler: FakeScheduler) -> None:
        self.scheduler = scheduler
        self.input_types: dict[str, tuple[str, tuple[int, ...]]] = {}  # no datatype checks


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


CHAIN = """
name: "chain"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
  { model_name: "after" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
] }
"""


class FakeStream:
    """A decoupled composing model: one response per element of X (Y = the element), then the
    final flag alone once `before_final` (if any) lets it through; a negative element is an error
    response."""

    def __init__(self, before_final: Callable[[], Any] | None = None) -> None:
        self.before_final = before_final

    async def infer_stream(
        self, inputs: Tensors, output_names: Sequence[str], **kwargs: Any
    ) -> AsyncIterator[tuple[Tensors | InternalError | None, bool]]:
        for value in inputs["X"].reshape(-1):
            if value < 0:
                yield InternalError(f"repeat: {value} is negative"), False
            else:
                yield {"Y": np.array([value], np.float32)}, False
        if self.before_final is not None:
            await self.before_final()
        yield None, True


def make_chain(repeat: FakeStream, after: FakeScheduler) -> EnsembleScheduler:
    config = parse_config_text(CHAIN, Path("chain/config.pbtxt"))
    plan = ensemble_plan(config, Path("chain/config.pbtxt"))
    models: dict[str, Any] = {"repeat": repeat, "after": after}

    class Step:
        def __init__(self, scheduler: Any) -> None:
            self.scheduler = scheduler
            self.input_types: dict[str, tuple[str, tuple[int, ...]]] = {}

    return EnsembleScheduler(plan, 0, ModelStats(), lambda name, version: Step(models[name]), frozenset({"repeat"}))


async def collect(ensemble: EnsembleScheduler, values: list[float]) -> list[tuple[list[float] | None, bool]]:
    got: list[tuple[list[float] | None, bool]] = []
    async for outputs, final in ensemble.infer_stream({"IN": np.array(values, np.float32)}, []):
        assert not isinstance(outputs, Exception)
        got.append((None if outputs is None else outputs["OUT"].tolist(), final))
    return got


def test_the_steps_after_a_decoupled_step_run_once_per_response_and_the_last_one_is_final() -> None:
    async def main() -> None:
        # The decoupled step's final flag comes while the passes after it still run: the last
        # response carries the final flag (Triton's rule: final when nothing is left in flight).
        stream_over = asyncio.Event()
        final_sent = asyncio.Event()

        async def gate() -> None:
            await stream_over.wait()

        async def before_final() -> None:
            final_sent.set()

        after = FakeScheduler(lambda t: t["X"] * 10, gate)
        task = asyncio.ensure_future(collect(make_chain(FakeStream(before_final), after), [1, 2, 3]))
        # The final flag is taken in the same step as it is sent: once it is, the three passes wait.
        await asyncio.wait_for(final_sent.wait(), 5)
        assert len(after.calls) == 3
        stream_over.set()
        got = await asyncio.wait_for(task, 5)
        assert sorted(got) == [([10.0], False), ([20.0], False), ([30.0], True)]
        assert got[-1] == ([30.0], True)

    asyncio.run(main())


def test_a_final_flag_after_every_pass_finished_comes_alone() -> None:
    async def main() -> None:
        after = FakeScheduler(lambda t: t["X"] * 10)
        both_answered = asyncio.Event()

        async def before_final() -> None:
            await both_answered.wait()

        ensemble = make_chain(FakeStream(before_final), after)
        got: list[tuple[list[float] | None, bool]] = []
        async for outputs, final in ensemble.infer_stream({"IN": np.array([1, 2], np.float32)}, []):
            assert not isinstance(outputs, Exception)
            got.append((None if outputs is None else outputs["OUT"].tolist(), final))
            if len(got) == 2:
                both_answered.set()
        assert got == [([10.0], False), ([20.0], False), (None, True)]
        # No response at all from the decoupled step: the final flag alone.
        assert await collect(make_chain(FakeStream(), after), []) == [(None, True)]

    asyncio.run(main())


def test_an_error_response_of_the_decoupled_step_ends_the_stream_named_after_the_ensemble() -> None:
    async def main() -> None:
        ensemble = make_chain(FakeStream(), FakeScheduler(lambda t: t["X"] * 10))
        with pytest.raises(InternalError, match=r"^in ensemble 'chain', repeat: -1.0 is negative$"):
            await asyncio.wait_for(collect(ensemble, [1, -1, 2]), 5)

    asyncio.run(main())


def test_closing_the_stream_early_cancels_the_passes_in_flight() -> None:
    async def main() -> None:
        never = asyncio.Event()
        both_waiting = asyncio.Event()
        cancelled: list[bool] = []

        async def hang() -> None:
            if len(after.calls) == 2:
                both_waiting.set()
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        after = FakeScheduler(lambda t: t["X"], hang)
        stream = make_chain(FakeStream(), after).infer_stream({"IN": np.array([1, 2], np.float32)}, [])
        pending = asyncio.ensure_future(anext(stream))
        await asyncio.wait_for(both_waiting.wait(), 5)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await stream.aclose()  # type: ignore[attr-defined]
        assert cancelled == [True, True]

    asyncio.run(main())


LINE = """
name: "line"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "second" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } },
  { model_name: "first" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } }
] }
"""


def make_line(models: dict[str, FakeScheduler]) -> tuple[EnsembleScheduler, ModelStats]:
    config = parse_config_text(LINE, Path("line/config.pbtxt"))
    stats = ModelStats()
    plan = ensemble_plan(config, Path("line/config.pbtxt"))
    return EnsembleScheduler(plan, 8, stats, lambda name, version: Served(models[name])), stats


async def submitted(ensemble: EnsembleScheduler, x: np.ndarray) -> Tensors | Exception:
    answer: asyncio.Future[Tensors | Exception] = asyncio.get_running_loop().create_future()
    ensemble.submit({"IN": x}, [], answer.set_result, request_id="r2", parameters={"k": 2})
    assert not answer.done()  # never answered from within submit
    return await asyncio.wait_for(answer, 5)


def test_submit_runs_a_chain_of_steps_through_their_callbacks_in_dependency_order() -> None:
    async def main() -> None:
        first, second = FakeScheduler(lambda t: t["X"] + 1), FakeScheduler(lambda t: t["X"] * 3)
        ensemble, stats = make_line({"first": first, "second": second})
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        out = await submitted(ensemble, x)
        assert not isinstance(out, Exception)
        np.testing.assert_array_equal(out["OUT"], (x + 1) * 3)
        # Both steps were submitted (not awaited), in the order their tensors allow, not the config's.
        assert (first.submitted, second.submitted) == (1, 1) and first.calls[0]["inputs"]["X"] is x
        assert second.calls[0]["id"] == "r2" and second.calls[0]["parameters"] == {"k": 2}
        assert stats.success_count == 1 and stats.execution_count == 1 and stats.compute_infer_ns_total == 200

    asyncio.run(main())


def test_submit_fails_a_chain_with_its_steps_error_named_after_the_ensemble() -> None:
    def boom(inputs: Tensors) -> np.ndarray:
        raise InternalError("model 'second' failed: boom")

    async def main() -> None:
        first, second = FakeScheduler(lambda t: t["X"]), FakeScheduler(boom)
        ensemble, stats = make_line({"first": first, "second": second})
        out = await submitted(ensemble, np.zeros((1, 2), np.float32))
        assert isinstance(out, InternalError) and out.message == "in ensemble 'line', model 'second' failed: boom"
        # A first step refused before it is queued: submit raises, as infer would.
        first.refusal = Unavailable("Exceeds maximum queue size (1)")
        with pytest.raises(Unavailable, match="^in ensemble 'line', Exceeds maximum queue size"):
            ensemble.submit({"IN": np.zeros((1, 2), np.float32)}, [], lambda answer: None)
        assert stats.fail_count == 2 and stats.success_count == 0 and second.submitted == 1

    asyncio.run(main())


def test_submit_runs_a_graph_with_steps_in_flight_together_through_infer() -> None:
    async def main() -> None:
        models = {name: FakeScheduler(lambda t: t["X"] + 1) for name in ("left", "right")}
        models["join"] = FakeScheduler(lambda t: t["A"] + t["B"])
        ensemble, stats = make(models)
        x = np.ones((1, 2), np.float32)
        out = await submitted(ensemble, x)
        assert not isinstance(out, Exception)
        np.testing.assert_array_equal(out["OUT"], (x + 1) * 2)
        assert all(model.submitted == 0 and len(model.calls) == 1 for model in models.values())
        assert stats.success_count == 1

    asyncio.run(main())
