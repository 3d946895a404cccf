"""The load generator on virtual time: exact timestamps, no sleeps."""

from __future__ import annotations

import numpy as np

from perfkit.load.generator import CANCELLED_AT_DRAIN, NOT_SENT, FakeClock, LoadGenerator
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop, OpenLoop
from tests.fakes import FakeClient, FakePrepared, NeverAnswering

MS = 1_000_000


def stalled_server(start_ns: int, end_ns: int, service_ns: int):  # type: ignore[no-untyped-def]
    """Service time `service_ns`, except that nothing completes between start and end."""

    def latency(now: int, index: int) -> int:
        done = now + service_ns
        if start_ns <= now < end_ns or start_ns <= done < end_ns:
            done = end_ns + service_ns
        return done - now

    return latency


async def run_for(gen: LoadGenerator, clock: FakeClock, load: ClosedLoop | OpenLoop, duration_ns: int) -> None:
    gen.start(load)
    await clock.sleep_until(clock.now_ns() + duration_ns)
    await gen.stop()


async def test_closed_loop_keeps_exactly_n_outstanding() -> None:
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 10 * MS)
    buffer = SampleBuffer()
    gen = LoadGenerator(client, [FakePrepared("a"), FakePrepared("b")], buffer, clock)
    await run_for(gen, clock, ClosedLoop(4), 1005 * MS)
    s = buffer.arrays()
    assert client.max_in_flight == 4
    assert np.all(s.done_ns - s.sent_ns == 10 * MS)
    assert np.array_equal(s.intended_ns, s.sent_ns)
    # 4 workers × 101 sends (at 0, 10, ..., 1000 ms); the last round was in flight at stop and
    # was drained, not dropped.
    assert len(s) == 404
    assert s.done_ns.max() == 1010 * MS
    assert {name for _, name in client.sent} == {"a", "b"}
    assert s.bytes_out.sum() == 100 * len(s)


async def test_open_loop_sends_on_schedule_and_times_from_intended() -> None:
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 5 * MS)
    buffer = SampleBuffer()
    gen = LoadGenerator(client, [FakePrepared("a")], buffer, clock)
    await run_for(gen, clock, OpenLoop(rate=100.0), 1005 * MS)
    s = buffer.arrays()
    assert s.intended_ns.tolist() == [10 * MS * (i + 1) for i in range(100)]
    assert np.array_equal(s.sent_ns, s.intended_ns)
    assert np.all(s.done_ns - s.sent_ns == 5 * MS)


async def test_open_loop_keeps_sending_through_a_stall_and_closed_loop_does_not() -> None:
    stall = (500 * MS, 1500 * MS)
    clock = FakeClock()
    open_client = FakeClient(clock, stalled_server(*stall, 5 * MS))
    open_buffer = SampleBuffer()
    await run_for(LoadGenerator(open_client, [FakePrepared("a")], open_buffer, clock), clock,
                  OpenLoop(rate=100.0), 2000 * MS)  # fmt: skip
    o = open_buffer.arrays()
    during = (o.intended_ns >= stall[0]) & (o.intended_ns < stall[1])
    assert during.sum() == 100  # the schedule was kept: 100 requests/s through the whole stall
    assert open_client.max_in_flight >= 100
    corrected = (o.done_ns - o.intended_ns)[during]
    assert corrected.max() >= 990 * MS  # the first request of the stall waited for all of it

    clock = FakeClock()
    closed_client = FakeClient(clock, stalled_server(*stall, 5 * MS))
    closed_buffer = SampleBuffer()
    await run_for(LoadGenerator(closed_client, [FakePrepared("a")], closed_buffer, clock), clock,
                  ClosedLoop(1), 2000 * MS)  # fmt: skip
    c = closed_buffer.arrays()
    sent_during = ((c.sent_ns >= stall[0]) & (c.sent_ns < stall[1])).sum()
    # Coordinated omission: one request waited out the stall; none was sent during it.
    assert sent_during == 0
    assert ((c.done_ns - c.sent_ns) >= 1000 * MS).sum() == 1


async def test_open_loop_counts_requests_beyond_the_outstanding_limit_as_not_sent() -> None:
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 10_000 * MS)
    buffer = SampleBuffer()
    gen = LoadGenerator(client, [FakePrepared("a")], buffer, clock, max_outstanding=5)
    await run_for(gen, clock, OpenLoop(rate=100.0), 100 * MS)
    s = buffer.arrays()
    assert client.max_in_flight == 5
    assert s.error_counts() == {NOT_SENT: len(s) - 5}


async def test_errors_are_recorded_by_kind() -> None:
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: MS, error=lambda i: "HTTP 503" if i % 4 == 0 else "")
    buffer = SampleBuffer()
    await run_for(LoadGenerator(client, [FakePrepared("a")], buffer, clock), clock, ClosedLoop(1), 100 * MS)
    s = buffer.arrays()
    assert s.error_counts() == {"HTTP 503": (len(s) + 3) // 4}
    assert int(s.ok.sum()) == len(s) - (len(s) + 3) // 4


async def test_requests_unanswered_at_the_drain_timeout_are_recorded_as_cancelled() -> None:
    clock = FakeClock()
    client = NeverAnswering()
    buffer = SampleBuffer()
    gen = LoadGenerator(client, [FakePrepared("a")], buffer, clock)
    gen.start(OpenLoop(rate=100.0))
    await clock.sleep_until(55 * MS)
    await gen.stop(drain_timeout_s=0.01)
    s = buffer.arrays()
    assert client.sent == len(s) == 5  # sent at 10, 20, ..., 50 ms; each recorded once
    assert s.error_counts() == {CANCELLED_AT_DRAIN: 5}
    assert np.array_equal(s.intended_ns, s.sent_ns)
    assert sorted(s.sent_ns.tolist()) == [10 * MS * (i + 1) for i in range(5)]
    assert (s.done_ns >= 55 * MS).all() and (s.bytes_out == 100).all()  # ended at the drain, after the stop
    assert gen.outstanding == 0


async def test_sync_lets_an_open_loop_send_due_soon_go_first() -> None:
    """A window's figures are taken after `sync`: a send due within QUIET_NS leaves before, so the
    figures never hold it; one due later does not hold the figures up."""
    from perfkit.load.generator import QUIET_NS

    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 1 * MS)
    buffer = SampleBuffer()
    gen = LoadGenerator(client, [FakePrepared("a")], buffer, clock)
    period = 100 * MS  # sends at 100, 200, ... ms
    gen.start(OpenLoop(rate=10.0))
    await clock.sleep_until(period - QUIET_NS // 2)  # the first send is due within QUIET_NS
    await gen.sync()
    assert clock.now_ns() == period and [sent for sent, _ in client.sent] == [period]
    await clock.sleep_until(period + 2 * MS)  # the next send is a period away: no wait
    before = clock.now_ns()
    await gen.sync()
    assert clock.now_ns() == before
    await gen.stop()
    # Stopped: nothing is due, and sync never waits.
    await gen.sync()
