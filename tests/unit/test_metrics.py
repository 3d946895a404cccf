"""The Prometheus exposition, including the GPU families, checked with prometheus_client's parser."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from reference_server.frontends.metrics import (
    Family,
    gpu_families,
    model_families,
    model_memory_family,
    render_exposition,
)
from reference_server.scheduling.stats import ModelStats
from v2kit.runtime.gpu import GpuReading


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (family.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_label_values_are_escaped() -> None:
    text = render_exposition([Family("x", "gauge", "help", [({"model": 'a"b\\c\nd'}, 1.5)])])
    assert parse(text) == {("x", (("model", 'a"b\\c\nd'),)): 1.5}


def test_model_families_convert_durations_to_microseconds() -> None:
    stats = ModelStats()
    stats.record_execution(4, 1_000, 2_000_000, 3_000)
    for _ in range(4):
        stats.record_success(5_000_000, 1_000_000, 1_000, 2_000_000, 3_000)
    stats.record_failure(7_000, "REJECTED")
    samples = parse(render_exposition(model_families([("m", "1", stats)])))
    labels = (("model", "m"), ("version", "1"))
    assert samples[("nv_inference_request_success", labels)] == 4
    assert samples[("nv_inference_count", labels)] == 4
    assert samples[("nv_inference_exec_count", labels)] == 1
    assert samples[("nv_inference_request_duration_us", labels)] == (4 * 5_000_000 + 7_000) // 1000
    assert samples[("nv_inference_compute_infer_duration_us", labels)] == 8_000
    assert samples[("nv_inference_request_failure", (("model", "m"), ("reason", "REJECTED"), ("version", "1")))] == 1


def test_gpu_families_with_readings() -> None:
    readings = [
        GpuReading(0, "GPU-a", 0.5, 80 * 2**30, 2**30, 120.0, 700.0),
        GpuReading(1, "GPU-b", 0.25, 80 * 2**30, 2 * 2**30, 90.5, 700.0),
    ]
    samples = parse(render_exposition(gpu_families(readings, {1: 512 * 2**20})))
    assert samples[("nv_gpu_utilization", (("gpu_uuid", "GPU-a"),))] == 0.5
    assert samples[("nv_gpu_memory_used_bytes", (("gpu_uuid", "GPU-b"),))] == 2 * 2**30
    assert samples[("nv_gpu_power_usage", (("gpu_uuid", "GPU-b"),))] == 90.5
    assert samples[("nv_gpu_process_memory_used_bytes", (("gpu_uuid", "GPU-b"),))] == 512 * 2**20
    assert gpu_families([], {}) == []


def test_model_gpu_memory_is_labelled_by_model_and_gpu() -> None:
    versions: list[Any] = [
        SimpleNamespace(name="mlp", version=1, namespace="", gpu_memory_bytes={0: 1000, 1: 2000}),
        SimpleNamespace(name="cpu_only", version=1, namespace="", gpu_memory_bytes={}),
    ]
    repository: Any = SimpleNamespace(loaded=lambda: versions)
    samples = parse(render_exposition(model_memory_family(repository, {0: "GPU-a", 1: "GPU-b"})))
    assert samples == {
        ("nv_model_gpu_memory_bytes", (("gpu_uuid", "GPU-a"), ("model", "mlp"), ("version", "1"))): 1000,
        ("nv_model_gpu_memory_bytes", (("gpu_uuid", "GPU-b"), ("model", "mlp"), ("version", "1"))): 2000,
    }
    empty: Any = SimpleNamespace(loaded=lambda: versions[1:])
    assert model_memory_family(empty, {}) == []
