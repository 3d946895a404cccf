"""GPU discovery and readings through NVML (pynvml, from the nvidia-ml-py distribution).

No NVML library, no driver or no device all mean the same thing here: no GPU metrics and no GPU
placement. That is said once in the log, never raised.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str
    utilization: float  # 0.0-1.0, as nv_gpu_utilization
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_w: float
    power_limit_w: float


def _nvml() -> Any | None:
    """The initialised pynvml module, or None when NVML cannot be used (reported once)."""
    with _lock:
        if "nvml" in _state:
            return _state["nvml"]
        nvml: Any | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            nvml = pynvml
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
            log.info("no GPU metrics: NVML is not available (%s)", exc)
        _state["nvml"] = nvml
        return nvml


def gpu_count() -> int:
    """Number of GPUs NVML sees; 0 when NVML is unavailable."""
    nvml = _nvml()
    if nvml is None:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        _report_once("count", exc)
        return 0


def gpu_uuid(index: int) -> str:
    nvml = _nvml()
    if nvml is None:
        return ""
    try:
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception as exc:
        _report_once("uuid", exc)
        return ""


def read_gpus() -> list[GpuReading]:
    """One reading per GPU; an empty list without NVML. A failing field reads as 0."""
    nvml = _nvml()
    if nvml is None:
        return []
    readings = []
    for index in range(gpu_count()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            readings.append(
                GpuReading(
                    index=index,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    utilization=util.gpu / 100.0,
                    memory_total_bytes=int(mem.total),
                    memory_used_bytes=int(mem.used),
                    power_usage_w=_optional_mw(nvml.nvmlDeviceGetPowerUsage, handle) / 1000.0,
                    power_limit_w=_optional_mw(nvml.nvmlDeviceGetEnforcedPowerLimit, handle) / 1000.0,
                )
            )
        except Exception as exc:
            _report_once(f"read{index}", exc)
    return readings


def process_gpu_memory_bytes(pid: int) -> dict[int, int]:
    """GPU memory used by process `pid`, per GPU index (empty without NVML)."""
    nvml = _nvml()
    if nvml is None:
        return {}
    used: dict[int, int] = {}
    for index in range(gpu_count()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    used[index] = used.get(index, 0) + int(proc.usedGpuMemory)
        except Exception as exc:
            _report_once(f"proc{index}", exc)
    return used


def _optional_mw(getter: Any, handle: Any) -> float:
    try:
        return float(getter(handle))
    except Exception:
        return 0.0


def _report_once(key: str, exc: Exception) -> None:
    with _lock:
        seen = _state.setdefault("reported", set())
        if key in seen:
            return
        seen.add(key)
    log.warning("GPU reading failed, reporting it as absent (%s)", exc)
