"""A front-end worker's copy of the trace settings (`workers/trace_relay.py`) and the core's side of
it (`Tracing.snapshot`, `Tracing.accept`): the worker samples by the copy and sends its traces in
batches; the core counts them against trace_count, numbers them and writes them as its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from reference_server.core.tracing import OFF, TIMESTAMPS, Tracing, startup_settings
from reference_server.workers.trace_relay import RelayedTracing


def test_the_snapshot_says_what_can_be_sampled(tmp_path: Path) -> None:
    core = Tracing(startup_settings((f"triton,file={tmp_path / 't.json'}", "level=TIMESTAMPS", "rate=2")))
    core.update("m", {"count": 3})
    core.update("off", {"level": OFF})
    assert core.snapshot() == {"": (TIMESTAMPS, 2, -1), "m": (TIMESTAMPS, 2, 3), "off": (OFF, 2, -1)}
    assert Tracing().snapshot() == {"": (OFF, 1000, -1)}  # no file: nothing can be taken


def test_a_worker_samples_by_its_copy_and_sends_batches() -> None:
    worker = RelayedTracing()
    assert not worker.active
    sent: list[list[Any]] = []
    worker.send = sent.append
    worker.load({"": (OFF, 1000, -1), "m": (TIMESTAMPS, 2, 2)})
    assert worker.active

    async def requests() -> None:
        for n in range(8):
            trace = worker.sample("m", 1, f"r{n}")
            if trace is not None:
                trace.start(False, 100 + n)
                trace.returned(False)
        assert worker.sample("other", 1, "x") is None  # the global setting is OFF
        await asyncio.sleep(0)

    asyncio.run(requests())
    assert [[record[2] for record in batch] for batch in sent] == [["r1", "r3"]]  # every 2nd, 2 at most
    assert not worker.active  # its count is used up
    model, version, request_id, events, tensors = sent[0][0]
    assert (model, version, events[0]) == ("m", 1, ("HTTP_RECV_START", 101))


def test_the_core_counts_numbers_and_writes_what_workers_send(tmp_path: Path) -> None:
    core = Tracing(startup_settings((f"triton,file={tmp_path / 't.json'}", "level=TIMESTAMPS", "rate=1", "count=3")))
    told: list[bool] = []
    core.used_up = lambda: told.append(True)
    own = core.sample("m", 1, "core")  # the core's own request takes id 1
    assert own is not None
    own.start(False, 1)
    own.returned(False)
    events = [("HTTP_RECV_START", 5), ("HTTP_RECV_END", 6)]
    core.accept([("m", 1, f"w{n}", events, []) for n in range(4)])  # the last one is beyond the count
    assert told == [True] and not core.active
    assert core.settings()["trace_count"] == "0"
    written = json.loads((tmp_path / "t.json.0").read_text())
    heads = [event for event in written if "model_name" in event]
    assert heads == [
        {"id": 1, "model_name": "m", "model_version": 1, "request_id": "core"},
        {"id": 2, "model_name": "m", "model_version": 1, "request_id": "w0"},
        {"id": 3, "model_name": "m", "model_version": 1, "request_id": "w1"},
    ]
    assert {"id": 2, "timestamps": [{"name": "HTTP_RECV_START", "ns": 5}]} in written
