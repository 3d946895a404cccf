"""ONNX Runtime model instances and their placement on CPU or GPUs, as Triton's instance_group does."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError

log = logging.getLogger(__name__)

MAX_INSTANCES_PER_GROUP = 64
KIND_NAMES = {mc.ModelInstanceGroup.KIND_CPU: "CPU", mc.ModelInstanceGroup.KIND_GPU: "GPU"}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one model instance runs: `device` is "CPU" or "GPU", `gpu` the device id for GPUs."""

    name: str
    device: str
    gpu: int | None = None


def plan_instances(config: mc.ModelConfig, gpu_count: int, config_path: Path) -> list[Placement]:
    """Expand instance_group into one Placement per instance.

    Triton's rules: count is per listed GPU for GPU groups (an empty `gpus` means every GPU);
    KIND_AUTO means GPU when every listed GPU exists, else CPU; KIND_GPU without a GPU cannot load.
    """
    groups = list(config.instance_group) or [mc.ModelInstanceGroup(count=1)]
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
        listed = list(group.gpus)
        missing = [g for g in listed if g >= gpu_count]
        kind = group.kind
        if kind in (mc.ModelInstanceGroup.KIND_MODEL, mc.ModelInstanceGroup.KIND_AUTO):
            kind = mc.ModelInstanceGroup.KIND_GPU if gpu_count > 0 and not missing else mc.ModelInstanceGroup.KIND_CPU
        if kind == mc.ModelInstanceGroup.KIND_GPU:
            if gpu_count == 0:
                raise ModelConfigError(
                    f"{config_path}: instance_group '{group_name}' asks for KIND_GPU but no GPU is "
                    "available; use kind: KIND_CPU (or leave kind unset to use a GPU when present)"
                )
            if missing:
                raise ModelConfigError(
                    f"{config_path}: instance_group '{group_name}' lists GPU(s) {missing} but only "
                    f"{gpu_count} GPU(s) exist (ids 0..{gpu_count - 1})"
                )
            for gpu in listed or list(range(gpu_count)):
                for _ in range(count):
                    placements.append(Placement(f"{group_name}_{len(placements)}", "GPU", gpu))
        elif kind == mc.ModelInstanceGroup.KIND_CPU:
            for _ in range(count):
                placements.append(Placement(f"{group_name}_{len(placements)}", "CPU"))
        else:
            raise ModelConfigError(
                f"{config_path}: instance_group '{group_name}' kind {mc.ModelInstanceGroup.Kind.Name(kind)} "
                "is not supported; use KIND_CPU or KIND_GPU"
            )
    return placements


def session_options(config: mc.ModelConfig, config_path: Path | None = None) -> ort.SessionOptions:
    """Session options from the model config's parameters, with Triton ORT backend key names."""
    options = ort.SessionOptions()
    params = {key: value.string_value for key, value in config.parameters.items()}
    for key, attribute in (("intra_op_thread_count", "intra_op_num_threads"),
                           ("inter_op_thread_count", "inter_op_num_threads")):  # fmt: skip
        if key in params:
            text = params[key]
            if not text.isdigit() or int(text) > 1024:
                raise ModelConfigError(
                    f"{config_path or 'config.pbtxt'}: model '{config.name}': parameter {key} must be a whole number of threads (0-1024), got '{text}'"
                )
            setattr(options, attribute, int(text))
    if params.get("enable_mem_arena") == "0":
        options.enable_cpu_mem_arena = False
    # Several instances already run in parallel; ORT's own spinning threads would fight them.
    options.add_session_config_entry("session.intra_op.allow_spinning", params.get("allow_spinning", "0"))
    options.log_severity_level = 3
    return options


class OnnxInstance:
    """One onnxruntime InferenceSession; `run` blocks and is called from the instance's worker thread."""

    def __init__(self, placement: Placement, model_path: Path, options: ort.SessionOptions) -> None:
        self.name = placement.name
        self.placement = placement
        if not model_path.is_file():
            raise ModelConfigError(f"{model_path}: model file not found")
        if placement.device == "GPU":
            providers: list[str | tuple[str, dict[str, str]]] = [
                ("CUDAExecutionProvider", {"device_id": str(placement.gpu)}),
                "CPUExecutionProvider",
            ]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(os.fspath(model_path), options, providers=providers)
        except Exception as exc:
            raise ModelConfigError(f"{model_path}: onnxruntime cannot load the model: {exc}") from exc
        if placement.device == "GPU" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise ModelConfigError(
                f"{model_path}: instance '{self.name}' needs the CUDA execution provider on GPU "
                f"{placement.gpu}, but onnxruntime could not create it (is onnxruntime-gpu's CUDA runtime installed?)"
            )
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._run_options = ort.RunOptions()
        # With one intra-op thread the calling thread does all the work and no pool threads spin
        # after it, so a short run may execute on the event loop (scheduler.INLINE_MAX_NS); with
        # more, the pool's threads compete with the loop for the cores.
        self.runs_on_loop = placement.device == "CPU" and options.intra_op_num_threads == 1

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        names = list(output_names) or self.output_names
        results = self.session.run(names, inputs, self._run_options)
        return dict(zip(names, results))
