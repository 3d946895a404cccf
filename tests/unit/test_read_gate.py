"""ReadGate: which HTTP connections the server reads while it is full, with stand-in transports."""

from __future__ import annotations

import pytest

from reference_server.frontends.http import read_gate
from reference_server.frontends.http.read_gate import ReadGate


class Transport:
    def __init__(self, name: str) -> None:
        self.name = name
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def __repr__(self) -> str:
        return self.name


def connections(gate: ReadGate, n: int) -> list[Transport]:
    transports = [Transport(f"c{i}") for i in range(n)]
    for transport in transports:
        gate.connection_made(transport)
    return transports


def paused(transports: list[Transport]) -> list[str]:
    return [t.name for t in transports if t.paused]


def test_closing_pauses_every_connection_but_those_being_served() -> None:
    gate = ReadGate(4)
    c = connections(gate, 6)
    with gate.serving(c[0]), gate.serving(c[1]):
        gate.inflight_changed(3)
        assert not gate.closed and paused(c) == []
        gate.inflight_changed(4)
        assert gate.closed and gate.closings == 1
        assert paused(c) == ["c2", "c3", "c4", "c5"]  # a request being served may still read its body
        late = connections(gate, 1)
        assert paused(late) == ["c0"]  # new connections wait too
    # Their requests ended while the gate is closed: they queue behind the others.
    assert paused(c) == ["c0", "c1", "c2", "c3", "c4", "c5"]


def test_connections_resume_oldest_first_as_far_as_there_is_room() -> None:
    gate = ReadGate(4)
    c = connections(gate, 8)
    gate.inflight_changed(4)
    assert gate.waiting == 8
    gate.inflight_changed(3)
    assert gate.waiting == 8  # above half the mark: nothing yet
    gate.inflight_changed(2)
    assert paused(c) == ["c2", "c3", "c4", "c5", "c6", "c7"]  # room for 4 - 2
    gate.inflight_changed(2)
    assert gate.waiting == 6  # the two resumed hold their room until their requests arrive
    with gate.serving(c[0]):  # ... as this one does now
        gate.inflight_changed(3)
        gate.inflight_changed(2)
        assert paused(c) == ["c3", "c4", "c5", "c6", "c7"]
    assert paused(c) == ["c0", "c3", "c4", "c5", "c6", "c7"]  # served, so back of the queue
    gate.inflight_changed(0)  # room for 4, less c1 and c2, resumed and not heard from yet
    assert paused(c) == ["c0", "c5", "c6", "c7"] and gate.closed


def test_the_gate_opens_once_no_connection_waits() -> None:
    gate = ReadGate(4)
    c = connections(gate, 3)
    gate.inflight_changed(4)
    gate.inflight_changed(1)
    assert paused(c) == [] and not gate.closed
    more = connections(gate, 2)
    assert paused(more) == []


def test_a_resumed_connection_that_stays_quiet_stops_holding_room(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(read_gate.time, "monotonic", lambda: now[0])
    gate = ReadGate(4)
    c = connections(gate, 6)
    gate.inflight_changed(4)
    gate.inflight_changed(2)
    assert paused(c) == ["c2", "c3", "c4", "c5"]
    now[0] += read_gate.RESUMED_GRACE_S * 2  # c0 and c1 were idle keep-alive connections
    gate.inflight_changed(2)
    assert paused(c) == ["c4", "c5"]


def test_a_request_read_just_before_the_gate_closed_is_read_to_its_end() -> None:
    gate = ReadGate(2)
    c = connections(gate, 2)
    gate.inflight_changed(2)  # its admission closed the gate, before it was marked served
    assert paused(c) == ["c0", "c1"]
    with gate.serving(c[1]):
        assert paused(c) == ["c0"]
    assert paused(c) == ["c0", "c1"]


def test_lost_connections_leave_the_queue_and_free_their_room() -> None:
    gate = ReadGate(4)
    c = connections(gate, 5)
    gate.inflight_changed(4)
    gate.inflight_changed(2)  # c0 and c1 resumed
    gate.connection_lost(c[0])
    assert paused(c) == ["c3", "c4"]  # its room went to c2
    for transport in c[1:]:
        gate.connection_lost(transport)
    assert gate.waiting == 0 and not gate.closed


def test_a_mark_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ReadGate(1)
