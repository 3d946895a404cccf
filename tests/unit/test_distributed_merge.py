"""perfkit.load.cluster.distributed without Ray: load shares, clock alignment, the sample merge, and whole levels on
fake workers in virtual time, each worker on a clock of its own, compared with one process; then the
per-worker figures in the JSON and the HTML report, and the error when Ray is missing."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import pickle

import numpy as np
import pytest

from perfkit.errors import PerfkitError
from perfkit.load.cluster.distributed import (
    DistributedLoadGenerator,
    DistributedSpec,
    align_clock,
    merge_samples,
    split_load,
)
from perfkit.load.generator import FakeClock, LoadGenerator
from perfkit.load.samples import Sample, SampleArrays, SampleBuffer, SequenceArrays
from perfkit.load.schedule import ClosedLoop, Load, OpenLoop, ScheduleStream, build_schedule
from perfkit.measure.level import LevelMeasurement, WindowSpec, measure_level
from perfkit.report.html import render_html
from perfkit.results.files import ReportItem
from perfkit.results.model import WorkerFigures, sweep_from_json, sweep_to_json
from perfkit.sweep.spec import LoadSpec, SweepSpec
from perfkit.target import TargetSpec
from tests.fakes import FakeClient, FakePrepared
from tests.synthetic import make_level, make_sweep

MS = 1_000_000
S = 1_000_000_000
WINDOWS = WindowSpec(interval_ms=1000, stability_pct=1000)  # three 1 s windows, then stable


class OffsetClock:
    """A worker's clock: the shared virtual time plus a fixed offset."""

    def __init__(self, base: FakeClock, offset_ns: int) -> None:
        self.base = base
        self.offset_ns = offset_ns

    def now_ns(self) -> int:
        return self.base.now_ns() + self.offset_ns

    async def sleep_until(self, t_ns: int) -> None:
        await self.base.sleep_until(t_ns - self.offset_ns)


class FakeWorker:
    """A WorkerLink whose worker runs in this process on its own offset clock; `die()` kills it."""

    def __init__(self, base: FakeClock, offset_ns: int, latency_ns: int) -> None:
        self.clock = OffsetClock(base, offset_ns)
        self.client = FakeClient(self.clock, lambda now, i: latency_ns)  # type: ignore[arg-type]
        self.buffer = SampleBuffer()
        self.loadgen = LoadGenerator(self.client, [FakePrepared("a")], self.buffer, self.clock)
        self.taken = 0
        self.dead = False
        self.loads: list[Load | None] = []

    def die(self) -> None:
        self.dead = True
        asyncio.get_running_loop().create_task(self.loadgen.stop(0))

    def _answer(self) -> None:
        if self.dead:
            raise ConnectionError("the actor died")

    async def open(self) -> tuple[str, int]:
        return "fakehost", 1

    async def now_ns(self) -> int:
        self._answer()
        return self.clock.now_ns()

    async def start(self, load: Load | None, start_ns: int) -> None:
        self._answer()
        self.loads.append(load)
        await self.clock.sleep_until(start_ns)
        if load is not None:
            self.loadgen.start(load)
            self.loadgen.started_ns = start_ns

    async def take(self) -> SampleArrays:
        self._answer()
        arrays = self.buffer.arrays(self.taken)
        self.taken += len(arrays)
        return arrays

    async def stop(self, drain_timeout_s: float | None) -> float | None:
        self._answer()
        await self.loadgen.stop(drain_timeout_s)
        return 42.0

    async def close(self) -> None:
        pass

    def kill(self) -> None:
        self.dead = True


async def distributed_level(load: Load, offsets: list[int], latency_ns: int = 10 * MS) -> tuple[
    LevelMeasurement, DistributedLoadGenerator, list[FakeWorker]
]:  # fmt: skip
    clock = FakeClock(start_ns=7 * S)
    workers = [FakeWorker(clock, offset, latency_ns) for offset in offsets]
    generator = DistributedLoadGenerator(workers, clock)
    await generator.open()
    measurement = await measure_level(generator, load, WINDOWS, batch_size=1)
    annotated = generator.annotate(measurement.result, measurement.samples, WINDOWS.stable_window_count)
    return dataclasses.replace(measurement, result=annotated), generator, workers


async def single_level(load: Load, latency_ns: int = 10 * MS) -> LevelMeasurement:
    clock = FakeClock(start_ns=7 * S)
    client = FakeClient(clock, lambda now, i: latency_ns)
    loadgen = LoadGenerator(client, [FakePrepared("a")], SampleBuffer(), clock)
    return await measure_level(loadgen, load, WINDOWS, batch_size=1)


@pytest.mark.parametrize(
    "load",
    [
        OpenLoop(rate=250.0, distribution="constant"),
        OpenLoop(rate=333.0, distribution="poisson", seed=11),
        OpenLoop(intervals_ns=(1 * MS, 3 * MS, 2 * MS)),
    ],
    ids=["constant", "poisson", "intervals"],
)
@pytest.mark.parametrize("parts", [2, 3])
def test_the_shares_of_a_schedule_are_disjoint_and_together_are_the_schedule(load: OpenLoop, parts: int) -> None:
    whole = build_schedule(load, 3000 * parts)
    shares = []
    for part in range(parts):
        stream = ScheduleStream(dataclasses.replace(load, share=(part, parts)))
        # Chunks of another size than the whole's: a share must not depend on how it is read.
        shares.append(np.concatenate([stream.next_chunk(1000) for _ in range(3)]))
        assert np.array_equal(shares[-1], whole[part::parts])
    assert np.array_equal(np.sort(np.concatenate(shares)), whole)


def test_closed_loop_concurrency_is_split_with_the_remainder_to_the_first_workers() -> None:
    assert split_load(ClosedLoop(5), 2) == [ClosedLoop(3), ClosedLoop(2)]
    assert split_load(ClosedLoop(7), 3) == [ClosedLoop(3), ClosedLoop(2), ClosedLoop(2)]
    assert split_load(ClosedLoop(1), 3) == [ClosedLoop(1), None, None]
    rate = OpenLoop(rate=10.0)
    assert split_load(rate, 2) == [dataclasses.replace(rate, share=(0, 2)), dataclasses.replace(rate, share=(1, 2))]


async def test_clock_alignment_keeps_the_round_trip_with_the_least_delay() -> None:
    driver_times = iter([100, 130, 200, 204, 300, 350])  # round trips of 30, 4 and 50 ns
    worker_times = iter([5_000, 5_102, 5_320])

    async def remote() -> int:
        return next(worker_times)

    alignment = await align_clock(lambda: next(driver_times), remote, rounds=3)
    assert alignment.rtt_ns == 4
    assert alignment.offset_ns == 5_102 - 202
    assert alignment.uncertainty_ns == 2


def test_merge_moves_worker_times_to_the_driver_clock_and_keeps_error_kinds() -> None:
    worker = SampleBuffer()
    worker.record(1_000, 1_010, 1_500, "", 10, 20, 3, 4)
    worker.record(2_000, 2_000, 2_700, "HTTP 503", 10, 0, 3, 4)
    driver = SampleBuffer()
    driver.record(0, 0, 1, "timeout")
    merge_samples(driver, worker.arrays(), offset_ns=900)
    merged = driver.arrays(1)
    assert merged.intended_ns.tolist() == [100, 1_100]
    assert merged.sent_ns.tolist() == [110, 1_100]
    assert merged.done_ns.tolist() == [600, 1_800]
    assert merged.send_ns.tolist() == [3, 3]  # durations are not moved
    assert [s.error for s in merged.samples()] == ["", "HTTP 503"]


async def test_a_closed_loop_over_two_skewed_workers_measures_what_one_process_does() -> None:
    distributed, generator, workers = await distributed_level(ClosedLoop(4), offsets=[5 * S, -3 * S])
    single = await single_level(ClosedLoop(4))
    d, s = distributed.result, single.result
    assert [w.loads for w in workers] == [[ClosedLoop(2)], [ClosedLoop(2)]]
    # 4 outstanding × 10 ms over three 1 s windows, less the first 10 ms, when nothing completes.
    assert d.ok_count == s.ok_count == 1196
    assert d.throughput_infer_per_s == pytest.approx(s.throughput_infer_per_s)
    assert d.latency == s.latency
    assert [f.request_count for f in d.workers] == [598, 598]
    assert [f.clock_offset_us for f in d.workers] == [5e6, -3e6]
    assert [f.cpu_pct for f in d.workers] == [42.0, 42.0]
    assert d.checks[-1].name == "workers" and d.checks[-1].passed
    # Every merged sample lies on the driver's clock: inside the level, never in a worker's.
    assert distributed.samples.done_ns.min() >= generator.start_ns


async def test_open_loop_shares_merge_into_exactly_the_schedule_asked_for() -> None:
    load = OpenLoop(rate=200.0, distribution="poisson", seed=3)
    distributed, generator, workers = await distributed_level(load, offsets=[123_456_789, -42])
    intended = np.sort(distributed.samples.intended_ns) - generator.start_ns
    assert np.array_equal(intended, build_schedule(load, len(intended)))
    assert [w.loads[0] for w in workers] == [dataclasses.replace(load, share=(k, 2)) for k in range(2)]
    single = await single_level(load)
    assert distributed.result.ok_count == single.result.ok_count
    assert distributed.result.latency_from_intended == single.result.latency_from_intended


async def test_a_worker_that_dies_mid_level_keeps_its_samples_and_flags_the_level() -> None:
    clock = FakeClock()
    workers = [FakeWorker(clock, 0, 10 * MS), FakeWorker(clock, 0, 10 * MS)]
    generator = DistributedLoadGenerator(workers, clock)
    await generator.open()

    async def kill_later() -> None:
        await clock.sleep_until(generator.start_ns + 1500 * MS)
        workers[1].die()

    killer = asyncio.get_running_loop().create_task(kill_later())
    measurement = await measure_level(generator, ClosedLoop(2), WINDOWS, batch_size=1)
    await killer
    result = generator.annotate(measurement.result, measurement.samples, WINDOWS.stable_window_count)
    check = result.checks[-1]
    assert check.name == "workers" and not check.passed
    first, second = result.workers
    assert (first.died, first.request_count) == ("", 299)  # 1 outstanding × 10 ms × 3 s, less the first 10 ms
    # What it completed since the last pull (every 100 ms) died with it; the rest is kept.
    assert second.died.startswith("1.50 s into the level") and 130 <= second.request_count < 150
    assert (
        f"worker 2 of 2 died 1.50 s into the level (pull failed: ConnectionError: the actor died); its "
        f"{second.request_count} samples up to then are kept" == check.detail
    )
    assert not result.valid and result.ok_count == 299 + second.request_count
    # The survivor carries the next level alone.
    assert [w.index for w in generator.alive] == [0]
    remeasured = await measure_level(generator, ClosedLoop(2), WINDOWS, batch_size=1)
    again = generator.annotate(remeasured.result, remeasured.samples, 3)
    assert workers[0].loads[-1] == ClosedLoop(2)
    assert again.checks[-1].passed and again.workers[1].died.startswith("in an earlier level")


def test_bad_distributed_settings_are_usage_errors_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real_find_spec(name))
    spec = SweepSpec(TargetSpec(url="127.0.0.1:8000"), LoadSpec("concurrency"), distributed=DistributedSpec(workers=2))
    with pytest.raises(PerfkitError, match=r"--workers needs Ray: pip install 'perfkit\[distributed\]'"):
        spec.validate()
    SweepSpec(TargetSpec(url="127.0.0.1:8000"), LoadSpec("concurrency")).validate()  # one worker needs no Ray
    monkeypatch.undo()
    with pytest.raises(PerfkitError, match="--ray-address.*-u HOST:PORT"):
        SweepSpec(TargetSpec(url=None), LoadSpec("concurrency"), distributed=DistributedSpec(1, "head:6379")).validate()


def test_worker_figures_survive_json_and_old_files_without_them_still_load() -> None:
    figures = WorkerFigures(2, "node-b", "concurrency 2", 10, 9, 1, 9.0, -12.5, 40.0, 55.0, "1.20 s into the level: x")
    level = dataclasses.replace(make_level(4, [100.0, 100.0, 100.0]), workers=(figures,))
    result = make_sweep([level])
    assert sweep_from_json(sweep_to_json(result)).levels[0].workers == (figures,)
    old = json.loads(sweep_to_json(make_sweep([make_level(4, [100.0, 100.0, 100.0])])))
    for entry in old["levels"]:
        del entry["workers"]
    assert sweep_from_json(json.dumps(old)).levels[0].workers == ()


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_the_html_report_shows_a_worker_table_only_for_distributed_runs() -> None:
    figures = WorkerFigures(1, "node-<a>", "concurrency 3", 10, 10, 0, 10.0, 3.0, 40.0, None, "")
    distributed = make_sweep([dataclasses.replace(make_level(3, [10.0, 10.0, 10.0]), workers=(figures,))])
    page = render_html([ReportItem("run", "sweep", distributed)])
    assert "<h3>Load workers</h3>" in page and "node-&lt;a&gt;" in page and "concurrency 3" in page
    plain = render_html([ReportItem("run", "sweep", make_sweep([make_level(3, [10.0, 10.0, 10.0])]))])
    assert "Load workers" not in plain


async def test_warmup_and_count_windows_see_the_workers_samples_as_they_are_pulled() -> None:
    clock = FakeClock()
    workers = [FakeWorker(clock, 1 * S, 10 * MS), FakeWorker(clock, -1 * S, 10 * MS)]
    generator = DistributedLoadGenerator(workers, clock)
    await generator.open()
    spec = WindowSpec(mode="count_windows", request_count=500, warmup_request_count=100, stability_pct=1000)
    result = (await measure_level(generator, ClosedLoop(4), spec, batch_size=1)).result
    # 400 completions a second: the warm-up ends after about 0.25 s, each window after 500 completions
    # (pulled every 100 ms, so a window may end up to one pull later).
    assert [w.request_count >= 500 for w in result.windows] == [True, True, True]
    assert all(w.end_ns - w.start_ns <= 1400 * MS for w in result.windows)
    assert result.windows[0].start_ns - generator.start_ns >= 250 * MS


def test_samples_pickle_as_ray_sends_them_compiled_or_not() -> None:
    """Load workers send their samples to the driver pickled: a frozen dataclass compiled by mypyc
    refuses the default unpickling (field by field), so each one pickles by its constructor."""
    buffer = SampleBuffer()
    buffer.record(1, 2, 3, "", 4, 5)
    buffer.record(6, 7, 9, "HTTP 503", 4, 0)
    arrays = pickle.loads(pickle.dumps(buffer.arrays()))
    assert (list(arrays.done_ns), arrays.error_names, list(arrays.error_kind)) == ([3, 9], ("", "HTTP 503"), [0, 1])
    sample = Sample(1, 2, 3, "timeout", 4, 5, gaps_ns=(1, 2))
    assert pickle.loads(pickle.dumps(sample)) == sample
    ends = np.array([5], dtype=np.int64)
    sequences = pickle.loads(pickle.dumps(SequenceArrays(ends, ends, np.array([True]), ends)))
    assert list(sequences.done_ns) == [5] and bool(sequences.ok[0])
