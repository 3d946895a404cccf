"""The rate limiter: resource pools, the staging queue's priority order, load-time refusals, and a
scheduler whose instances share a resource running one batch at a time."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError
from reference_server.scheduling.execute import Tensor
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.rate_limiter import GLOBAL, RateLimiter, parse_resource
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.stats import ModelStats

BOUND_S = 5.0


def config(text: str, name: str = "m") -> mc.ModelConfig:
    parsed = text_format.Parse(text, mc.ModelConfig())
    parsed.name = name
    return parsed


TWO_GROUPS = """
instance_group [
  { name: "a" count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] priority: 1 } },
  { name: "b" count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] priority: 2 } }
]
"""


def global_r(count: int) -> str:
    """One instance asking for `count` of the global resource R."""
    resource = f'{{ name: "R" global: true count: {count} }}'
    return f"instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ resources [ {resource} ] }} }} ]"


@dataclass
class Instance:
    name: str


@dataclass
class FakeSlot:
    instance: Instance


def slots(*names: str) -> deque[FakeSlot]:
    return deque(FakeSlot(Instance(n)) for n in names)


def never() -> None:
    """A scheduler's wake-up, for tests that ask again themselves."""


def test_parse_resource_flag() -> None:
    assert parse_resource("R:2") == ("R", 2, None)
    assert parse_resource("gpu_mem:4:1") == ("gpu_mem", 4, 1)
    for bad in ("R", "R:x", ":2", "R:2:1:0", "R:-1"):
        with pytest.raises(ValueError, match="--rate-limit-resource option format is"):
            parse_resource(bad)


def test_without_the_flag_a_resource_has_the_most_any_instance_asks() -> None:
    limiter = RateLimiter()
    limiter.register(config(TWO_GROUPS.replace('name: "R" count: 1 } ] priority: 2', 'name: "R" count: 3 } ]')),
                     [Instance("a_0"), Instance("b_0")])  # fmt: skip
    assert limiter.available(("R", 0)) == 3


async def test_an_instance_holds_its_resources_until_release() -> None:
    limiter = RateLimiter()
    gate = limiter.register(config(TWO_GROUPS), [Instance("a_0"), Instance("b_0")])
    idle = slots("a_0", "b_0")
    first = gate.acquire(idle, never)
    assert first is not None and limiter.in_use(("R", 0)) == 1
    assert gate.acquire(idle, never) is None  # b is idle, but R is taken
    assert list(idle) == [FakeSlot(Instance("b_0"))]
    gate.settle(idle)  # the pass ended waiting: b stays staged
    idle.append(first)
    gate.release(first, more=True)  # a ran once: b, which ran least, goes next
    second = gate.acquire(idle, never)
    assert second is not None and second.instance.name == "b_0"
    assert gate.acquire(idle, never) is None  # a, staged again on release, waits while b holds R
    gate.settle(idle)
    assert limiter.in_use(("R", 0)) == 1
    idle.append(second)
    gate.release(second, more=False)  # a gets R when b lets go...
    assert limiter.in_use(("R", 0)) == 1
    gate.settle(idle)  # ...and gives it back when its scheduler's next pass finds nothing to run
    assert limiter.in_use(("R", 0)) == 0
    assert (gate.executions("a_0"), gate.executions("b_0")) == (1, 1)


async def test_priority_two_gets_half_the_turns_of_priority_one() -> None:
    limiter = RateLimiter()
    gate = limiter.register(config(TWO_GROUPS), [Instance("a_0"), Instance("b_0")])
    idle = slots("a_0", "b_0")
    for _ in range(30):  # a backlog: there is always more to run
        slot = gate.acquire(idle, never)
        assert slot is not None
        idle.append(slot)
        gate.release(slot, more=True)
    assert (gate.executions("a_0"), gate.executions("b_0")) == (20, 10)


def test_a_waiting_head_blocks_the_queue_and_allocation_wakes_its_scheduler() -> None:
    async def scenario() -> None:
        limiter = RateLimiter()
        big, small = global_r(2), global_r(1)
        gate_small = limiter.register(config(small, "small"), [Instance("small_0_0")])
        gate_big = limiter.register(config(big, "big"), [Instance("big_0_0")])
        assert limiter.available(("R", GLOBAL)) == 2
        idle_small, idle_big = slots("small_0_0"), slots("big_0_0")
        woken: list[str] = []
        running = gate_small.acquire(idle_small, lambda: woken.append("small"))
        assert running is not None
        # big needs both units: it waits at the head of the queue...
        assert gate_big.acquire(idle_big, lambda: woken.append("big")) is None
        gate_big.settle(idle_big)
        idle_small.append(running)
        gate_small.release(running, more=True)
        # ...and gets them when small gives its unit back; small, which has more to run, waits behind it.
        assert gate_small.acquire(idle_small, lambda: woken.append("small")) is None
        await asyncio.sleep(0)
        assert woken == ["big"]
        assert limiter.in_use(("R", GLOBAL)) == 2
        slot = gate_big.acquire(idle_big, lambda: woken.append("big"))
        assert slot is not None
        gate_big.release(slot, more=False)
        await asyncio.sleep(0)
        assert woken == ["big", "small"]

    asyncio.run(scenario())


async def test_the_staging_queue_stays_bounded_behind_a_waiting_head() -> None:
    limiter = RateLimiter()
    gate = limiter.register(config(TWO_GROUPS), [Instance("a_0"), Instance("b_0")])
    running = gate.acquire(slots("a_0"), never)  # a holds R: b, staged, waits at the head
    assert running is not None
    idle_b = slots("b_0")
    assert gate.acquire(idle_b, never) is None
    other = limiter.register(config("", "free"), [Instance("free_0")])
    for _ in range(1000):  # a model whose requests come and go while b waits
        idle = slots("free_0")
        assert other.acquire(idle, never) is None  # behind the head, as in Triton
        other.settle(idle)  # ...its request left (timed out): it leaves the queue
        other.settle(idle)
    assert len(limiter._staged) <= 4 * 3 + 64 + 1


async def test_settle_gives_back_resources_nobody_used() -> None:
    limiter = RateLimiter()
    gate = limiter.register(config(TWO_GROUPS), [Instance("a_0"), Instance("b_0")])
    idle = slots("a_0", "b_0")
    slot = gate.acquire(idle, never)
    assert slot is not None
    gate.settle(idle)  # b never asked to wait in this pass: nothing to hold
    gate.close()
    assert limiter.in_use(("R", 0)) == 0


def test_more_than_the_flag_gives_is_tritons_load_error() -> None:
    limiter = RateLimiter([("R", 1, None)])
    asks_two = TWO_GROUPS.replace('count: 1 } ] priority: 2', 'count: 2 } ] priority: 2')
    expected = (
        r'Resource count for "R" is limited to 1 which will prevent scheduling of one or more model instances, '
        r"the minimum required count is 2.*--rate-limit-resource=R:2"
    )
    with pytest.raises(ModelConfigError, match=expected):
        limiter.register(config(asks_two), [Instance("a_0"), Instance("b_0")])
    # Once the flag lists resources, one it does not list has none.
    other = TWO_GROUPS.replace('"R"', '"S"')
    with pytest.raises(ModelConfigError, match='Resource count for "S" is limited to 0'):
        limiter.register(config(other), [Instance("a_0"), Instance("b_0")])
    # A device-specific count covers that device only.
    per_device = RateLimiter([("R", 4, 1)])
    with pytest.raises(ModelConfigError, match="limited to 0"):
        per_device.register(config(TWO_GROUPS), [Instance("a_0"), Instance("b_0")])


def test_a_resource_both_global_and_per_device_is_refused() -> None:
    limiter = RateLimiter()
    mixed = TWO_GROUPS.replace('{ name: "R" count: 1 } ] priority: 2', '{ name: "R" global: true count: 1 } ] '
                               "priority: 2")  # fmt: skip
    with pytest.raises(ModelConfigError, match='Resource "R" is present as both global and device-specific resource'):
        limiter.register(config(mixed), [Instance("a_0"), Instance("b_0")])
    # Across models too, whichever loads second.
    limiter.register(config(TWO_GROUPS, "per_device"), [Instance("a_0"), Instance("b_0")])
    with pytest.raises(ModelConfigError, match="model 'global_r'"):
        limiter.register(config(global_r(1), "global_r"), [Instance("global_r_0_0")])


# -- through the scheduler -----------------------------------------------------------------------


class CountingInstance:
    """Records how many of its kind run at once; a run waits for `go` so runs can overlap."""

    active = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, name: str, go: threading.Event) -> None:
        self.name = name
        self.go = go
        self.runs = 0

    def run(self, inputs: dict[str, Tensor], output_names: Sequence[str]) -> dict[str, Tensor]:
        cls = type(self)
        with cls.lock:
            cls.active += 1
            cls.most = max(cls.most, cls.active)
        try:
            if not self.go.wait(BOUND_S):
                raise TimeoutError("test never let the run go")
            self.runs += 1
            return {"OUT": inputs["IN"]}
        finally:
            with cls.lock:
                cls.active -= 1


POLICIES = {
    "default scheduler": BatchingPolicy(),
    "dynamic batcher": BatchingPolicy(max_batch_size=2, dynamic=True, max_queue_delay_ns=1_000_000),
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("limited", [True, False])
async def test_two_groups_sharing_one_resource_run_one_at_a_time(limited: bool, policy: str) -> None:
    go = threading.Event()

    class Counting(CountingInstance):
        active = 0
        most = 0
        lock = threading.Lock()

    instances = [Counting("a_0", go), Counting("b_0", go)]
    gate = RateLimiter().register(config(TWO_GROUPS), instances) if limited else None
    scheduler = Scheduler(POLICIES[policy], instances, ModelStats(), gate)
    try:
        tasks = [asyncio.ensure_future(scheduler.infer({"IN": np.full((1, 1), i, np.float32)}, [])) for i in range(6)]
        deadline = asyncio.get_running_loop().time() + BOUND_S
        while Counting.active < (1 if limited else 2):
            if asyncio.get_running_loop().time() > deadline:
                break  # the assertions below say what was running
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # room for a second run to start, if the limiter let it
        started_while_held = Counting.active
        go.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), BOUND_S)
    finally:
        go.set()
        await scheduler.close(1.0)
    assert [float(r["OUT"][0, 0]) for r in results] == [float(i) for i in range(6)]
    assert sum(i.runs for i in instances) == (6 if policy == "default scheduler" else 3)  # batches of 2
    if limited:
        assert started_while_held == 1 and Counting.most == 1
        assert all(i.runs > 0 for i in instances)  # both groups took turns
    else:
        assert started_while_held == 2 and Counting.most == 2
