"""Where a model's instances run: Triton's instance_group rules, the same for every backend, and the
GPU memory their creation took."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError
from v2kit.runtime import gpu

__all__ = ["MAX_INSTANCES_PER_GROUP", "Placement", "gpu_memory_delta", "plan_instances", "show_placed_kinds"]

MAX_INSTANCES_PER_GROUP = 64


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one model instance runs: `device` is "CPU" or "GPU", `gpu` the device id for GPUs."""

    name: str
    device: str
    gpu: int | None = None
    #: The index of its instance_group in the config.
    group: int = 0


def plan_instances(
    config: mc.ModelConfig, gpu_count: int, config_path: Path, why_no_gpu: str | None = None
) -> list[Placement]:
    """Expand instance_group into one Placement per instance. `why_no_gpu`, when the backend cannot
    use the GPUs there are, says why: they count as none, and a KIND_GPU group's refusal says it.

    Triton's rules: count is per listed GPU for GPU groups (an empty `gpus` means every GPU);
    KIND_AUTO means GPU when every listed GPU exists, else CPU; KIND_GPU without a GPU cannot load.

    Names as Triton's (core `backend_model_instance.cc`, checked against tritonserver 2.51): instance
    `c` of a group is `<group>_<c>`, counted within its group and the same on each of its GPUs; an
    unnamed group `i` is `<model>_<i>`, and a config without instance_group gets one group named
    after the model. So `instance_group [ { count: 1 } ]` gives `m_0_0`, no instance_group `m_0`.
    """
    groups = list(config.instance_group) or [mc.ModelInstanceGroup(name=config.name, count=1)]
    placements: list[Placement] = []
    for group_index, group in enumerate(groups):
        group_name = group.name or f"{config.name}_{group_index}"
        count = group.count if group.count > 0 else 1
        if count > MAX_INSTANCES_PER_GROUP:
            # Each instance is a session and a thread: a hostile count must not exhaust the machine.
            raise ModelConfigError(
                f"{config_path}: instance_group '{group_name}' count {count} is over the limit of "
                f"{MAX_INSTANCES_PER_GROUP} instances per group (per GPU)"
            )
        if why_no_gpu is not None:
            gpu_count = 0
        listed = list(group.gpus)
        missing = [g for g in listed if g >= gpu_count]
        kind = group.kind
        if kind in (mc.ModelInstanceGroup.KIND_MODEL, mc.ModelInstanceGroup.KIND_AUTO):
            kind = mc.ModelInstanceGroup.KIND_GPU if gpu_count > 0 and not missing else mc.ModelInstanceGroup.KIND_CPU
        if kind == mc.ModelInstanceGroup.KIND_GPU:
            if gpu_count == 0:
                raise ModelConfigError(
                    f"{config_path}: instance_group '{group_name}' asks for KIND_GPU but "
                    f"{why_no_gpu or 'no GPU is available'}; use kind: KIND_CPU (or leave kind unset to use "
                    "a GPU when present)"
                )
            if missing:
                raise ModelConfigError(
                    f"{config_path}: instance_group '{group_name}' lists GPU(s) {missing} but only "
                    f"{gpu_count} GPU(s) exist (ids 0..{gpu_count - 1})"
                )
            for gpu in listed or list(range(gpu_count)):
                for index in range(count):
                    placements.append(Placement(f"{group_name}_{index}", "GPU", gpu, group_index))
        elif kind == mc.ModelInstanceGroup.KIND_CPU:
            for index in range(count):
                placements.append(Placement(f"{group_name}_{index}", "CPU", None, group_index))
        else:
            raise ModelConfigError(
                f"{config_path}: instance_group '{group_name}' kind {mc.ModelInstanceGroup.Kind.Name(kind)} "
                "is not supported; use KIND_CPU or KIND_GPU"
            )
    return placements


def show_placed_kinds(config: mc.ModelConfig, placements: Iterable[Placement]) -> None:
    """Write into `config` the kind each KIND_AUTO group was placed with (and a GPU group's GPUs
    where it lists none), as Triton's config shows them: KIND_CPU on a machine without a GPU."""
    placed: dict[int, list[Placement]] = {}
    for placement in placements:
        placed.setdefault(placement.group, []).append(placement)
    for index, group in enumerate(config.instance_group):
        mine = placed.get(index)
        if not mine:
            continue
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            on_gpu = any(p.device == "GPU" for p in mine)
            group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted({p.gpu for p in mine if p.gpu is not None}))


# NVML reports memory per process, not per model: serialise the creation of GPU instances so that
# the before/after difference belongs to one version. CPU-only loads do not take the lock.
_gpu_measure_lock = threading.Lock()


@contextlib.contextmanager
def gpu_memory_delta(gpus: Iterable[int]) -> Iterator[dict[int, int]]:
    """Fill the yielded dict with the GPU memory the block took on each of `gpus`.

    The first model on a GPU also pays for the CUDA context (a few hundred MB), as it would when
    measured from outside the process.
    """
    wanted = sorted(set(gpus))
    delta: dict[int, int] = {}
    if not wanted:
        yield delta
        return
    with _gpu_measure_lock:
        process_before, device_before = _gpu_memory_readings()
        yield delta
        process_after, device_after = _gpu_memory_readings()
    for index in wanted:
        if index in process_after:
            # Before the first instance the process is not on the GPU at all: that reads as 0.
            delta[index] = max(0, process_after[index] - process_before.get(index, 0))
        else:
            # In a container NVML may list processes by their host pid, so ours is never found;
            # the device's used memory is the next best reading (other processes' changes count too).
            delta[index] = max(0, device_after.get(index, 0) - device_before.get(index, 0))


def _gpu_memory_readings() -> tuple[dict[int, int], dict[int, int]]:
    """(this process's, the whole device's) used GPU memory in bytes, per GPU index."""
    process = gpu.process_gpu_memory_bytes(os.getpid())
    device = {reading.index: reading.memory_used_bytes for reading in gpu.read_gpus()}
    return process, device
