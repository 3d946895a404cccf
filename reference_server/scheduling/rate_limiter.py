"""Triton's rate limiter (`--rate-limit execution_count`): which model instance may start a batch, server-wide.

Theory of operation
-------------------
Without the rate limiter an idle instance runs the next batch its scheduler forms. With it (Triton's
docs/user_guide/rate_limiter.md, core src/rate_limiter.cc), an instance may run only once the
resources its `instance_group`'s `rate_limiter { resources [...] }` asks for are free: a resource is a
name and a count, held for the whole execution and shared by every instance of every model that
names it. A `global: true` resource is one pool for the server; any other is one pool per device
(CPU instances are on device 0).

*How many there are.* `--rate-limit-resource=<name>:<count>[:<device>]` gives a resource's count (on
one device, or on every device without `<device>`); a global resource takes the largest count given
for its name. Without any such flag, each resource has the largest count any loaded instance asks
for, so every instance can run, and some not together. Once the flag is given, a resource it does
not list has 0, and a model whose instance asks for more than its resource's count fails to load with
Triton's message ("Resource count for "R" is limited to N which will prevent scheduling of one or more
model instances, the minimum required count is M"). A name that is global in one group and per device
in another is refused too.

*Who goes first.* An idle instance with work is *staged*: it joins one server-wide queue ordered by
its execution count times its priority (`rate_limiter { priority: P }`, 0 counted as 1), so an
instance of priority 2 gets half the turns of one of priority 1, and among equals the one that ran
least goes first (Triton's `ScaledPriority`). Only the head of that queue may take its resources:
when they are not free, everyone behind it waits too, as in Triton's `AttemptAllocation`. A finished
execution gives its resources back, counts one execution for its instance, and the queue moves on.

*On our event loop.* Schedulers, and so this limiter, run on the one event loop: no locks. A
scheduler asks through its `RateGate` for one of its idle instances (`acquire`): the gate stages them
all, the queue allocates what fits, and the gate hands back one that got its resources, or None, in
which case the scheduler is called back (`wake`, one loop iteration later) when one does. Resources
held by an instance that then has nothing to run (its requests timed out or left) go back at once
(`settle`), as do a closing scheduler's (`close`). A rate-limited scheduler does not hand batches to
busy instances ahead of time: each batch is allocated on its own.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping, MutableSequence, Sequence
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError

__all__ = ["GLOBAL", "MODES", "RateGate", "RateLimiter", "parse_resource"]

MODES = ("off", "execution_count")

#: The device of a global resource, in a (name, device) pool key.
GLOBAL = -1

#: (resource name, device or GLOBAL) -> count
Pools = dict[tuple[str, int], int]

_IDLE, _STAGED, _RESERVED, _RUNNING = range(4)


class _HasInstance(Protocol):
    @property
    def instance(self) -> Any: ...


def parse_resource(text: str) -> tuple[str, int, int | None]:
    """One `--rate-limit-resource` value, `<name>:<count>` or `<name>:<count>:<device>`, as
    (name, count, device or None for every device). Raises ValueError with Triton's wording."""
    parts = text.split(":")
    problem = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(problem)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(problem) from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"{problem}: the count and the device must be non-negative integers")
    return parts[0], count, device


class _Ticket:
    """One model instance's place in the limiter."""

    __slots__ = ("label", "needs", "priority", "exec_count", "state", "seq", "wake")

    def __init__(self, label: str, needs: Pools, priority: int) -> None:
        self.label = label
        self.needs = needs
        self.priority = max(priority, 1)
        self.exec_count = 0
        self.state = _IDLE
        self.seq = 0  # of its current entry in the staging queue
        self.wake: Callable[[], None] | None = None


class RateLimiter:
    """The server's resource pools and staging queue; one per server, used only on its event loop."""

    def __init__(self, resources: Iterable[tuple[str, int, int | None]] = ()) -> None:
        #: From --rate-limit-resource: (name, device or None for every device) -> count.
        self.explicit: dict[tuple[str, int | None], int] = {}
        for name, count, device in resources:
            self.explicit[(name, device)] = max(count, self.explicit.get((name, device), 0))
        self._tickets: set[_Ticket] = set()
        self._allocated: Pools = {}
        self._staged: list[tuple[int, int, _Ticket]] = []
        self._seq = itertools.count()

    # -- registration (model load and unload) ----------------------------------------------------

    def register(self, config: mc.ModelConfig, instances: Sequence[Any]) -> RateGate:
        """Add a model version's instances; raises ModelConfigError (Triton's load error) when one
        asks for more of a resource than --rate-limit-resource gives, or names a resource both
        global and per device."""
        tickets = {}
        for instance in instances:
            group = _group_of(config, instance.name)
            limits = group.rate_limiter if group is not None else mc.ModelRateLimiter()
            placement = getattr(instance, "placement", None)
            device = getattr(placement, "gpu", None) or 0
            needs: Pools = {}
            for resource in limits.resources:
                if resource.count == 0:
                    continue
                key = (resource.name, GLOBAL if getattr(resource, "global") else device)  # a Python keyword
                needs[key] = needs.get(key, 0) + resource.count
            tickets[instance.name] = _Ticket(f"{config.name}/{instance.name}", needs, limits.priority)
        everyone = (*self._tickets, *tickets.values())
        both = {n for t in everyone for n, d in t.needs if d == GLOBAL} & {
            n for t in everyone for n, d in t.needs if d != GLOBAL
        }
        if both:  # the loaded models agreed among themselves: this one disagrees
            raise ModelConfigError(
                f'Resource "{min(both)}" is present as both global and device-specific resource in the model '
                f"configuration (model '{config.name}')."
            )
        for ticket in tickets.values():
            if self.explicit:
                for key, count in ticket.needs.items():
                    available = self._explicit_count(key)
                    if available < count:
                        raise ModelConfigError(
                            f'Resource count for "{key[0]}" is limited to {available} which will prevent scheduling '
                            f"of one or more model instances, the minimum required count is {count} (model "
                            f"'{config.name}', instance '{ticket.label.split('/', 1)[1]}'; raise "
                            f"--rate-limit-resource={key[0]}:{count})"
                        )
        self._tickets.update(tickets.values())
        return RateGate(self, tickets)

    def unregister(self, tickets: Iterable[_Ticket]) -> None:
        for ticket in tickets:
            if ticket.state in (_RESERVED, _RUNNING):
                self._give_back(ticket)
            ticket.state = _IDLE
            self._tickets.discard(ticket)
        self._allocate()

    # -- accounting ------------------------------------------------------------------------------

    def available(self, key: tuple[str, int]) -> int:
        """How many of a pool there are: --rate-limit-resource's count, else the most any instance asks."""
        if self.explicit:
            return self._explicit_count(key)
        return max((t.needs.get(key, 0) for t in self._tickets), default=0)

    def in_use(self, key: tuple[str, int]) -> int:
        return self._allocated.get(key, 0)

    def _explicit_count(self, key: tuple[str, int]) -> int:
        name, device = key
        if device == GLOBAL:
            return max((c for (n, _), c in self.explicit.items() if n == name), default=0)
        return max(self.explicit.get((name, device), 0), self.explicit.get((name, None), 0))

    def _fits(self, ticket: _Ticket) -> bool:
        return all(self._allocated.get(key, 0) + n <= self.available(key) for key, n in ticket.needs.items())

    def _give_back(self, ticket: _Ticket) -> None:
        for key, n in ticket.needs.items():
            self._allocated[key] -= n

    # -- the staging queue -----------------------------------------------------------------------

    def stage(self, ticket: _Ticket, wake: Callable[[], None]) -> None:
        if ticket.state != _IDLE:
            return
        ticket.state = _STAGED
        ticket.wake = wake
        ticket.seq = next(self._seq)
        heapq.heappush(self._staged, (ticket.exec_count * ticket.priority, ticket.seq, ticket))
        if len(self._staged) > 4 * len(self._tickets) + 64:
            # Entries of tickets that left the queue are skipped when they reach the top; behind a head
            # that waits long, requests that come and go would pile them up: drop them here.
            self._staged = [e for e in self._staged if e[2].state == _STAGED and e[2].seq == e[1]]
            heapq.heapify(self._staged)

    def unstage(self, ticket: _Ticket) -> None:
        """Leave the queue, or give back resources allocated but not used."""
        if ticket.state == _RESERVED:
            self._give_back(ticket)
            ticket.state = _IDLE
            self._allocate()
        elif ticket.state == _STAGED:
            ticket.state = _IDLE  # its queue entry is now stale and skipped

    def release(self, ticket: _Ticket, more: bool) -> None:
        """An execution ended: its resources go back and its instance counts one more execution.
        With `more` work waiting for its model, it is staged again before anyone is allocated,
        as in Triton's `OnRelease`, so its new execution count decides its place."""
        if ticket.state != _RUNNING:
            return
        self._give_back(ticket)
        ticket.exec_count += 1
        ticket.state = _IDLE
        if more and ticket.wake is not None:
            self.stage(ticket, ticket.wake)
            self._allocate(waking=ticket.wake)  # its scheduler schedules next anyway: no need to wake it
        else:
            self._allocate()

    def _allocate(self, waking: object = None) -> None:
        """Give resources to the head of the queue while it fits (Triton's `AttemptAllocation`);
        the schedulers of those allocated are called back, except `waking`'s (it is asking now)."""
        staged = self._staged
        while staged:
            _, seq, ticket = staged[0]
            if ticket.state != _STAGED or ticket.seq != seq:
                heapq.heappop(staged)
                continue
            if not self._fits(ticket):
                return
            heapq.heappop(staged)
            for key, n in ticket.needs.items():
                self._allocated[key] = self._allocated.get(key, 0) + n
            ticket.state = _RESERVED
            if ticket.wake is not None and ticket.wake != waking:
                asyncio.get_running_loop().call_soon(ticket.wake)


class RateGate:
    """One scheduler's view of the limiter: its instances' tickets, by instance name."""

    def __init__(self, limiter: RateLimiter, tickets: Mapping[str, _Ticket]) -> None:
        self._limiter = limiter
        self._tickets = dict(tickets)
        self._closed = False
        self._waiting = False  # the last acquire found no instance with its resources

    def acquire(self, idle: MutableSequence[Any], wake: Callable[[], None]) -> Any | None:
        """Take from `idle` (a deque of the scheduler's idle slots, each with `.instance`) one slot
        whose instance holds its resources now, or return None: `wake` is called when one does."""
        if self._closed:
            return None
        limiter = self._limiter
        for slot in idle:
            limiter.stage(self._tickets[slot.instance.name], wake)
        limiter._allocate(waking=wake)
        for slot in idle:
            ticket = self._tickets[slot.instance.name]
            if ticket.state == _RESERVED:
                ticket.state = _RUNNING
                idle.remove(slot)
                self._waiting = False
                return slot
        self._waiting = True
        return None

    def settle(self, idle: Iterable[_HasInstance]) -> None:
        """End of a scheduling pass. Unless the pass ended waiting for resources, the scheduler has
        nothing for its idle instances: they leave the queue and give back resources allocated to them."""
        if self._waiting:
            self._waiting = False
            return
        for slot in idle:
            self._limiter.unstage(self._tickets[slot.instance.name])

    def release(self, slot: _HasInstance, more: bool) -> None:
        """The instance of `slot` finished its execution; `more`: its scheduler has requests queued."""
        if not self._closed:
            self._limiter.release(self._tickets[slot.instance.name], more)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._limiter.unregister(self._tickets.values())

    def executions(self, instance_name: str) -> int:
        """How many executions the limiter has counted for an instance (its priority's weight)."""
        return self._tickets[instance_name].exec_count


def _group_of(config: mc.ModelConfig, instance_name: str) -> mc.ModelInstanceGroup | None:
    # Instances are named `<group>_<c>` (backends/placement.py); an unnamed group `i` is `<model>_<i>`.
    for index, group in enumerate(config.instance_group):
        name = group.name or f"{config.name}_{index}"
        prefix, _, count = instance_name.rpartition("_")
        if prefix == name and count.isdigit():
            return group
    return None
