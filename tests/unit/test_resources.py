"""perfkit.measure.resources: readings driven one at a time, with a scripted clock, CPU and metrics text."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import psutil
import pytest

from perfkit.measure import resources
from perfkit.measure.prometheus import GpuSample, parse_metrics
from perfkit.measure.resources import ResourceSampler
from v2kit.runtime.gpu import GpuReading

S = 1_000_000_000
GIB = 1 << 30


def metrics_text(util: tuple[float, float], power: tuple[float, float], used: tuple[int, int], cpu: float) -> str:
    """Two GPUs in Triton's exposition, with a label perf_analyzer's regex would choke on."""
    lines = []
    families = [
        ("nv_gpu_utilization", util),
        ("nv_gpu_power_usage", power),
        ("nv_gpu_memory_used_bytes", used),
        ("nv_gpu_memory_total_bytes", (16 * GIB, 80 * GIB)),
    ]
    for name, (a, b) in families:
        lines += [f"# HELP {name} something", f"# TYPE {name} gauge"]
        lines.append(f'{name}{{gpu_uuid="GPU-aaaa",pci_bus_id="0000:01:00.0"}} {a}')
        lines.append(f'{name}{{pci_bus_id="0000:02:00.0",gpu_uuid="GPU-bbbb"}} {b}')
    lines += [
        "# TYPE nv_cpu_utilization gauge",
        f"nv_cpu_utilization {cpu}",
        "# TYPE nv_inference_count counter",
        'nv_inference_count{model="mlp",version="1"} 42',
        "# TYPE nv_gpu_utilization_other gauge",
        'nv_gpu_utilization_other{gpu_uuid="GPU-cccc"} 1',
    ]
    return "\n".join(lines) + "\n"


def clock(step_ns: int = S) -> Callable[[], int]:
    ticks = itertools.count(0, step_ns)
    return lambda: next(ticks)


class Scripted:
    """A fetch that returns the next text, or raises it when it is an exception; keeps the URLs."""

    def __init__(self, items: list[str | Exception]) -> None:
        self._items = iter(items)
        self.urls: list[str] = []

    async def __call__(self, url: str) -> str:
        self.urls.append(url)
        item = next(self._items)
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture
def client_cpu(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Cumulative client CPU seconds that successive readings will see."""
    values: list[float] = []
    it = iter(values)
    monkeypatch.setattr(resources, "client_cpu_seconds", lambda exclude_pid=None: next(it))
    return values


async def test_metrics_are_aggregated_as_perf_analyzer_merges_them(client_cpu: list[float]) -> None:
    client_cpu += [10.0, 10.3, 10.9]  # 0.9 s of CPU over 2 s of wall time
    fetch = Scripted(
        [
            metrics_text((0.5, 0.0), (100.0, 50.0), (4 * GIB, 1 * GIB), 0.2),
            metrics_text((0.7, 0.5), (200.0, 60.0), (6 * GIB, 1 * GIB), 0.4),
            metrics_text((0.9, 1.0), (300.0, 70.0), (5 * GIB, 3 * GIB), 0.6),
        ]
    )
    sampler = ResourceSampler(metrics_urls=("localhost:8002",), local_gpu=False, clock=clock(), fetch=fetch)
    for _ in range(3):
        await sampler.sample_once()
    assert fetch.urls == ["http://localhost:8002/metrics"] * 3
    usage = sampler.usage_between(0, 2 * S, request_count=300)
    assert usage.gpu_utilization == pytest.approx({"GPU-aaaa": 0.7, "GPU-bbbb": 0.5})  # mean
    assert usage.gpu_power_w == pytest.approx({"GPU-aaaa": 200.0, "GPU-bbbb": 60.0})  # mean
    assert usage.gpu_memory_used_bytes == {"GPU-aaaa": 6 * GIB, "GPU-bbbb": 3 * GIB}  # max
    assert usage.gpu_memory_total_bytes == {"GPU-aaaa": 16 * GIB, "GPU-bbbb": 80 * GIB}  # first
    assert usage.server_cpu_pct == pytest.approx(40.0)  # mean of nv_cpu_utilization × 100
    assert usage.client_cpu_pct == pytest.approx(45.0)  # 0.9 s / 2 s, of one core
    assert usage.client_cpu_us_per_request == pytest.approx(3000.0)  # 0.9 s / 300
    assert usage.notes == ()
    # Only the readings in the span count: t = 1 s and 2 s.
    later = sampler.usage_between(S, 2 * S, request_count=0)
    assert later.gpu_utilization == pytest.approx({"GPU-aaaa": 0.8, "GPU-bbbb": 0.75})
    assert later.gpu_memory_total_bytes == {"GPU-aaaa": 16 * GIB, "GPU-bbbb": 80 * GIB}
    assert later.client_cpu_pct == pytest.approx(60.0) and later.client_cpu_us_per_request is None


async def test_a_failing_scrape_is_a_note_never_an_exception(client_cpu: list[float]) -> None:
    client_cpu += [1.0, 1.0, 1.0]
    fetch = Scripted([OSError("connection refused"), "this is { not prometheus", OSError("connection refused")])
    sampler = ResourceSampler(metrics_urls=("http://h:8002/metrics",), local_gpu=False, clock=clock(), fetch=fetch)
    for _ in range(3):
        reading = await sampler.sample_once()
        assert reading.scraped is False
    usage = sampler.usage_between(0, 10 * S, request_count=10)
    assert usage.gpu_utilization == {} and usage.server_cpu_pct is None
    assert usage.client_cpu_pct == 0.0
    assert usage.notes == (
        "3 of 3 scrapes of http://h:8002/metrics failed (last: OSError: connection refused)",
        "no GPU figures: local GPU sampling is off, and no scrape of http://h:8002/metrics succeeded",
    )


async def test_a_server_without_gpu_metrics_gets_exactly_one_note(client_cpu: list[float]) -> None:
    client_cpu += [1.0, 2.0]
    text = "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization 0.5\n"
    sampler = ResourceSampler(
        metrics_urls=("http://h/metrics",), local_gpu=False, clock=clock(), fetch=Scripted([text] * 2)
    )
    await sampler.sample_once()
    await sampler.sample_once()
    usage = sampler.usage_between(0, S, 1)
    assert usage.server_cpu_pct == 50.0
    assert usage.notes == (
        "no GPU figures: local GPU sampling is off, and http://h/metrics has no GPU metrics "
        "(nv_gpu_* or DCGM_FI_DEV_*: no GPU, MIG, or GPU metrics off)",
    )


async def test_local_gpus_through_nvml_and_metrics_taking_precedence(
    client_cpu: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    client_cpu += [0.0, 0.0]
    local = [
        GpuReading(0, "GPU-aaaa", 0.1, 16 * GIB, 2 * GIB, 90.0, 300.0),
        GpuReading(1, "GPU-local", 0.3, 24 * GIB, 1 * GIB, 40.0, 300.0),
    ]
    monkeypatch.setattr(resources, "read_gpus", lambda: local)
    only_util = '# TYPE nv_gpu_utilization gauge\nnv_gpu_utilization{gpu_uuid="GPU-aaaa"} 0.9\n'
    sampler = ResourceSampler(metrics_urls=("http://h/metrics",), clock=clock(), fetch=Scripted([only_util] * 2))
    reading = await sampler.sample_once()
    assert reading.gpus["GPU-aaaa"] == GpuSample(0.9, 90.0, 2 * GIB, 16 * GIB)  # server's figure, NVML's for the rest
    await sampler.sample_once()
    usage = sampler.usage_between(0, S, 1)
    assert usage.gpu_utilization == {"GPU-aaaa": 0.9, "GPU-local": 0.3}
    assert usage.gpu_memory_used_bytes == {"GPU-aaaa": 2 * GIB, "GPU-local": 1 * GIB}
    assert usage.notes == ()


async def test_no_nvml_and_no_metrics_url(client_cpu: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    client_cpu += [0.0]
    monkeypatch.setattr(resources, "read_gpus", lambda: [])
    sampler = ResourceSampler(clock=clock())
    await sampler.sample_once()
    usage = sampler.usage_between(0, S, 1)
    assert usage.client_cpu_pct is None
    gpu_notes = [n for n in usage.notes if "GPU" in n]
    assert gpu_notes == [
        "no GPU figures: NVML sees no GPU on this machine, and no metrics URL to scrape (--metrics-url)"
    ]
    assert any(n.startswith("CPU figures need two resource readings") for n in usage.notes)


async def test_server_cpu_from_its_process(client_cpu: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    client_cpu += [0.0, 0.0, 0.0]
    server_seconds: Iterator[float | Exception] = iter([5.0, 9.0, psutil.NoSuchProcess(4242)])

    def process_cpu_seconds(pid: int) -> float:
        assert pid == 4242
        item = next(server_seconds)
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(resources, "process_cpu_seconds", process_cpu_seconds)
    monkeypatch.setattr(psutil, "cpu_count", lambda: 8)
    sampler = ResourceSampler(local_gpu=False, server_pid=4242, clock=clock())
    for _ in range(3):
        await sampler.sample_once()
    both = sampler.usage_between(0, S, 1)
    assert both.server_cpu_pct == pytest.approx(50.0)  # 4 s of CPU in 1 s on 8 cores: half the machine
    assert not any("server" in n for n in both.notes)
    gone = sampler.usage_between(0, 2 * S, 1)
    assert gone.server_cpu_pct == pytest.approx(50.0)
    assert any(n.startswith("no server CPU figures for part of the span: server process 4242") for n in gone.notes)


async def test_real_psutil_and_the_default_fetch_against_a_closed_port() -> None:
    sampler = ResourceSampler(metrics_urls=("127.0.0.1:1",), local_gpu=False, clock=clock())
    await sampler.sample_once()
    sum(i * i for i in range(20_000))  # some CPU time, however little
    await sampler.sample_once()
    await sampler.stop()  # closes the HTTP session it opened
    usage = sampler.usage_between(0, S, 2)
    assert usage.client_cpu_pct is not None and usage.client_cpu_pct >= 0.0
    assert usage.notes[0].startswith("2 of 2 scrapes of http://127.0.0.1:1/metrics failed")


async def test_start_and_stop_take_readings_in_the_background(client_cpu: list[float]) -> None:
    client_cpu += [0.0, 0.5]
    sampler = ResourceSampler(interval_s=3600, local_gpu=False, clock=clock())
    await sampler.start()
    await sampler.start()  # idempotent
    await sampler.stop()
    assert [r.t_ns for r in sampler.readings] == [0, S]
    assert sampler.usage_between(0, S, 1).client_cpu_pct == pytest.approx(50.0)
    with pytest.raises(ValueError):
        ResourceSampler(interval_s=0)


def test_parse_metrics_reads_gauges_by_family_and_uuid() -> None:
    scrape = parse_metrics(metrics_text((0.5, 0.25), (1.5, 2.5), (10, 20), 0.75))
    assert scrape.cpu_utilization == 0.75
    assert set(scrape.gpus) == {"GPU-aaaa", "GPU-bbbb"}  # not the look-alike family
    assert scrape.gpus["GPU-bbbb"] == GpuSample(0.25, 2.5, 20, 80 * GIB)
    assert parse_metrics("").gpus == {}


# dcgm-exporter's default counters for two GPUs, as it serves them (its labels, its units: %, MiB, W).
DCGM_TEXT = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-dddd",device="nvidia1",modelName="NVIDIA H100",Hostname="node-1"} 3
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1"} 71000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-dddd",device="nvidia1",modelName="NVIDIA H100",Hostname="node-1"} 80000
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1"} 10000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-dddd",device="nvidia1",modelName="NVIDIA H100",Hostname="node-1"} 1000
# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1"} 559
DCGM_FI_DEV_FB_RESERVED{gpu="1",UUID="GPU-dddd",device="nvidia1",modelName="NVIDIA H100",Hostname="node-1"} 559
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1"} 412.5
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-dddd",device="nvidia1",modelName="NVIDIA H100",Hostname="node-1"} 70.25
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1"} 1980
"""
MIB = 1 << 20


def test_dcgm_exporter_fields_become_the_same_gpu_figures_as_tritons() -> None:
    scrape = parse_metrics(DCGM_TEXT)
    assert scrape.cpu_utilization is None
    assert scrape.gpus == {
        "GPU-aaaa": GpuSample(0.87, 412.5, 10000 * MIB, (10000 + 71000 + 559) * MIB),
        "GPU-dddd": GpuSample(0.03, 70.25, 1000 * MIB, (1000 + 80000 + 559) * MIB),
    }
    # FB_TOTAL, where the exporter is told to serve it, is the total as given.
    total = 'DCGM_FI_DEV_FB_TOTAL{UUID="GPU-aaaa"} 81559\nDCGM_FI_DEV_FB_USED{UUID="GPU-aaaa"} 10\n'
    assert parse_metrics(total).gpus["GPU-aaaa"].memory_total_bytes == 81559 * MIB
    # MIG instances and GPUs known only by index and host keep apart.
    mig = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",GPU_I_ID="1"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",GPU_I_ID="2"} 10\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="3",Hostname="node-2"} 20\n'
    )
    assert {k: g.utilization for k, g in parse_metrics(mig).gpus.items()} == {
        "GPU-aaaa/mig1": 0.5, "GPU-aaaa/mig2": 0.1, "node-2:gpu3": 0.2,
    }  # fmt: skip


async def test_several_metrics_urls_and_one_without_gpus_said_once(
    client_cpu: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    client_cpu += [1.0, 1.5, 2.0]
    texts = {
        "http://dcgm:9400/metrics": DCGM_TEXT,
        "http://triton:8002/metrics": metrics_text((0.5, 0.25), (1.5, 2.5), (10, 20), 0.75),
        "http://cpu-only:8002/metrics": "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization 0.25\n",
    }

    async def fetch(url: str) -> str:
        return texts[url]

    urls = ("dcgm:9400", "http://triton:8002/metrics", "cpu-only:8002", "dcgm:9400")  # the repeat is scraped once
    sampler = ResourceSampler(metrics_urls=urls, local_gpu=False, clock=clock(), fetch=fetch)
    with caplog.at_level("WARNING"):
        for _ in range(3):
            reading = await sampler.sample_once()
    assert reading.scraped is True and reading.without_gpus == ("http://cpu-only:8002/metrics",)
    said = [r.getMessage() for r in caplog.records if "no GPU metrics" in r.getMessage()]
    assert said == ["no GPU metrics at http://cpu-only:8002/metrics (nv_gpu_* or DCGM_FI_DEV_*)"]
    usage = sampler.usage_between(0, 2 * S, 10)
    # GPU-aaaa is in both scrapes: Triton's figures are read after DCGM's and take its place.
    assert usage.gpu_utilization == pytest.approx({"GPU-aaaa": 0.5, "GPU-bbbb": 0.25, "GPU-dddd": 0.03})
    assert usage.gpu_memory_used_bytes == {"GPU-aaaa": 10, "GPU-bbbb": 20, "GPU-dddd": 1000 * MIB}
    assert usage.server_cpu_pct == pytest.approx(50.0)  # the mean of 75 % and 25 %
    assert usage.notes == ("no GPU metrics at http://cpu-only:8002/metrics",)


async def test_a_scrape_failing_as_the_sampler_stops_is_kept_but_not_warned_about(
    client_cpu: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    # Ctrl-C reaches the embedded server too: by the last reading its metrics port may be closed.
    client_cpu += [0.0, 0.5, 1.0]
    url = "http://h:8002/metrics"
    fetch = Scripted([metrics_text((0.5, 0.5), (1, 1), (1, 1), 0.1), OSError("connection refused")])
    sampler = ResourceSampler(interval_s=3600, metrics_urls=(url,), local_gpu=False, clock=clock(), fetch=fetch)
    await sampler.start()
    with caplog.at_level("WARNING"):
        await sampler.stop()
    assert [r.scraped for r in sampler.readings] == [True, False]  # the failure is in the last reading
    assert "scraping" not in caplog.text
    running = ResourceSampler(metrics_urls=(url,), local_gpu=False, clock=clock(), fetch=Scripted([OSError("no")]))
    with caplog.at_level("WARNING"):
        await running.sample_once()
    assert f"scraping {url} failed" in caplog.text  # while measuring, a failed scrape is news
