"""A scripted client for timing tests: latencies and errors given in advance, time from a FakeClock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from perfkit.load.generator import FakeClock


@dataclass(frozen=True, slots=True)
class FakeOutcome:
    error: str
    bytes_in: int
    send_ns: int = 0
    recv_ns: int = 0
    message: str = ""
    response_ns: tuple[int, ...] | None = None  # streamed requests only
    tokens: tuple[int, ...] = ()
    text: str = ""  # a generative answer's text


@dataclass(frozen=True, slots=True)
class FakePrepared:
    name: str
    bytes_out: int = 100


class FakeClient:
    """`latency(now_ns, index)` gives each request's service time; `error(index)` its error kind."""

    url = "fake:0"
    protocol = "fake"

    def __init__(
        self,
        clock: FakeClock,
        latency: Callable[[int, int], int],
        error: Callable[[int], str] = lambda index: "",
    ) -> None:
        self.clock = clock
        self.latency = latency
        self.error = error
        self.sent: list[tuple[int, str]] = []  # (send time, prepared name)
        self.in_flight = 0
        self.max_in_flight = 0

    async def send(self, prepared: FakePrepared) -> FakeOutcome:
        index = len(self.sent)
        now = self.clock.now_ns()
        self.sent.append((now, prepared.name))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.clock.sleep_until(now + self.latency(now, index))
        finally:
            self.in_flight -= 1
        return FakeOutcome(self.error(index), 10)


class NeverAnswering:
    """A client whose requests are never answered, in virtual time or real (a server that took them
    and went silent): only a cancellation ends them."""

    url = "fake:0"
    protocol = "fake"

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, prepared: FakePrepared) -> FakeOutcome:
        self.sent += 1
        await asyncio.Event().wait()
        raise AssertionError("never answered")
