"""perfkit.load.fleet (`-u A,B`) with scripted endpoint clients: round-robin sends, each endpoint's
own record, the control plane over every endpoint, the statistics summed; each endpoint's figures
and their rows in the tidy CSV and on the console."""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
from typing import Any

import pytest

from perfkit.analysis.stats import endpoint_figures
from perfkit.errors import ExitCode, TargetError
from perfkit.load.fleet import FleetClient, FleetPrepared, sum_statistics
from perfkit.load.generator import FakeClock
from perfkit.load.samples import SampleBuffer
from perfkit.report.export import render_endpoint_table
from perfkit.report.html import sweep as sweep_section
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.files import ReportItem
from perfkit.results.model import LatencyStats, sweep_from_json, sweep_to_json
from perfkit.sweep.engine import Sweep
from perfkit.sweep.run import exit_code
from perfkit.sweep.spec import LoadSpec, SweepSpec, WindowSpec
from perfkit.target import TargetSpec
from perfkit.wire.client import Outcome, Prepared
from tests.fakes import FakePrepared
from tests.unit.test_composing import pa_levels
from tests.unit.test_export import make_level, make_sweep
from tests.unit.test_server_stats import entry, response
from tests.unit.test_sweep import QueueingServer, RecordingProgress, Saved
from v2kit import codec as v2


class Endpoint:
    """An InferClient of one endpoint whose answers are scripted."""

    protocol = "http"

    def __init__(self, url: str, *, live: bool | Exception = True, error: str = "") -> None:
        self.url = url
        self._live = live
        self._error = error
        self.sent: list[bytes] = []
        self.stats = response(entry("1", 10 if url.endswith("1") else 30, batches={1: 4, 2: 3}))
        self.closed = False

    def prepare(self, request: v2.InferRequest) -> Prepared:
        return Prepared(self.url.encode(), 7)

    async def send(self, prepared: Prepared) -> Outcome:
        self.sent.append(prepared.payload)
        return Outcome(self._error, 3, 1, 2)

    async def live(self) -> bool:
        if isinstance(self._live, Exception):
            raise self._live
        return self._live

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        return self.stats

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        if self.url.endswith("2"):
            raise RuntimeError(f"HTTP 400: Request for unknown model: '{model}' is not found")
        return {"name": model}

    async def close(self) -> None:
        self.closed = True


def fleet(*endpoints: Endpoint) -> FleetClient:
    ticks = itertools.count(0, 1000)
    return FleetClient(endpoints, clock=lambda: next(ticks))  # type: ignore[arg-type]


async def test_requests_go_round_robin_and_each_endpoint_keeps_its_own_record() -> None:
    a, b, c = Endpoint("h:1"), Endpoint("h:2", error="connection refused"), Endpoint("h:3")
    client = fleet(a, b, c)
    assert client.url == "h:1,h:2,h:3" and client.protocol == "http"
    prepared = client.prepare(v2.InferRequest("mlp", inputs=[]))
    assert prepared.bytes_out == 7 and [p.payload for p in prepared.parts] == [b"h:1", b"h:2", b"h:3"]
    outcomes = [await client.send(prepared) for _ in range(7)]
    assert [len(e.sent) for e in (a, b, c)] == [3, 2, 2]
    assert all(sent == [e.url.encode()] * len(sent) for e in (a, b, c) for sent in [e.sent])
    assert [o.error for o in outcomes][:3] == ["", "connection refused", ""]
    first = client.buffers[0].arrays()
    assert first.sent_ns.tolist() == [0, 6000, 12000] and (first.done_ns - first.sent_ns).tolist() == [1000] * 3
    assert client.buffers[1].arrays().error_counts() == {"connection refused": 2}
    await client.close()
    assert a.closed and b.closed and c.closed


async def test_the_control_plane_names_the_endpoint_that_fails() -> None:
    with pytest.raises(TargetError, match=r"endpoint h:2 of -u answers but is not live"):
        await fleet(Endpoint("h:1"), Endpoint("h:2", live=False)).live()
    refused = ConnectionRefusedError("connection refused")
    with pytest.raises(TargetError, match=r"^endpoint h:2: connection refused$"):
        await fleet(Endpoint("h:1"), Endpoint("h:2", live=refused)).live()
    with pytest.raises(TargetError, match=r"endpoint h:2: HTTP 400: Request for unknown model: 'mlp'"):
        await fleet(Endpoint("h:1"), Endpoint("h:2")).model_config("mlp")
    with pytest.raises(ValueError, match="at least two"):
        FleetClient([Endpoint("h:1")])  # type: ignore[list-item]


async def test_statistics_are_summed_over_endpoints() -> None:
    summed = await fleet(Endpoint("h:1"), Endpoint("h:3")).model_statistics("mlp")
    (mlp,) = summed["model_stats"]
    assert mlp["inference_count"] == 40 and mlp["inference_stats"]["success"] == {"count": 40, "ns": 40_000_000}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in mlp["batch_stats"]] == [(1, 8), (2, 6)]
    assert mlp["last_inference"] == 1_700_000_000_000 and mlp["version"] == "1"
    # gRPC JSON writes counters as strings; a model one endpoint lacks is kept as the other has it.
    as_grpc = response({**entry("1", 5), "inference_count": "5"}, entry("1", 2, name="only-here"))
    again = sum_statistics([summed, as_grpc])
    assert {e["name"]: e["inference_count"] for e in again["model_stats"]} == {"mlp": 45, "only-here": 2}


def test_endpoint_figures_and_their_rows() -> None:
    buffer = SampleBuffer()
    for i in range(10):  # 1 ms each, the last two failed, one completing after the span
        buffer.record(i * 100_000_000, i * 100_000_000, i * 100_000_000 + 1_000_000, "timeout" if i >= 8 else "")
    figures = endpoint_figures("h:1", buffer.arrays(), 0, 900_000_000, batch_size=2)
    assert (figures.request_count, figures.ok_count, figures.errors) == (9, 8, {"timeout": 1})
    assert figures.throughput_infer_per_s == pytest.approx(8 * 2 / 0.9)
    assert figures.latency.p50_us == pytest.approx(1000.0) and figures.latency.count == 8
    other = dataclasses.replace(figures, url="h:2", errors={}, error_count=0, latency=LatencyStats())
    level = make_level(endpoints=(figures, other))
    sweep = dataclasses.replace(make_sweep((level,)), url="h:1,h:2")
    assert sweep_from_json(sweep_to_json(sweep)) == sweep
    table = render_endpoint_table(sweep.levels)
    assert [line.split()[:3] for line in table[2:]] == [
        ["1", "h:1", "17.8"],
        ["1", "h:2", "17.8"],
        ["1", "total", "581.1"],
    ]
    assert table[2].split()[-3:] == ["9", "timeout", "×1"] and table[3].split()[3:5] == ["-", "-"]
    rows = list(csv.reader(io.StringIO(render_tidy_csv(sweep))))
    at = rows[0].index("endpoint"), rows[0].index("request_count"), rows[0].index("server_queue_us")
    assert [[row[i] for i in at] for row in rows[1:]] == [
        ["h:1,h:2", "1005", "1170.99"],
        ["h:1", "9", ""],
        ["h:2", "9", ""],
    ]
    assert render_endpoint_table((make_level(),)) == []


class NoPlots:
    """The report's figures left out: this test reads its tables."""

    def __getattr__(self, name: str) -> Any:
        empty = "" if name.endswith("_title") else b""
        return lambda *args, **kwargs: empty


def test_the_html_report_shows_endpoints_and_composing_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_section, "figures", NoPlots())
    buffer = SampleBuffer()
    buffer.record(0, 0, 1_000_000)
    share = endpoint_figures("h:1", buffer.arrays(), 0, 10**9, batch_size=1)
    levels = tuple(
        dataclasses.replace(lv, endpoints=(share, dataclasses.replace(share, url="h:2"))) for lv in pa_levels()
    )
    sweep = dataclasses.replace(make_sweep(levels), url="h:1,h:2", model="mlp_pipeline")
    section = sweep_section.render_sweep_section(ReportItem("run", "sweep", sweep, "run.json"))
    assert "<h3>Endpoints</h3>" in section and "<td>h:2</td>" in section
    assert "<h3>Composing models (server side)</h3>" in section and "<td>preprocess</td>" in section


async def test_a_sweep_over_two_endpoints_names_the_one_that_stopped_answering() -> None:
    clock = FakeClock()
    alive, dead = QueueingServer(clock, 5.0), QueueingServer(clock, 5.0, error=lambda i: "connection refused")
    alive.url, dead.url = "fake:1", "fake:2"
    client = FleetClient([alive, dead], clock=clock.now_ns)  # type: ignore[list-item]
    spec = SweepSpec(target=TargetSpec(url=client.url, model="m"), load=LoadSpec("concurrency", 2, 2, 1),
                     windows=WindowSpec(interval_ms=100, max_trials=3))  # fmt: skip
    progress, saved = RecordingProgress(), Saved()
    prepared = FleetPrepared(b"", 100, parts=(FakePrepared("a"), FakePrepared("a")))  # type: ignore[arg-type]
    sweep = Sweep(spec, client=client, prepared=[prepared], model="m", model_version="", provenance={},
                  clock=clock, progress=progress, on_level=saved)  # fmt: skip
    result = await sweep.run()
    (level,) = result.levels
    first, second = level.endpoints
    assert (first.url, second.url) == ("fake:1", "fake:2")
    assert first.ok_count == level.ok_count > 0 and first.error_count == 0
    assert second.ok_count == 0 and second.errors == {"connection refused": second.request_count}
    assert first.request_count + second.request_count == level.request_count
    assert progress.named("note") == [
        f"endpoint fake:2 answered none of its {second.request_count} requests (connection refused ×{second.request_count})"
    ]
    assert saved.results[-1].levels[0].endpoints == level.endpoints  # on disk with its endpoints
    assert exit_code(result) == ExitCode.ERRORS
