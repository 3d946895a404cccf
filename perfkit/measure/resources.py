"""Resource usage during a load level: client CPU, server CPU and GPUs, sampled in the background.

A `ResourceSampler` takes a reading every `interval_s` on an asyncio task: the CPU time of this
process and its children (psutil; the server's process tree excluded when the server is our
child), the server's CPU (psutil on `server_pid`, or `nv_cpu_utilization` from its metrics), local
GPUs through NVML (`v2kit.runtime.gpu.read_gpus`), and, given metrics URLs (--metrics-url,
repeatable: each server of a fleet, a DCGM exporter), the GPU gauges each one serves
(`measure.prometheus`: Triton's `nv_gpu_*`, DCGM's `DCGM_FI_DEV_*`). A URL whose scrapes hold no
GPU figures is said once, in the log, and in each level's notes. Blocking reads (psutil, NVML) run in a worker thread so that the event loop,
which is also the load generator's, is not held up; the timestamp is taken right after the CPU
reads so that CPU-time and wall-time deltas match.

`usage_between` aggregates the readings taken in a span as perf_analyzer's `MergeMetrics` does:
GPU utilization and power are means, used memory the maximum, total memory the first value.
CPU figures from psutil are rates between the first and last reading in the span
(Δcpu time / Δwall time, a time-weighted mean); `nv_cpu_utilization` is averaged as a gauge.
Nothing here raises on a missing GPU, a dead server or a failed scrape: those become `notes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from perfkit.measure.prometheus import GpuSample, parse_metrics
from perfkit.results.model import ResourceUsage
from v2kit.runtime.gpu import read_gpus

log = logging.getLogger(__name__)

Fetch = Callable[[str], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Reading:
    t_ns: int
    client_cpu_s: float | None  # cumulative user+system of the client's processes
    server_cpu_s: float | None = None  # cumulative, psutil on server_pid
    server_cpu_pct: float | None = None  # nv_cpu_utilization × 100
    gpus: dict[str, GpuSample] = field(default_factory=dict)
    scraped: bool | None = None  # None: nothing to scrape; False: a scrape failed
    errors: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # the metrics URLs whose scrape failed
    without_gpus: tuple[str, ...] = ()  # the metrics URLs scraped that served no GPU figures


def _cpu_s(proc: psutil.Process, with_waited_children: bool = False) -> float:
    t = proc.cpu_times()
    total = float(t.user + t.system)
    if with_waited_children:
        total += float(t.children_user + t.children_system)
    return total


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def _sum_cpu_s(processes: Iterable[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        with contextlib.suppress(psutil.Error):  # a child may exit while we read
            total += _cpu_s(proc)
    return total


def client_cpu_seconds(exclude_pid: int | None = None) -> float:
    """CPU time of this process, its waited-for children and its live descendants, except the
    process tree of `exclude_pid` (the server, when it is our child)."""
    me = psutil.Process()
    excluded: set[int] = set()
    if exclude_pid is not None:
        with contextlib.suppress(psutil.Error):
            excluded = {p.pid for p in _tree(psutil.Process(exclude_pid))}
    children = [p for p in _tree(me)[1:] if p.pid not in excluded]
    return _cpu_s(me, with_waited_children=True) + _sum_cpu_s(children)


def process_cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` and its live descendants; raises psutil.Error when it is gone."""
    proc = psutil.Process(pid)
    return _cpu_s(proc) + _sum_cpu_s(_tree(proc)[1:])


def _normalize_url(url: str | None) -> str | None:
    if not url:
        return None
    if "://" not in url:
        url = "http://" + url
    return url if url.split("://", 1)[1].count("/") else url + "/metrics"


class ResourceSampler:
    """Background readings of client CPU, server CPU and GPUs during a measurement."""

    def __init__(
        self,
        *,
        interval_s: float = 0.5,
        metrics_urls: Sequence[str] = (),
        local_gpu: bool = True,
        server_pid: int | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        fetch: Fetch | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"the resource sampling interval must be positive, not {interval_s}")
        self._interval_s = interval_s
        self._scrape_timeout_s = max(2.0, 4 * interval_s)  # a hung endpoint must not stall the readings
        self._urls = tuple(dict.fromkeys(u for u in map(_normalize_url, metrics_urls) if u))
        self._local_gpu = local_gpu
        self._server_pid = server_pid
        self._clock = clock
        self._fetch: Fetch = fetch if fetch is not None else self._http_get
        self._session: Any = None  # aiohttp.ClientSession, created on first default fetch
        self._task: asyncio.Task[None] | None = None
        self._readings: list[Reading] = []
        self._logged: set[str] = set()
        self._stopping = False  # the last reading: a server stopping with us (Ctrl-C) is no news
        self._cpus = psutil.cpu_count() or 1

    @property
    def readings(self) -> tuple[Reading, ...]:
        return tuple(self._readings)

    async def start(self) -> None:
        """Take a first reading, then one every `interval_s` until `stop()`."""
        if self._task is not None:
            return
        await self.sample_once()
        self._task = asyncio.create_task(self._run(), name="perfkit-resource-sampler")

    async def stop(self) -> None:
        """Stop the background readings, take a last one, and release the HTTP session."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # Ctrl-C reaches the embedded server too, which may be gone by now: the reading keeps
            # the failed scrape, but a warning about it would be noise at the end of the run.
            self._stopping = True
            await self.sample_once()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.sample_once()
            except Exception as exc:  # a bug in a reader must not end the measurement
                self._log_once("reading", "a resource reading failed (%s: %s)", type(exc).__name__, exc)

    async def sample_once(self) -> Reading:
        """Take one reading now and keep it. Never raises for an unavailable source."""
        t_ns, client_s, server_s, local, errors = await asyncio.to_thread(self._read_local)
        gpus = dict(local)
        cpu: list[float] = []
        failed: list[str] = []
        without_gpus: list[str] = []
        scrapes = await asyncio.gather(*(self._scrape(url) for url in self._urls))
        for url, scrape in zip(self._urls, scrapes):
            if isinstance(scrape, str):
                failed.append(url)
                errors = (*errors, scrape)
                self._log_once(f"scrape {url}", "scraping %s failed, reporting no metrics from it (%s)", url, scrape)
                continue
            if scrape.cpu_utilization is not None:
                cpu.append(scrape.cpu_utilization * 100.0)
            if not scrape.gpus:
                without_gpus.append(url)
                self._log_once(f"gpus {url}", "no GPU metrics at %s (nv_gpu_* or DCGM_FI_DEV_*)", url)
            for uuid, sample in scrape.gpus.items():
                gpus[uuid] = sample.over(gpus[uuid]) if uuid in gpus else sample
        # Several servers' nv_cpu_utilization: their mean, each being a share of its own machine.
        server_pct = sum(cpu) / len(cpu) if cpu else None
        scraped = (not failed) if self._urls else None
        reading = Reading(t_ns, client_s, server_s, server_pct, gpus, scraped, errors, tuple(failed),
                          tuple(without_gpus))  # fmt: skip
        self._readings.append(reading)
        return reading

    async def _scrape(self, url: str) -> Any:
        """The parsed scrape of `url`, or why it failed, as text."""
        try:
            return parse_metrics(await asyncio.wait_for(self._fetch(url), timeout=self._scrape_timeout_s))
        except Exception as exc:  # connection refused, HTTP 5xx, timeout, bad text, ...
            return f"{type(exc).__name__}: {exc}".rstrip(": ")

    def _read_local(self) -> tuple[int, float | None, float | None, dict[str, GpuSample], tuple[str, ...]]:
        errors: list[str] = []
        client_s: float | None = None
        server_s: float | None = None
        try:
            client_s = client_cpu_seconds(self._server_pid)
        except psutil.Error as exc:
            errors.append(f"client CPU: {exc}")
        if self._server_pid is not None:
            try:
                server_s = process_cpu_seconds(self._server_pid)
            except psutil.Error as exc:
                errors.append(f"server process {self._server_pid}: {type(exc).__name__}")
        t_ns = self._clock()
        gpus: dict[str, GpuSample] = {}
        if self._local_gpu:
            for r in read_gpus():  # logs once and returns [] without NVML
                gpus[r.uuid] = GpuSample(r.utilization, r.power_usage_w, r.memory_used_bytes, r.memory_total_bytes)
        return t_ns, client_s, server_s, gpus, tuple(errors)

    async def _http_get(self, url: str) -> str:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._scrape_timeout_s))
        async with self._session.get(url) as response:
            response.raise_for_status()
            return str(await response.text())

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if self._stopping:
            return
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    def usage_between(self, start_ns: int, end_ns: int, request_count: int) -> ResourceUsage:
        """Resource figures over the readings taken in [start_ns, end_ns] (see the module header)."""
        readings = sorted((r for r in self._readings if start_ns <= r.t_ns <= end_ns), key=lambda r: r.t_ns)
        notes: list[str] = []
        client_pct: float | None = None
        client_per_request: float | None = None
        server_pct: float | None = None
        client = _cpu_delta(readings, "client_cpu_s")
        if client is not None:
            used_s, wall_s = client
            client_pct = used_s / wall_s * 100.0
            client_per_request = used_s * 1e6 / request_count if request_count > 0 else None
        else:
            notes.append(
                f"CPU figures need two resource readings in the span and {len(readings)} were taken; "
                "measure longer windows (-p / --measurement-interval)"
            )
        if self._server_pid is not None:
            server = _cpu_delta(readings, "server_cpu_s")
            if server is not None:
                server_pct = server[0] / server[1] / self._cpus * 100.0
            gone = next((e for r in readings for e in r.errors if e.startswith("server process")), None)
            if gone:
                notes.append(f"no server CPU figures for part of the span: {gone}")
        else:
            gauges = [r.server_cpu_pct for r in readings if r.server_cpu_pct is not None]
            server_pct = sum(gauges) / len(gauges) if gauges else None
        tried = sum(r.scraped is not None for r in readings)
        for url in self._urls:
            failed = [r for r in readings if url in r.failed]
            if failed:
                notes.append(f"{len(failed)} of {tried} scrapes of {url} failed (last: {failed[-1].errors[-1]})")
        usage = _merge_gpus(readings)
        if usage.gpu_utilization or usage.gpu_power_w or usage.gpu_memory_used_bytes or usage.gpu_memory_total_bytes:
            # Some of a fleet's metrics URLs have GPU figures: say which have none.
            notes += [f"no GPU metrics at {url}" for url in self._urls if any(url in r.without_gpus for r in readings)]
        else:
            notes.append(self._no_gpu_note(readings))
        return ResourceUsage(
            gpu_utilization=usage.gpu_utilization,
            gpu_power_w=usage.gpu_power_w,
            gpu_memory_used_bytes=usage.gpu_memory_used_bytes,
            gpu_memory_total_bytes=usage.gpu_memory_total_bytes,
            client_cpu_pct=client_pct,
            client_cpu_us_per_request=client_per_request,
            server_cpu_pct=server_pct,
            notes=tuple(notes),
        )

    def _no_gpu_note(self, readings: list[Reading]) -> str:
        local = "NVML sees no GPU on this machine" if self._local_gpu else "local GPU sampling is off"
        if not self._urls:
            return f"no GPU figures: {local}, and no metrics URL to scrape (--metrics-url)"
        remote = []
        for url in self._urls:
            if any(r.scraped is not None and url not in r.failed for r in readings):
                remote.append(f"{url} has no GPU metrics (nv_gpu_* or DCGM_FI_DEV_*: no GPU, MIG, or GPU metrics off)")
            else:
                remote.append(f"no scrape of {url} succeeded")
        return f"no GPU figures: {local}, and {'; '.join(remote)}"


def _cpu_delta(readings: list[Reading], attribute: str) -> tuple[float, float] | None:
    """(CPU seconds used, wall seconds) between the first and last reading that has `attribute`."""
    span = [(r.t_ns, value) for r in readings if (value := getattr(r, attribute)) is not None]
    if len(span) < 2 or span[-1][0] <= span[0][0]:
        return None
    return max(span[-1][1] - span[0][1], 0.0), (span[-1][0] - span[0][0]) / 1e9


def _merge_gpus(readings: list[Reading]) -> ResourceUsage:
    """perf_analyzer's MergeMetrics over time-ordered readings: mean utilization and power, max
    used memory, first total memory."""
    util: dict[str, list[float]] = {}
    power: dict[str, list[float]] = {}
    used: dict[str, int] = {}
    total: dict[str, int] = {}
    for r in readings:
        for uuid, g in r.gpus.items():
            if g.utilization is not None:
                util.setdefault(uuid, []).append(g.utilization)
            if g.power_w is not None:
                power.setdefault(uuid, []).append(g.power_w)
            if g.memory_used_bytes is not None:
                used[uuid] = max(used.get(uuid, g.memory_used_bytes), g.memory_used_bytes)
            if g.memory_total_bytes is not None:
                total.setdefault(uuid, g.memory_total_bytes)
    return ResourceUsage(
        gpu_utilization={k: sum(v) / len(v) for k, v in sorted(util.items())},
        gpu_power_w={k: sum(v) / len(v) for k, v in sorted(power.items())},
        gpu_memory_used_bytes=dict(sorted(used.items())),
        gpu_memory_total_bytes=dict(sorted(total.items())),
    )
