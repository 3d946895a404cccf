"""Model backends, chosen as Triton chooses them: by the config's `backend`, else its `platform`.

A backend is an `InstanceFactory`: from a version's config, its model file, where its instances
go (`placement`) and the server around it (`context.BackendContext`), it builds the instances the
scheduler runs and reads the model's own inputs and outputs, which complete the config. Adding one
is a module (or folder) here and a line in `_BACKENDS`: ONNX Runtime (`onnxruntime.py`) and
Triton's python backend (`python/`). `close_instances` lets go of what instances hold beyond memory
(python's stub processes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends import onnxruntime, python
from reference_server.backends.context import BackendContext
from reference_server.backends.onnxruntime import ONNX_BACKEND, ONNX_PLATFORM
from reference_server.backends.placement import Placement
from reference_server.backends.python import PYTHON_BACKEND
from reference_server.scheduling.execute import ModelInstance, TensorSignature

__all__ = ["BackendContext", "InstanceFactory", "close_instances", "instance_factory", "why_no_gpu"]

#: (config, model file, placements, config file for messages, the server around it) → (one
#: instance per placement, (the model's inputs, its outputs)). A factory may complete `config` in
#: place (python's auto_complete_config). Instances that also offer `run_requests` (python) get
#: their batches unconcatenated.
InstanceFactory = Callable[
    [mc.ModelConfig, Path, Sequence[Placement], Path, BackendContext],
    tuple[Sequence[ModelInstance], tuple[list[TensorSignature], list[TensorSignature]]],
]

log = logging.getLogger(__name__)

_BACKENDS: dict[str, InstanceFactory] = {
    ONNX_BACKEND: onnxruntime.create_instances,
    ONNX_PLATFORM: onnxruntime.create_instances,
    PYTHON_BACKEND: python.create_instances,
}


def instance_factory(config: mc.ModelConfig) -> InstanceFactory:
    """The factory of `config`'s backend, or of its platform when it names no backend.

    A config that names neither, or a backend not served here, gets ONNX Runtime: Triton completes
    a bare config from its model.onnx, and `complete_config` refuses a backend not served here,
    naming the files.
    """
    return _BACKENDS.get(config.backend or config.platform, onnxruntime.create_instances)


def close_instances(instances: Iterable[ModelInstance]) -> None:
    """Close the instances that need it (python's stub processes); blocking."""
    for instance in instances:
        close = getattr(instance, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log.exception("closing model instance '%s' failed", instance.name)


def why_no_gpu(config: mc.ModelConfig) -> str | None:
    """Why `config`'s backend cannot put an instance on a GPU that NVML shows, or None if it can.

    ONNX Runtime without its CUDA execution provider (the `onnxruntime` CPU package) cannot; so,
    as in a Triton built without GPU support, a group of no kind goes on the CPU, and KIND_GPU is
    refused with the reason. A python model is handed its device id and may use it as it likes."""
    if instance_factory(config) is onnxruntime.create_instances:
        return onnxruntime.why_no_cuda()
    return None
