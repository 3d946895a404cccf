"""Per-version GPU memory: measured around instance creation, reported in the statistics' memory_usage."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reference_server.backends.placement import gpu_memory_delta
from reference_server.core.dataplane import DataPlane
from reference_server.core.repository import ModelRepository
from v2kit.runtime import gpu


def readings(used: dict[int, int]) -> list[gpu.GpuReading]:
    return [gpu.GpuReading(i, f"GPU-{i}", 0.0, 80 << 30, n, 0.0, 0.0) for i, n in used.items()]


def test_delta_is_measured_per_listed_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([{0: 100, 1: 50}, {0: 700, 1: 50}])
    monkeypatch.setattr(gpu, "process_gpu_memory_bytes", lambda pid: next(samples))
    monkeypatch.setattr(gpu, "read_gpus", lambda: readings({0: 9000, 1: 9000}))
    with gpu_memory_delta([0]) as delta:
        assert delta == {}
    assert delta == {0: 600}  # GPU 1 had no instance of this version: not reported


def test_the_first_instance_on_a_gpu_counts_from_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before its first CUDA allocation the process is not in NVML's list for that GPU.
    samples = iter([{}, {0: 300 << 20}])
    monkeypatch.setattr(gpu, "process_gpu_memory_bytes", lambda pid: next(samples))
    device = iter([readings({0: 1 << 30}), readings({0: (1 << 30) + (300 << 20)})])
    monkeypatch.setattr(gpu, "read_gpus", lambda: next(device))
    with gpu_memory_delta([0]) as delta:
        pass
    assert delta == {0: 300 << 20}


def test_delta_falls_back_to_device_memory_when_the_process_is_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a container NVML lists host pids, and our own pid is not among them.
    monkeypatch.setattr(gpu, "process_gpu_memory_bytes", lambda pid: {})
    samples = iter([readings({0: 1000}), readings({0: 1500})])
    monkeypatch.setattr(gpu, "read_gpus", lambda: next(samples))
    with gpu_memory_delta([0, 0]) as delta:
        pass
    assert delta == {0: 500}


def test_no_gpu_instance_means_no_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(pid: int) -> dict[int, int]:
        raise AssertionError("NVML must not be read for a CPU-only version")

    monkeypatch.setattr(gpu, "process_gpu_memory_bytes", fail)
    with gpu_memory_delta([]) as delta:
        pass
    assert delta == {}


async def test_statistics_report_the_version_gpu_memory(demo_repository: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "identity", root / "identity")
    repository = ModelRepository(root)
    try:
        await repository.load("identity")
        plane = DataPlane(repository)
        # CPU instances: nothing measured, and the list stays empty as before.
        assert plane.statistics("identity")["model_stats"][0]["memory_usage"] == []
        repository.get("identity").gpu_memory_bytes = {1: 2048, 0: 4096}
        assert plane.statistics("identity")["model_stats"][0]["memory_usage"] == [
            {"type": "GPU", "id": 0, "byte_size": 4096},
            {"type": "GPU", "id": 1, "byte_size": 2048},
        ]
    finally:
        await repository.close(0)
