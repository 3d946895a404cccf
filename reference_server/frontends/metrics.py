"""Prometheus metrics with Triton's names and labels, served on the metrics port at /metrics.

Per-model figures are read from each served version's statistics at scrape time, so nothing is
counted twice and nothing on the inference path pays for metrics (but the latency summaries, when
--metrics-config summary_latencies=true asks for them: `scheduling/summaries.py`). The exposition is written here
rather than by prometheus_client because Triton's counters carry no `_total` suffix (for example
`nv_inference_request_success`), and dashboards and model_analyzer query those exact names;
prometheus_client would rename every counter family.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import psutil
from aiohttp import web

from reference_server.backends.custom_metrics import CustomMetrics
from reference_server.core.dataplane import own_stats
from reference_server.core.model_version import ModelVersion
from reference_server.core.repository import ModelRepository
from reference_server.scheduling.stats import FAILURE_REASONS, ModelStats
from reference_server.scheduling.summaries import SUMMARIES, SummarizedStats
from v2kit.runtime import gpu

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Labels = dict[str, str]


@dataclass(slots=True)
class Family:
    name: str
    kind: str  # counter | gauge | histogram | summary
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)
    #: Samples with a name of their own: a histogram's `_count`, `_sum` and `_bucket` lines.
    named: list[tuple[str, Labels, float]] = field(default_factory=list)


def _model_families() -> list[tuple[str, str, str, str]]:
    # name, kind, help, ModelStats attribute (a duration attribute is converted ns → us)
    return [
        (
            "nv_inference_request_success",
            "counter",
            "Number of successful inference requests, all batch sizes",
            "success_count",
        ),
        (
            "nv_inference_count",
            "counter",
            "Number of inferences performed (does not include cached requests)",
            "inference_count",
        ),
        (
            "nv_inference_exec_count",
            "counter",
            "Number of model executions performed (does not include cached requests)",
            "execution_count",
        ),
        (
            "nv_inference_request_duration_us",
            "counter",
            "Cumulative inference request duration in microseconds (includes cached requests)",
            "request_ns_total",
        ),
        (
            "nv_inference_queue_duration_us",
            "counter",
            "Cumulative inference queuing duration in microseconds (includes cached requests)",
            "queue_ns_total",
        ),
        (
            "nv_inference_compute_input_duration_us",
            "counter",
            "Cumulative compute input duration in microseconds (does not include cached requests)",
            "compute_input_ns_total",
        ),
        (
            "nv_inference_compute_infer_duration_us",
            "counter",
            "Cumulative compute inference duration in microseconds (does not include cached requests)",
            "compute_infer_ns_total",
        ),
        (
            "nv_inference_compute_output_duration_us",
            "counter",
            "Cumulative inference compute output duration in microseconds (does not include cached requests)",
            "compute_output_ns_total",
        ),
        (
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution per-model.",
            "pending",
        ),
    ]


class NamespacedName(str):
    """A model's name that also carries its repository (--model-namespacing true), which Triton puts
    in each per-model metric's `namespace` label (core src/metric_model_reporter.cc)."""

    namespace: str

    @classmethod
    def of(cls, served: ModelVersion) -> str:
        if not served.namespace:
            return served.name
        named = cls(served.name)
        named.namespace = served.namespace
        return named


def _labels(model: str, version: str) -> dict[str, str]:
    namespace = getattr(model, "namespace", "")
    if namespace:  # in Triton's order: its labels are sorted
        return {"model": model, "namespace": namespace, "version": version}
    return {"model": model, "version": version}


def model_families(served: Iterable[tuple[str, str, ModelStats]], counter_latencies: bool = True) -> list[Family]:
    """Per-model families; without `counter_latencies` (--metrics-config counter_latencies=false), no
    `*_duration_us` counters, as Triton."""
    served = list(served)
    specs = [spec for spec in _model_families() if counter_latencies or not spec[0].endswith("_duration_us")]
    families = [Family(name, kind, text) for name, kind, text, _ in specs]
    failure = Family("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes")
    for model, version, stats in served:
        labels = _labels(model, version)
        for family, (_, _, _, attribute) in zip(families, specs):
            value = getattr(stats, attribute)
            family.samples.append((labels, value // 1000 if attribute.endswith("_ns_total") else value))
        for reason in FAILURE_REASONS:
            failure.samples.append(({**labels, "reason": reason}, stats.failures[reason]))
    return [*families, failure, *cache_families(served)]


def summary_families(served: Iterable[tuple[str, str, ModelStats]], quantiles: Sequence[float]) -> list[Family]:
    """The latency summaries of the versions that keep them (`SummarizedStats`), as Triton lists them:
    each model's `_count`, `_sum`, then a line per quantile."""
    kept = [(model, version, stats) for model, version, stats in served if isinstance(stats, SummarizedStats)]
    if not kept:
        return []
    now = time.monotonic()
    families = []
    for name, text, attribute in SUMMARIES:
        family = Family(name, "summary", text)
        for model, version, stats in kept:
            if attribute == "request_summary" and stats.cache_enabled:
                continue  # Triton has no request summary for a model with the cache
            summary = getattr(stats, attribute)
            labels = _labels(model, version)
            family.named.append((f"{name}_count", labels, summary.count))
            family.named.append((f"{name}_sum", labels, summary.total))
            for quantile, value in zip(quantiles, summary.quantiles(quantiles, now)):
                family.named.append((name, {**labels, "quantile": _number(quantile)}, value))
        if family.named:
            families.append(family)
    return families


def cache_families(served: Iterable[tuple[str, str, ModelStats]]) -> list[Family]:
    """Triton's per-model response-cache counters, for the versions whose config enables the cache."""
    specs = [
        ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit_count"),
        ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
         "cache_hit_ns_total"),
        ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss_count"),
        ("nv_cache_miss_duration_per_model",
         "Total cache miss (insert+lookup) duration per model, in microseconds", "cache_miss_ns_total"),
    ]  # fmt: skip
    cached = [(model, version, stats) for model, version, stats in served if stats.cache_enabled]
    if not cached:
        return []
    return [
        Family(
            name,
            "counter",
            text,
            [
                (
                    _labels(model, version),
                    getattr(stats, attribute) // 1000 if attribute.endswith("_ns_total") else getattr(stats, attribute),
                )
                for model, version, stats in cached
            ],
        )  # fmt: skip
        for name, text, attribute in specs
    ]


def gpu_families(readings: list[gpu.GpuReading], process_memory: dict[int, int]) -> list[Family]:
    if not readings:
        return []
    specs: list[tuple[str, str, Callable[[gpu.GpuReading], float]]] = [
        ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", lambda r: r.utilization),
        ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", lambda r: r.memory_total_bytes),
        ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", lambda r: r.memory_used_bytes),
        ("nv_gpu_power_usage", "GPU power usage in watts", lambda r: r.power_usage_w),
        ("nv_gpu_power_limit", "GPU power management limit in watts", lambda r: r.power_limit_w),
    ]
    families = [
        Family(name, "gauge", text, [({"gpu_uuid": r.uuid}, read(r)) for r in readings]) for name, text, read in specs
    ]
    if process_memory:
        uuids = {r.index: r.uuid for r in readings}
        families.append(
            Family(
                "nv_gpu_process_memory_used_bytes",
                "gauge",
                "GPU memory used by this server process, in bytes",
                [({"gpu_uuid": uuids.get(index, str(index))}, used) for index, used in process_memory.items()],
            )
        )
    return families


def cpu_families() -> list[Family]:
    memory = psutil.virtual_memory()
    return [
        # Utilisation since the previous scrape, as Triton's per-interval figure.
        Family(
            "nv_cpu_utilization",
            "gauge",
            "CPU utilization rate [0.0 - 1.0]",
            [({}, psutil.cpu_percent(interval=None) / 100.0)],
        ),
        Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes", [({}, memory.total)]),
        Family(
            "nv_cpu_memory_used_bytes",
            "gauge",
            "CPU used memory (RAM), in bytes",
            [({}, memory.total - memory.available)],
        ),
    ]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"  # an empty summary window, as prometheus-cpp writes it
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_LAST_LABELS = ("le", "quantile")


def render_exposition(families: Iterable[Family]) -> str:
    """Prometheus text format 0.0.4."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for name, labels, value in [*((family.name, *sample) for sample in family.samples), *family.named]:
            if labels:
                # Sorted by name, a histogram's "le" or a summary's "quantile" last, as Triton
                # (prometheus-cpp) prints them.
                ordered = sorted(labels.items(), key=lambda item: (item[0] in _LAST_LABELS, item[0]))
                inner = ",".join(f'{k}="{_escape(v)}"' for k, v in ordered)
                lines.append(f"{name}{{{inner}}} {_number(value)}")
            else:
                lines.append(f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"


def custom_families(metrics: CustomMetrics | None) -> list[Family]:
    """The families models registered (python's pb_utils.MetricFamily)."""
    if metrics is None:
        return []
    return [Family(view.name, view.kind, view.description, named=view.samples) for view in metrics.families()]


def model_memory_family(repository: ModelRepository, uuids: dict[int, str]) -> list[Family]:
    samples: list[tuple[Labels, float]] = [
        ({**_labels(NamespacedName.of(mv), str(mv.version)), "gpu_uuid": uuids.get(index, str(index))}, size)
        for mv in repository.loaded()
        for index, size in sorted(mv.gpu_memory_bytes.items())
    ]
    if not samples:
        return []
    return [Family("nv_model_gpu_memory_bytes", "gauge", "GPU memory used by the model version's instances, in bytes",
                   samples)]  # fmt: skip


@dataclass(slots=True)
class MetricsOptions:
    """tritonserver's metrics flags: --allow-gpu-metrics, --allow-cpu-metrics, --metrics-config
    counter_latencies, and --metrics-interval-ms (`interval_s`; None: read at every scrape)."""

    gpu: bool = True
    cpu: bool = True
    counter_latencies: bool = True
    interval_s: float | None = None
    #: --metrics-config summary_latencies=true: the quantiles of the latency summaries; None: off.
    summary_quantiles: tuple[float, ...] | None = None
    #: The GPU and CPU families last read, and when (time.monotonic()), kept for `interval_s`.
    polled: tuple[float, list[Family], list[Family]] | None = None


def _system_families(repository: ModelRepository, options: MetricsOptions) -> tuple[list[Family], list[Family]]:
    """The GPU families (the models' GPU memory among them) and the CPU families, read anew once
    `interval_s` has passed since the last reading, as Triton polls them."""
    now = time.monotonic()
    if options.polled is not None and options.interval_s is not None and now - options.polled[0] < options.interval_s:
        return options.polled[1], options.polled[2]
    gpus: list[Family] = []
    if options.gpu:
        readings = gpu.read_gpus()
        process_memory = gpu.process_gpu_memory_bytes(os.getpid()) if readings else {}
        uuids = {r.index: r.uuid for r in readings}
        gpus = [*gpu_families(readings, process_memory), *model_memory_family(repository, uuids)]
    cpus = cpu_families() if options.cpu else []
    options.polled = (now, gpus, cpus)
    return gpus, cpus


def scrape(
    repository: ModelRepository,
    stats_of: Callable[[ModelVersion], ModelStats] = own_stats,
    options: MetricsOptions | None = None,
) -> str:
    options = options or MetricsOptions()
    served = [(NamespacedName.of(mv), str(mv.version), stats_of(mv)) for mv in repository.loaded()]
    gpus, cpus = _system_families(repository, options)
    summaries = [] if options.summary_quantiles is None else summary_families(served, options.summary_quantiles)
    families = [*model_families(served, options.counter_latencies), *summaries, *gpus, *cpus]

    return render_exposition([*families, *custom_families(repository.custom_metrics)])


def build_metrics_app(
    repository: ModelRepository,
    stats_of: Callable[[ModelVersion], ModelStats] = own_stats,
    *,
    gpu: bool = True,
    cpu: bool = True,
    counter_latencies: bool = True,
    interval_s: float | None = None,
    summary_quantiles: Sequence[tuple[float, float]] | None = None,
) -> web.Application:
    """The metrics port's app; `summary_quantiles`: (quantile, error) pairs of the latency summaries
    (None: no summaries)."""
    psutil.cpu_percent(interval=None)  # primes the interval the first scrape reads
    quantiles = None if summary_quantiles is None else tuple(q for q, _ in summary_quantiles)
    options = MetricsOptions(gpu, cpu, counter_latencies, interval_s, quantiles)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=scrape(repository, stats_of, options), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
