"""The GPU and CPU figures in a Prometheus scrape: Triton's `nv_*` gauges and NVIDIA's DCGM exporter's
`DCGM_FI_DEV_*` fields, read onto the same per-GPU figures.

Triton's metrics endpoint labels each GPU with `gpu_uuid`; dcgm-exporter (the usual source on a
Kubernetes fleet, and for servers other than Triton) labels it with `UUID`, `gpu` (the index),
`Hostname` and, under MIG, `GPU_I_ID`. Both become `GpuSample`s keyed by the GPU's UUID (with
`/mig<GPU_I_ID>` for a MIG instance; `<Hostname>:gpu<gpu>` where no UUID is given), so readings of
the same GPU from either source merge. The units differ and are converted here:

| figure | Triton | DCGM exporter |
| --- | --- | --- |
| utilization, 0..1 | `nv_gpu_utilization` (0..1) | `DCGM_FI_DEV_GPU_UTIL` (%) |
| memory used, bytes | `nv_gpu_memory_used_bytes` | `DCGM_FI_DEV_FB_USED` (MiB) |
| memory total, bytes | `nv_gpu_memory_total_bytes` | `DCGM_FI_DEV_FB_TOTAL`, else used + free + reserved (MiB) |
| power, W | `nv_gpu_power_usage` | `DCGM_FI_DEV_POWER_USAGE` |

The text is parsed with prometheus_client's parser, so labels beyond the GPU's do not break it
(perf_analyzer's regex assumes `gpu_uuid` is the only label). That parser appends `_total` to
counter sample names; only gauges are read here, by family name. Anything else in the scrape is
left alone: any Prometheus endpoint can be scraped, and one with none of these families simply
has no GPU figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["GpuSample", "MetricsScrape", "parse_metrics"]

MIB = 1 << 20

_TRITON = {
    "nv_gpu_utilization": ("utilization", 1.0),
    "nv_gpu_power_usage": ("power_w", 1.0),
    "nv_gpu_memory_used_bytes": ("memory_used_bytes", 1.0),
    "nv_gpu_memory_total_bytes": ("memory_total_bytes", 1.0),
}
_DCGM = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization", 0.01),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": ("memory_total_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("_free", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("_reserved", MIB),
}


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant; None where the source did not say."""

    utilization: float | None = None  # 0..1
    power_w: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None

    def over(self, other: GpuSample) -> GpuSample:
        """This sample's figures, falling back to `other`'s where this one has none."""
        return GpuSample(*(mine if mine is not None else theirs for mine, theirs in zip(_fields(self), _fields(other))))


def _fields(sample: GpuSample) -> tuple[Any, ...]:
    return (sample.utilization, sample.power_w, sample.memory_used_bytes, sample.memory_total_bytes)


@dataclass(frozen=True, slots=True)
class MetricsScrape:
    gpus: dict[str, GpuSample]  # gpu uuid →
    cpu_utilization: float | None  # nv_cpu_utilization, 0..1


def _gpu_key(labels: Mapping[str, str]) -> str | None:
    uuid = labels.get("gpu_uuid") or labels.get("UUID")
    if not uuid and labels.get("gpu"):
        host = labels.get("Hostname")
        uuid = f"{host}:gpu{labels['gpu']}" if host else f"gpu{labels['gpu']}"
    if uuid and labels.get("GPU_I_ID"):
        uuid = f"{uuid}/mig{labels['GPU_I_ID']}"
    return uuid or None


def parse_metrics(text: str) -> MetricsScrape:
    """The GPU figures (Triton's `nv_gpu_*`, DCGM's `DCGM_FI_DEV_*`) by GPU and
    `nv_cpu_utilization` from Prometheus text. Raises ValueError on text that is not the
    Prometheus exposition format."""
    figures: dict[str, dict[str, float]] = {}
    cpu: float | None = None
    for family in text_string_to_metric_families(text):
        if family.name == "nv_cpu_utilization":
            cpu = next((float(s.value) for s in family.samples if s.name == family.name), cpu)
        attribute, scale = _TRITON.get(family.name) or _DCGM.get(family.name) or ("", 0.0)
        if not attribute:
            continue
        for s in family.samples:
            key = _gpu_key(s.labels)
            if s.name == family.name and key:
                figures.setdefault(key, {})[attribute] = float(s.value) * scale
    return MetricsScrape({key: _sample(f) for key, f in figures.items()}, cpu)


def _sample(f: dict[str, float]) -> GpuSample:
    total = f.get("memory_total_bytes")
    if total is None and "memory_used_bytes" in f and "_free" in f:
        total = f["memory_used_bytes"] + f["_free"] + f.get("_reserved", 0.0)
    used = f.get("memory_used_bytes")
    return GpuSample(
        utilization=f.get("utilization"),
        power_w=f.get("power_w"),
        memory_used_bytes=None if used is None else int(used),
        memory_total_bytes=None if total is None else int(total),
    )
