"""A server without the statistics extension (MLServer, KServe: HTTP 404, gRPC UNIMPLEMENTED) is said
once on the console for the whole sweep, asked no more, and leaves the server-side columns out of
perf_analyzer's CSV and empty in the tidy one, as perf_analyzer writes a run without server statistics.
On virtual time, with a scripted server."""

from __future__ import annotations

from typing import Any

import pytest

from perfkit.errors import MissingExtension, TargetError
from perfkit.load.generator import FakeClock
from perfkit.load.schedule import ClosedLoop
from perfkit.measure.level import ServerStatsProbe, WindowSpec
from perfkit.report.export import render_pa_csv
from perfkit.report.tidy import render_tidy_csv
from perfkit.sweep.engine import Sweep
from perfkit.sweep.spec import LoadSpec, SweepSpec
from perfkit.target import TargetSpec
from tests.fakes import FakeClient, FakePrepared
from tests.unit.test_measure import MS, measure

HTTP_404 = "GET http://127.0.0.1:8080/v2/models/addone/stats: HTTP 404: Not Found"
UNIMPLEMENTED = "gRPC ModelStatistics at 127.0.0.1:8081: UNIMPLEMENTED: Method not found!"
MLSERVER = {"url": "127.0.0.1:8080", "embedded": False, "name": "mlserver", "version": "1.7.1", "extensions": []}


class NoStatisticsServer(FakeClient):
    """A server that answers every inference in 10 ms and has no statistics route."""

    def __init__(self, clock: FakeClock, answer: str = HTTP_404) -> None:
        super().__init__(clock, lambda now, index: 10 * MS)
        self.answer = answer
        self.statistics_calls = 0

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        self.statistics_calls += 1
        raise TargetError(self.answer)


class Notes:
    """The sweep's progress, keeping its notes (the console lines between levels)."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def level_started(self, mode: str, level: float) -> None: ...

    def window_done(self, *args: Any) -> None: ...

    def level_done(self, result: Any) -> None: ...

    def note(self, text: str) -> None:
        self.notes.append(text)


@pytest.mark.parametrize(("answer", "said"), [(HTTP_404, "HTTP 404"), (UNIMPLEMENTED, "gRPC UNIMPLEMENTED")])
async def test_a_server_without_statistics_is_said_once_for_the_whole_sweep(answer: str, said: str) -> None:
    client = NoStatisticsServer(FakeClock(), answer)
    spec = SweepSpec(target=TargetSpec(url=client.url, model="addone"), load=LoadSpec("concurrency", 1, 3, 1),
                     windows=WindowSpec(interval_ms=100, max_trials=5))  # fmt: skip
    spec.validate()
    progress = Notes()
    sweep = Sweep(
        spec, client=client, prepared=[FakePrepared("a")], model="addone", model_version="",
        provenance={"seed": 0, "server": MLSERVER}, clock=client.clock, progress=progress, on_level=lambda r, m: None,
    )  # fmt: skip
    result = await sweep.run()
    line = f"mlserver 1.7.1 has no statistics extension ({said}): no server-side latency breakdown"
    assert progress.notes == [line]  # once, not per level or window, and no error count
    assert client.statistics_calls == 1  # the answer is trusted: never asked again
    assert [level.level for level in result.levels] == [1.0, 2.0, 3.0]
    assert all(level.server is None and line in level.resources.notes for level in result.levels)
    # perf_analyzer writes its server columns only with server statistics; the tidy CSV leaves them empty.
    header = render_pa_csv(result.levels).splitlines()[0].split(",")
    assert "Client Send" in header and not [name for name in header if "Server" in name]
    tidy = render_tidy_csv(result).splitlines()
    rows = [dict(zip(tidy[0].split(","), line.split(","))) for line in tidy[1:]]
    assert len(rows) == 3 and all(row["server_queue_us"] == row["server_compute_infer_us"] == "" for row in rows)


async def test_a_server_that_lists_no_statistics_and_fails_otherwise_has_none() -> None:
    calls: list[int] = []

    async def fetch() -> dict[str, Any]:
        calls.append(0)
        raise TargetError("GET http://h/v2/models/m/stats: HTTP 400: bad request")

    probe = ServerStatsProbe(fetch, "m", "", server="canned 0", offered=False)
    m, _ = await measure(lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(interval_ms=1000), server=probe)
    assert calls == [0] and probe.missing
    assert m.result.resources.notes == (
        "canned 0 has no statistics extension (its metadata lists no statistics extension): "
        "no server-side latency breakdown",
    )


async def test_another_failure_of_a_server_that_may_have_statistics_is_asked_again_and_said_once() -> None:
    calls: list[int] = []

    async def fetch() -> dict[str, Any]:
        calls.append(0)
        raise TargetError("GET http://h/v2/models/m/stats: HTTP 503: busy")

    probe = ServerStatsProbe(fetch, "m", "", server="triton 2.51.0", offered=True)
    await measure(lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(interval_ms=1000), server=probe)
    assert len(calls) == 4 and not probe.missing  # a busy server may answer the next time
    assert probe.news() == "no server-side statistics: GET http://h/v2/models/m/stats: HTTP 503: busy"
    assert probe.news() == ""  # said once


async def test_the_wires_missing_extension_error_is_trusted_as_it_is() -> None:
    async def fetch() -> dict[str, Any]:
        raise MissingExtension("endpoint a:1: the server has no route for it", "statistics")

    probe = ServerStatsProbe(fetch, "m", "", server="fleet")
    assert await probe.snapshot() is None and probe.missing
    assert probe.news() == (
        "fleet has no statistics extension (endpoint a:1: the server has no route for it): "
        "no server-side latency breakdown"
    )
