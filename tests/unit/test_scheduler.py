"""Scheduler: Triton's default scheduler, dynamic batcher and queue policy, against a fake model.

Timing is controlled with threading primitives, not sleeps: `FakeInstance.run` holds any batch
whose first element is `HOLD` until the test sets the gate, so a test can keep an instance busy
while it queues requests, then let go. `until()` polls a condition with a generous bound; where a
test asserts that something has *not* happened yet, it waits far less than the configured delay.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from reference_server.backends.onnxruntime import OnnxInstance, session_options
from reference_server.backends.placement import Placement
from reference_server.errors import InternalError, InvalidArgument, ModelConfigError, Unavailable
from reference_server.scheduling.execute import Tensor
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.stats import ModelStats

HOLD = 1.0  # a batch starting with this value waits for the gate
BOUND_S = 5.0  # upper bound for anything that should happen "now"


class FakeInstance:
    """Returns OUT = IN * 2 and NEG = -IN; records what it ran; fails on negative input."""

    def __init__(self, name: str, gate: threading.Event) -> None:
        self.name = name
        self.gate = gate
        self.barrier: threading.Barrier | None = None
        self.batches: list[int] = []  # dim 0 of each run
        self.firsts: list[float] = []  # first element of each run: which request led the batch
        self.finished = 0

    def run(self, inputs: dict[str, Tensor], output_names: Sequence[str]) -> dict[str, Tensor]:
        x = inputs["IN"]
        self.batches.append(int(x.shape[0]))
        self.firsts.append(float(x.flat[0]))
        try:
            if self.barrier is not None:
                self.barrier.wait()
            if x.flat[0] == HOLD and not self.gate.wait(BOUND_S * 2):
                raise TimeoutError("test never opened the gate")
            if (x < 0).any():
                raise ValueError("poisoned input")
            outputs = {"OUT": x * 2, "NEG": -x}
            return {n: outputs[n] for n in output_names} if output_names else outputs
        finally:
            self.finished += 1


def tensor(value: float, n: int = 1, width: int = 2) -> dict[str, Tensor]:
    return {"IN": np.full((n, width), value, dtype=np.float32)}


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.001)


class Harness:
    """Builds schedulers over fake instances and always closes them, opening every gate first."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.schedulers: list[Scheduler] = []

    def make(self, policy: BatchingPolicy, instances: int = 1) -> tuple[Scheduler, list[FakeInstance], ModelStats]:
        fakes = [FakeInstance(f"fake_{i}", self.gate) for i in range(instances)]
        stats = ModelStats()
        scheduler = Scheduler(policy, fakes, stats)
        self.schedulers.append(scheduler)
        return scheduler, fakes, stats

    async def close(self) -> None:
        self.gate.set()
        for scheduler in self.schedulers:
            await scheduler.close(BOUND_S)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    await h.close()


def submit(
    scheduler: Scheduler, inputs: dict[str, Tensor], outputs: Sequence[str] = ("OUT",), **kw: Any
) -> asyncio.Task[dict[str, Tensor]]:
    return asyncio.ensure_future(scheduler.infer(inputs, list(outputs), **kw))


async def hold_instance(scheduler: Scheduler, fake: FakeInstance) -> asyncio.Task[dict[str, Tensor]]:
    """Start a request that keeps `fake` busy until the gate opens."""
    task = submit(scheduler, tensor(HOLD))
    await until(lambda: len(fake.batches) == 1, "the holding request is running")
    return task


async def gather(*tasks: asyncio.Task[Any]) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*tasks), BOUND_S)


DYNAMIC8 = BatchingPolicy(max_batch_size=8, dynamic=True)


# -- policy from config ----------------------------------------------------------------------------


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_policy_from_config_reads_dynamic_batching_and_queue_policy() -> None:
    policy = BatchingPolicy.from_config(
        parse(
            """
            name: "m" max_batch_size: 16
            dynamic_batching {
              preferred_batch_size: [8, 4, 8]
              max_queue_delay_microseconds: 250
              preserve_ordering: true
              default_queue_policy {
                max_queue_size: 32 default_timeout_microseconds: 1000
                timeout_action: DELAY allow_timeout_override: true
              }
            }
            """
        )
    )
    assert policy == BatchingPolicy(
        max_batch_size=16,
        dynamic=True,
        preferred_batch_sizes=(4, 8),
        max_queue_delay_ns=250_000,
        preserve_ordering=True,
        max_queue_size=32,
        default_timeout_ns=1_000_000,
        timeout_action="DELAY",
        allow_timeout_override=True,
    )


def test_policy_without_dynamic_batching_is_the_default_scheduler() -> None:
    plain = BatchingPolicy.from_config(parse('name: "m" max_batch_size: 8'))
    assert plain == BatchingPolicy(max_batch_size=8)
    empty = BatchingPolicy.from_config(parse('name: "m" max_batch_size: 4 dynamic_batching {}'))
    assert empty.dynamic and empty.timeout_action == "REJECT" and empty.max_queue_delay_ns == 0


def test_preferred_size_above_max_batch_size_is_a_config_error() -> None:
    with pytest.raises(ModelConfigError, match="preferred_batch_size 16"):
        BatchingPolicy(max_batch_size=8, dynamic=True, preferred_batch_sizes=(16,))


# -- default scheduler -----------------------------------------------------------------------------


async def test_default_scheduler_runs_each_request_alone(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=8))
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(v, n)) for v, n in ((2, 1), (3, 3), (4, 2))]
    await until(lambda: stats.pending == 3, "three requests are queued")
    harness.gate.set()
    results = await gather(first, *rest)
    assert fake.batches == [1, 1, 3, 2]
    assert fake.firsts == [HOLD, 2, 3, 4]  # FIFO
    assert [r["OUT"].shape for r in results] == [(1, 2), (1, 2), (3, 2), (2, 2)]
    assert (stats.inference_count, stats.execution_count, stats.pending) == (7, 4, 0)


async def test_model_without_batching_passes_inputs_through(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=0, dynamic=True))
    out = await scheduler.infer({"IN": np.full((5, 3), 2, np.float32)}, ["OUT"])
    assert out["OUT"].shape == (5, 3)  # no batch dimension: dim 0 is data, batch size is 1
    assert fake.batches == [5]
    assert (stats.inference_count, stats.execution_count) == (1, 1)


async def test_batch_dimension_is_validated(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=4, dynamic=True))
    with pytest.raises(InvalidArgument, match="batch-size must be <= 4"):
        await scheduler.infer(tensor(2, n=5), ["OUT"])
    with pytest.raises(InvalidArgument, match="does not match"):
        await scheduler.infer({"IN": np.ones((2, 2)), "B": np.ones((3, 2))}, ["OUT"])
    with pytest.raises(InvalidArgument, match="no batch dimension"):
        await scheduler.infer({"IN": np.float32(1)}, ["OUT"])
    assert fake.batches == [] and stats.fail_count == 0


# -- dynamic batcher -------------------------------------------------------------------------------


async def test_requests_queued_behind_a_busy_instance_form_one_batch(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(v)) for v in range(2, 7)]
    await until(lambda: stats.pending == 5, "five requests are queued")
    assert fake.batches == [1]
    harness.gate.set()
    results = await gather(first, *rest)
    assert fake.batches == [1, 5]
    for value, result in zip([HOLD, 2, 3, 4, 5, 6], results):
        np.testing.assert_array_equal(result["OUT"], tensor(value * 2)["IN"])


async def test_outputs_are_split_back_by_each_requests_batch_size(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    a = submit(scheduler, tensor(2, n=3), ["OUT"])
    b = submit(scheduler, tensor(3, n=1), ["NEG"])
    c = submit(scheduler, tensor(4, n=2), [])  # every output
    await until(lambda: stats.pending == 3, "three requests are queued")
    harness.gate.set()
    _, ra, rb, rc = await gather(first, a, b, c)
    assert fake.batches == [1, 6]
    assert set(ra) == {"OUT"} and set(rb) == {"NEG"} and set(rc) == {"OUT", "NEG"}
    np.testing.assert_array_equal(ra["OUT"], np.full((3, 2), 4, np.float32))
    np.testing.assert_array_equal(rb["NEG"], np.full((1, 2), -3, np.float32))
    np.testing.assert_array_equal(rc["OUT"], np.full((2, 2), 8, np.float32))
    np.testing.assert_array_equal(rc["NEG"], np.full((2, 2), -4, np.float32))
    assert stats.inference_count == 7


async def test_batches_never_exceed_max_batch_size(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=4, dynamic=True))
    first = await hold_instance(scheduler, fake)
    sizes = [1, 1, 1, 1, 1, 1, 3, 1, 2]
    rest = [submit(scheduler, tensor(2 + i, n)) for i, n in enumerate(sizes)]
    await until(lambda: stats.pending == len(sizes), "all requests are queued")
    harness.gate.set()
    await gather(first, *rest)
    # FIFO, never reordered to fill a batch: 1+1+1+1 | 1+1 (3 would exceed 4) | 3+1 | 2
    assert fake.batches == [1, 4, 2, 4, 2]
    assert max(fake.batches) <= 4


async def test_largest_possible_preferred_batch_size_is_chosen(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(
        BatchingPolicy(max_batch_size=8, dynamic=True, preferred_batch_sizes=(2, 4))
    )
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(2 + i)) for i in range(7)]
    await until(lambda: stats.pending == 7, "seven requests are queued")
    harness.gate.set()
    await gather(first, *rest)
    # 7 queued: 4 (largest preferred that fits), then 3 queued: 2, then 1 queued: no preferred
    # size reachable and no delay, so it goes alone.
    assert fake.batches == [1, 4, 2, 1]


async def test_requests_with_different_shapes_are_not_batched_together(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    rest = [
        submit(scheduler, tensor(2, width=2)),
        submit(scheduler, tensor(3, width=2)),
        submit(scheduler, tensor(4, width=3)),
        submit(scheduler, {"IN": np.full((1, 2), 5, np.float64)}),
        submit(scheduler, tensor(6, width=2)),
    ]
    await until(lambda: stats.pending == 5, "five requests are queued")
    harness.gate.set()
    results = await gather(first, *rest)
    assert fake.batches == [1, 2, 1, 1, 1]
    assert results[3]["OUT"].shape == (1, 3)
    assert results[4]["OUT"].dtype == np.float64


async def test_queue_delay_holds_a_partial_batch_until_it_fills(harness: Harness) -> None:
    policy = BatchingPolicy(max_batch_size=4, dynamic=True, max_queue_delay_ns=30 * 10**9)
    scheduler, (fake,), stats = harness.make(policy)
    early = [submit(scheduler, tensor(2 + i)) for i in range(3)]
    # The instance is idle, yet nothing runs: the delay (30 s) has not expired and no preferred
    # size (here max_batch_size) is reached. 0.3 s is 1% of the delay.
    done, _ = await asyncio.wait(early, timeout=0.3)
    assert not done and fake.batches == [] and stats.pending == 3
    last = submit(scheduler, tensor(5))
    await gather(*early, last)
    assert fake.batches == [4]


async def test_queue_delay_expiry_sends_what_is_there(harness: Harness) -> None:
    delay_s = 0.05
    scheduler, (fake,), _ = harness.make(
        BatchingPolicy(max_batch_size=4, dynamic=True, max_queue_delay_ns=int(delay_s * 1e9))
    )
    start = time.perf_counter()
    await gather(submit(scheduler, tensor(2)), submit(scheduler, tensor(3)))
    assert time.perf_counter() - start >= delay_s
    assert fake.batches == [2]


async def test_instances_run_batches_in_parallel(harness: Harness) -> None:
    barrier = threading.Barrier(2, timeout=BOUND_S)  # passes only if both runs overlap
    scheduler, fakes, stats = harness.make(BatchingPolicy(max_batch_size=8), instances=2)
    for fake in fakes:
        fake.barrier = barrier
    await gather(submit(scheduler, tensor(2)), submit(scheduler, tensor(3)))
    assert [f.batches for f in fakes] == [[1], [1]]
    assert stats.execution_count == 2


@pytest.mark.parametrize("preserve", [True, False])
async def test_preserve_ordering_releases_responses_in_arrival_order(harness: Harness, preserve: bool) -> None:
    policy = BatchingPolicy(max_batch_size=1, dynamic=True, preserve_ordering=preserve)
    scheduler, fakes, stats = harness.make(policy, instances=2)
    order: list[str] = []
    slow = submit(scheduler, tensor(HOLD))
    slow.add_done_callback(lambda _: order.append("slow"))
    await until(lambda: fakes[0].batches == [1], "the slow request runs on instance 0")
    fast = submit(scheduler, tensor(2))
    fast.add_done_callback(lambda _: order.append("fast"))
    # Instance 1 finishes `fast` while `slow` is still held on instance 0.
    await until(lambda: stats.execution_count == 1, "the fast request has executed")
    if preserve:
        await asyncio.sleep(0.01)
        assert not fast.done()  # its response is held until `slow`'s is released
    else:
        await until(fast.done, "the fast response is released")
    assert not slow.done()
    harness.gate.set()
    await gather(slow, fast)
    assert order == (["slow", "fast"] if preserve else ["fast", "slow"])


# -- queue policy ----------------------------------------------------------------------------------


async def test_full_queue_rejects_at_once(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=1, dynamic=True, max_queue_size=2))
    first = await hold_instance(scheduler, fake)
    queued = [submit(scheduler, tensor(2)), submit(scheduler, tensor(3))]
    await until(lambda: stats.pending == 2, "two requests are queued")
    with pytest.raises(Unavailable, match="(?i)exceeds maximum queue size"):
        await scheduler.infer(tensor(4), ["OUT"])
    assert stats.failures["REJECTED"] == 1 and stats.pending == 2
    harness.gate.set()
    await gather(first, *queued)
    assert fake.batches == [1, 1, 1]


async def test_queued_request_is_rejected_when_its_timeout_expires(harness: Harness) -> None:
    policy = BatchingPolicy(max_batch_size=4, dynamic=True, default_timeout_ns=20_000_000)
    scheduler, (fake,), stats = harness.make(policy)
    first = await hold_instance(scheduler, fake)
    # Rejected while the instance is still busy: the timer, not the next batch, expires it.
    with pytest.raises(Unavailable, match="Request timeout expired"):
        await asyncio.wait_for(scheduler.infer(tensor(2), ["OUT"]), BOUND_S)
    assert not first.done()
    assert stats.failures["REJECTED"] == 1 and stats.pending == 0
    harness.gate.set()
    await gather(first)
    assert fake.batches == [1]


async def test_request_timeout_can_only_lower_the_default(harness: Harness) -> None:
    policy = BatchingPolicy(max_batch_size=4, dynamic=True, default_timeout_ns=30 * 10**9, allow_timeout_override=True)
    scheduler, (fake,), stats = harness.make(policy)
    first = await hold_instance(scheduler, fake)
    longer = submit(scheduler, tensor(3), timeout_us=60 * 10**6)
    with pytest.raises(Unavailable, match="Request timeout expired"):
        await asyncio.wait_for(scheduler.infer(tensor(2), ["OUT"], timeout_us=20_000), BOUND_S)
    assert not longer.done()
    harness.gate.set()
    await gather(first, longer)


@pytest.mark.parametrize(
    "policy",
    [
        BatchingPolicy(max_batch_size=4, dynamic=True, default_timeout_ns=30 * 10**9),  # override not allowed
        BatchingPolicy(max_batch_size=4, dynamic=True, allow_timeout_override=True),  # no default timeout
    ],
)
async def test_request_timeout_is_ignored_unless_triton_would_apply_it(
    harness: Harness, policy: BatchingPolicy
) -> None:
    scheduler, (fake,), stats = harness.make(policy)
    first = await hold_instance(scheduler, fake)
    queued = submit(scheduler, tensor(2), timeout_us=1_000)
    # 300x the request's timeout: had it applied, the timer would have rejected it long ago.
    done, _ = await asyncio.wait([queued], timeout=0.3)
    assert not done and stats.failures["REJECTED"] == 0
    harness.gate.set()
    await gather(first, queued)


async def test_delay_action_moves_expired_requests_behind_the_others(harness: Harness) -> None:
    policy = BatchingPolicy(
        max_batch_size=1,
        dynamic=True,
        default_timeout_ns=30 * 10**9,
        allow_timeout_override=True,
        timeout_action="DELAY",
    )
    scheduler, (fake,), stats = harness.make(policy)
    first = await hold_instance(scheduler, fake)
    expired = submit(scheduler, tensor(2), timeout_us=1_000)
    await until(lambda: stats.pending == 1, "the soon-expired request is queued")
    time.sleep(0.005)  # noqa: ASYNC251 -- block the loop past the 1 ms deadline, so it has expired by any clock
    fresh = submit(scheduler, tensor(3))
    await until(lambda: stats.pending == 2, "the fresh request is queued")
    harness.gate.set()
    await gather(first, expired, fresh)
    assert fake.firsts == [HOLD, 3, 2]  # DELAY: expired, yet served after the fresh one
    assert stats.fail_count == 0


async def test_cancelled_queued_request_is_withdrawn(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    doomed = submit(scheduler, tensor(2))
    await until(lambda: stats.pending == 1, "the request is queued")
    doomed.cancel()
    await until(lambda: stats.pending == 0, "the request has left the queue")
    assert stats.failures["CANCELED"] == 1
    harness.gate.set()
    await gather(first)
    assert fake.batches == [1]


async def test_request_cancelled_while_executing_is_counted_when_its_batch_ends(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    running = await hold_instance(scheduler, fake)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    harness.gate.set()
    await until(lambda: stats.execution_count == 1, "the abandoned batch has finished")
    assert stats.failures["CANCELED"] == 1 and stats.success_count == 0
    assert (await scheduler.infer(tensor(2), ["OUT"]))["OUT"][0, 0] == 4


# -- failures and shutdown -------------------------------------------------------------------------


async def test_run_error_fails_only_its_batch(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=2, dynamic=True))
    first = await hold_instance(scheduler, fake)
    poisoned, neighbour, later = (submit(scheduler, tensor(v)) for v in (-1, 3, 4))
    await until(lambda: stats.pending == 3, "three requests are queued")
    harness.gate.set()
    everything = asyncio.gather(first, poisoned, neighbour, later, return_exceptions=True)
    results = await asyncio.wait_for(everything, BOUND_S)
    assert fake.batches == [1, 2, 1]
    for failed in results[1:3]:
        assert isinstance(failed, InternalError) and "poisoned input" in str(failed)
    assert isinstance(results[3], dict)
    assert stats.failures["BACKEND"] == 2 and stats.success_count == 2
    # The scheduler keeps working.
    assert (await scheduler.infer(tensor(5), ["OUT"]))["OUT"][0, 0] == 10


async def test_close_lets_queued_requests_finish(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    queued = [submit(scheduler, tensor(2 + i)) for i in range(3)]
    await until(lambda: stats.pending == 3, "three requests are queued")
    closing = asyncio.ensure_future(scheduler.close(BOUND_S))
    await asyncio.sleep(0)  # close() has started
    with pytest.raises(Unavailable, match="stopping"):
        await scheduler.infer(tensor(9), ["OUT"])
    harness.gate.set()
    results = await gather(first, *queued)
    await asyncio.wait_for(closing, BOUND_S)
    assert len(results) == 4 and fake.batches == [1, 3]
    assert stats.fail_count == 0


async def test_close_fails_what_is_left_after_the_grace_period(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    queued = [submit(scheduler, tensor(2)), submit(scheduler, tensor(3))]
    await until(lambda: stats.pending == 2, "two requests are queued")
    await asyncio.wait_for(scheduler.close(0.05), BOUND_S)
    results = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True), BOUND_S)
    assert all(isinstance(r, Unavailable) for r in results)
    assert stats.failures["OTHER"] == 3 and stats.pending == 0
    harness.gate.set()  # the stuck run returns; its late result is dropped
    await until(lambda: fake.finished == 1, "the stuck run has returned")
    await until(lambda: stats.execution_count == 1, "its completion has been processed")
    assert stats.success_count == 0 and fake.batches == [1]


async def test_close_sends_batches_waiting_for_their_queue_delay(harness: Harness) -> None:
    policy = BatchingPolicy(max_batch_size=4, dynamic=True, max_queue_delay_ns=30 * 10**9)
    scheduler, (fake,), stats = harness.make(policy)
    waiting = [submit(scheduler, tensor(2)), submit(scheduler, tensor(3))]
    await until(lambda: stats.pending == 2, "two requests wait for the queue delay")
    # Two closers (say, an unload racing a server stop) share one shutdown.
    await asyncio.wait_for(asyncio.gather(scheduler.close(BOUND_S), scheduler.close(BOUND_S)), BOUND_S)
    await gather(*waiting)
    assert fake.batches == [2] and stats.fail_count == 0


# -- statistics ------------------------------------------------------------------------------------


async def test_statistics_follow_batches(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(DYNAMIC8)
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(2, n)) for n in (2, 3)]
    await until(lambda: stats.pending == 2, "two requests are queued")
    harness.gate.set()
    await gather(first, *rest)
    d = stats.to_dict("fake", "1")
    assert d["inference_count"] == 6  # sum of batch sizes
    assert d["execution_count"] == 2  # number of runs
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in d["batch_stats"]] == [(1, 1), (5, 1)]
    s = d["inference_stats"]
    assert s["success"]["count"] == 3 and s["fail"]["count"] == 0
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert s[phase]["count"] == 3
    # The held run lasted until the gate opened, and both queued requests waited for it.
    assert s["queue"]["ns"] > 0 and s["compute_infer"]["ns"] > 0
    assert s["success"]["ns"] >= s["queue"]["ns"] + s["compute_infer"]["ns"]
    big = d["batch_stats"][1]["compute_infer"]["ns"]
    assert s["compute_infer"]["ns"] == d["batch_stats"][0]["compute_infer"]["ns"] + 2 * big
    assert d["last_inference"] > 0 and stats.pending == 0


async def test_received_ns_counts_time_before_the_scheduler(harness: Harness) -> None:
    scheduler, _, stats = harness.make(DYNAMIC8)
    earlier = time.perf_counter_ns() - 10**9  # the transport received it a second ago
    await scheduler.infer(tensor(2), ["OUT"], received_ns=earlier)
    assert stats.queue_ns_total >= 10**9 and stats.success_ns >= 10**9


# -- backlogs --------------------------------------------------------------------------------------


def block_loop_until(predicate: Callable[[], bool], seconds: float) -> bool:
    """Hold the event loop (no awaits) until `predicate` or `seconds`; whatever happens meanwhile
    happened without a loop iteration."""
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)
    return predicate()


async def finish_first_in_one_iteration(harness: Harness, fake: FakeInstance) -> None:
    """Open the gate for the holding request and give the loop exactly one iteration, in which
    its completion callback runs; the loop is held before and after."""
    harness.gate.set()
    assert block_loop_until(lambda: fake.finished >= 1, BOUND_S), "the holding request never ran"
    await asyncio.sleep(0)  # queued behind the completion the worker posted: runs just after it


async def test_a_backlog_reaches_the_busy_instance_ahead_of_the_loop(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=8))
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(v)) for v in (2, 3, 4, 5)]
    await until(lambda: stats.pending == 4, "four requests are queued")
    await finish_first_in_one_iteration(harness, fake)
    # That one completion handed all four to the instance, which runs them while the loop is held.
    assert block_loop_until(lambda: fake.finished == 5, BOUND_S), f"ran {fake.finished} of 5 without the loop"
    results = await gather(first, *rest)
    assert fake.firsts == [HOLD, 2, 3, 4, 5]  # still FIFO
    assert [float(r["OUT"].flat[0]) for r in results] == [2 * HOLD, 4, 6, 8, 10]
    assert (stats.success_count, stats.execution_count, stats.pending) == (5, 5, 0)


async def test_only_whole_batches_go_ahead(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=2, dynamic=True))
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(v)) for v in (2, 3, 4, 5, 6)]
    await until(lambda: stats.pending == 5, "five requests are queued")
    await finish_first_in_one_iteration(harness, fake)
    block_loop_until(lambda: fake.finished == 4, 0.2)
    # Two full batches went at once; the last request waits for the loop, free to grow its batch.
    assert fake.batches == [1, 2, 2]
    await gather(first, *rest)
    assert fake.batches == [1, 2, 2, 1]


async def test_nothing_goes_ahead_while_queued_requests_can_time_out(harness: Harness) -> None:
    policy = BatchingPolicy(max_batch_size=8, default_timeout_ns=30 * 10**9)
    scheduler, (fake,), stats = harness.make(policy)
    first = await hold_instance(scheduler, fake)
    rest = [submit(scheduler, tensor(v)) for v in (2, 3, 4)]
    await until(lambda: stats.pending == 3, "three requests are queued")
    await finish_first_in_one_iteration(harness, fake)
    # A request handed ahead could outlive its timeout unseen, so the others wait in the queue.
    assert not block_loop_until(lambda: fake.finished > 2, 0.2)
    assert stats.pending == 2
    await gather(first, *rest)
    assert stats.success_count == 4


async def test_close_fails_batches_waiting_ahead_and_never_runs_them(harness: Harness) -> None:
    scheduler, (fake,), stats = harness.make(BatchingPolicy(max_batch_size=8))
    first = await hold_instance(scheduler, fake)
    queued = [submit(scheduler, tensor(v)) for v in (HOLD, 2, 3)]
    await until(lambda: stats.pending == 3, "three requests are queued")
    harness.gate.set()
    assert block_loop_until(lambda: fake.finished >= 1, BOUND_S)
    harness.gate.clear()  # the second holding request will wait, with 2 and 3 ahead behind it
    await until(lambda: len(fake.batches) == 2 and stats.pending == 0, "the backlog went ahead")
    await asyncio.wait_for(scheduler.close(0.05), BOUND_S)
    results = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True), BOUND_S)
    assert not isinstance(results[0], Exception)
    assert all(isinstance(r, Unavailable) for r in results[1:])
    assert stats.failures["OTHER"] == 3
    harness.gate.set()
    await until(lambda: fake.finished == 2, "the held run has returned")
    await asyncio.sleep(0.05)
    assert fake.batches == [1, 1]  # the two waiting behind it were dropped, not run


# -- short runs on the loop --------------------------------------------------------------------------


class ThreadRecorder:
    """An instance that may run on the loop: records which thread ran each request, and computes
    for 10 ms of CPU time on HOLD (a run too slow for the loop)."""

    runs_on_loop = True

    def __init__(self) -> None:
        self.name = "recorder"
        self.threads: list[str] = []

    def run(self, inputs: dict[str, Tensor], output_names: Sequence[str]) -> dict[str, Tensor]:
        self.threads.append(threading.current_thread().name)
        x = inputs["IN"]
        if x.flat[0] == HOLD:
            until = time.thread_time() + 0.01  # the scheduler times runs in CPU time, not wall time
            while time.thread_time() < until:
                pass
        return {"OUT": x * 2}


async def run_one(scheduler: Scheduler, value: float) -> None:
    result = await asyncio.wait_for(scheduler.infer(tensor(value), ["OUT"]), BOUND_S)
    np.testing.assert_array_equal(result["OUT"], tensor(value)["IN"] * 2)


@pytest.mark.parametrize(
    ("policy", "instances", "runs_on_loop"),
    [
        (BatchingPolicy(max_batch_size=8), 1, True),
        (DYNAMIC8, 1, True),
        (BatchingPolicy(max_batch_size=8), 2, False),  # instances run in parallel
    ],
)
async def test_short_batches_of_a_lone_instance_execute_on_the_loop(
    policy: BatchingPolicy, instances: int, runs_on_loop: bool
) -> None:
    recorders = [ThreadRecorder() for _ in range(instances)]
    stats = ModelStats()
    scheduler = Scheduler(policy, recorders, stats)
    try:
        for value in (2.0, 3.0, 4.0):
            await run_one(scheduler, value)
    finally:
        await scheduler.close(BOUND_S)
    threads = [name for recorder in recorders for name in recorder.threads]
    loop_thread = threading.current_thread().name
    # No cost is known before the first run, so it always goes to the worker.
    assert threads[0] != loop_thread
    assert (threads[1:] == [loop_thread] * 2) is runs_on_loop
    assert stats.success_count == 3 and stats.execution_count == 3


async def test_a_slow_run_sends_the_next_request_back_to_the_worker() -> None:
    recorder = ThreadRecorder()
    scheduler = Scheduler(BatchingPolicy(max_batch_size=8), [recorder], ModelStats())
    loop_thread = threading.current_thread().name
    try:
        await run_one(scheduler, 2.0)
        await run_one(scheduler, HOLD)  # cheap by the estimate, so on the loop, but slow
        await run_one(scheduler, 2.0)
    finally:
        await scheduler.close(BOUND_S)
    assert recorder.threads[1] == loop_thread
    assert recorder.threads[2] != loop_thread


@pytest.mark.parametrize(("threads", "runs_on_loop"), [("1", True), ("2", False)])
async def test_onnx_instances_run_on_the_loop_only_with_one_intra_op_thread(
    demo_repository: Path, threads: str, runs_on_loop: bool
) -> None:
    config = parse(f'name: "mlp" parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}')
    instance = OnnxInstance(
        Placement("mlp_0", "CPU"), demo_repository / "mlp" / "1" / "model.onnx", session_options(config)
    )
    assert instance.runs_on_loop is runs_on_loop
    scheduler = Scheduler(BatchingPolicy(max_batch_size=8), [instance], ModelStats())
    inputs = {"INPUT0": np.ones((1, 256), dtype=np.float32)}
    expected = instance.run(inputs, ["OUTPUT0"])["OUTPUT0"]
    try:
        for _ in range(3):  # the first request teaches the scheduler the model's cost
            result = await asyncio.wait_for(scheduler.infer(inputs, ["OUTPUT0"]), BOUND_S)
            np.testing.assert_allclose(result["OUTPUT0"], expected, rtol=1e-6)
    finally:
        await scheduler.close(BOUND_S)


def test_an_onnx_cpu_instance_still_refuses_a_feed_the_graph_does_not_take(demo_repository: Path) -> None:
    # A CPU instance calls the session binding's run without the Python wrapper's checks: the
    # binding's own refusals must still raise (the scheduler answers them as the batch's error).
    instance = OnnxInstance(
        Placement("mlp_0", "CPU"), demo_repository / "mlp" / "1" / "model.onnx", ort.SessionOptions()
    )
    with pytest.raises(Exception, match="INPUT0"):
        instance.run({}, ["OUTPUT0"])
    with pytest.raises(Exception, match="(?i)type"):
        instance.run({"INPUT0": np.ones((1, 256), dtype=np.float64)}, ["OUTPUT0"])
    with pytest.raises(Exception, match="NOPE"):
        instance.run({"INPUT0": np.ones((1, 256), dtype=np.float32)}, ["NOPE"])
    assert list(instance.run({"INPUT0": np.ones((2, 256), dtype=np.float32)}, [])) == ["OUTPUT0"]


# -- prepare_inputs ----------------------------------------------------------------------------------


class PreparingInstance(FakeInstance):
    """Its `prepare_inputs` adds 0.5 to every input and refuses a request holding 7."""

    def prepare_inputs(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        if (inputs["IN"] == 7).any():
            raise InvalidArgument("input 'IN' holds 7")
        return {"IN": inputs["IN"] + 0.5}


async def test_prepare_inputs_converts_each_request_and_refuses_one_alone(harness: Harness) -> None:
    fake = PreparingInstance("preparing", harness.gate)
    scheduler = Scheduler(DYNAMIC8, [fake], ModelStats())
    harness.schedulers.append(scheduler)
    tasks = [submit(scheduler, tensor(v)) for v in (2.0, 7.0, 3.0, 4.0)]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), BOUND_S)
    assert isinstance(results[1], InvalidArgument) and "holds 7" in str(results[1])
    for value, result in zip((2.0, 3.0, 4.0), results[:1] + results[2:]):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["OUT"], (tensor(value)["IN"] + 0.5) * 2)
    assert sum(fake.batches) == 3  # the refused request never reached a batch
