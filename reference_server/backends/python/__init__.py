"""Triton's python backend: `backend: "python"` models, a `model.py` defining `TritonPythonModel`.

Each `instance_group` instance runs in a stub process of its own (`stub.py`), as in Triton, with
tensors passed through shared memory (`ipc.py`); `process.py` is the server's side of one stub
process, `instance.py` what runs through it and what happens when it fails.
Model files import `triton_python_backend_utils` (`pb/`), this server's version of Triton's module.

Loading a version (`create_instances`): the first instance's stub imports the model file and, if
the class defines `auto_complete_config`, completes the config with it (inputs, outputs,
max_batch_size, dynamic batching, the decoupled policy); the repository's completion rules then
give the final config, which every instance's `initialize(args)` receives as `args["model_config"]`.
The config's inputs and outputs, after auto-complete, are the model's signature: a python model
has no graph to read them from. With auto-complete off (`--disable-auto-complete-config`) the
method is not called, as in Triton.

Outputs leave with the datatype the model gave them, whatever the config says (Triton 2.51 does
not hold a python model to its config there); a log line says so once per model and output.

Settings (`--backend-config=python,KEY=VALUE`): `stub-timeout-seconds` (Triton's; default 30)
bounds starting a stub, importing the model and `initialize`; `execute-timeout-seconds` (ours;
default 300, 0 = no limit) bounds one `execute`, after which the batch fails and the stub is
restarted, and how long a request that execute left open waits for its response (`deferred.py`); `shm-default-byte-size` (Triton's name; default 64 MiB) sizes each of an instance's
two arenas (larger tensors get a shared-memory file of their own).

A model's `EXECUTION_ENV_PATH` parameter runs its stubs in a Python environment of its own
(`environment.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.context import BackendContext
from reference_server.backends.placement import Placement
from reference_server.backends.python import environment
from reference_server.backends.python.instance import PythonInstance
from reference_server.backends.python.process import PythonModel
from reference_server.errors import ModelConfigError
from reference_server.scheduling.execute import TensorSignature
from v2kit.model_config import ConfigError, config_from_json, config_to_json
from v2kit.tensors import config_type_to_datatype

__all__ = ["PYTHON_BACKEND", "PYTHON_MODEL_FILENAME", "create_instances"]

PYTHON_BACKEND = "python"
PYTHON_MODEL_FILENAME = "model.py"


def _setting(context: BackendContext, key: str, default: float, config_path: Path) -> float:
    text = context.settings.get(key)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ModelConfigError(f"{config_path}: --backend-config=python,{key}={text} must be a number >= 0")
    return value


def create_instances(
    config: mc.ModelConfig,
    model_path: Path,
    placements: Sequence[Placement],
    config_path: Path,
    context: BackendContext | None = None,
) -> tuple[list[PythonInstance], tuple[list[TensorSignature], list[TensorSignature]]]:
    """Start one stub per placement, complete `config` in place from `auto_complete_config`, and
    initialize every instance with the completed config."""
    context = context or BackendContext()
    if not model_path.is_file():
        # Triton's words, which its QA looks for in the server log.
        raise ModelConfigError(
            f"Failed to preinitialize Python stub: Python model file not found in '{model_path}' (a python "
            f"model's version folder holds {config.default_model_filename or PYTHON_MODEL_FILENAME})"
        )
    model = PythonModel(
        name=config.name,
        version=int(model_path.parent.name),
        model_file=model_path,
        model_dir=model_path.parent.parent,
        context=context,
        arena_bytes=int(_setting(context, "shm-default-byte-size", 64 << 20, config_path)) or (1 << 20),
        stub_timeout_s=_setting(context, "stub-timeout-seconds", 30.0, config_path) or 30.0,
        execute_timeout_s=_setting(context, "execute-timeout-seconds", 300.0, config_path),
        interpreter=environment.interpreter(config, model_path.parent.parent),
    )
    instances = [PythonInstance(model, placement) for placement in placements]
    started: list[PythonInstance] = []
    try:
        first = instances[0]
        started.append(first)
        completed = first.load(json.dumps(config_to_json(config)), auto_complete=context.auto_complete)
        if completed is not None:
            _apply_auto_complete(config, completed, model_path)
        signature = _signature(config, config_path)
        final = config
        if context.complete_config is not None:
            final = context.complete_config(config, *signature)
        model.config_json = json.dumps(config_to_json(final))
        model.output_types = {o.name: config_type_to_datatype(mc.DataType.Name(o.data_type)) for o in final.output}
        model.decoupled = final.model_transaction_policy.decoupled
        first.initialize()
        for instance in instances[1:]:
            started.append(instance)
            instance.load(model.config_json, auto_complete=False)
            instance.initialize()
    except BaseException:
        for instance in started:
            instance.close()
        raise
    return instances, signature


def _apply_auto_complete(config: mc.ModelConfig, completed: str, model_path: Path) -> None:
    try:
        result = config_from_json(completed, f"{model_path}: auto_complete_config")
    except ConfigError as exc:
        raise ModelConfigError(str(exc)) from None
    name = config.name
    config.CopyFrom(result)
    config.name = name


def _signature(config: mc.ModelConfig, config_path: Path) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """The config's tensors as the model's signature, with the batch dimension where it batches."""
    # A config with no tensors loads, as on Triton (a request to it can name no input).
    batch = (-1,) if config.max_batch_size > 0 else ()
    signature: tuple[list[TensorSignature], list[TensorSignature]] = ([], [])
    for tensors, into in ((config.input, signature[0]), (config.output, signature[1])):
        for tensor in tensors:
            if tensor.data_type == mc.TYPE_INVALID:
                raise ModelConfigError(
                    f"{config_path}: python model '{config.name}': tensor '{tensor.name}' has no data_type"
                )
            # The model sees the reshape, where there is one; the client sees dims.
            dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
            into.append(TensorSignature(tensor.name, mc.DataType.Name(tensor.data_type), batch + tuple(dims)))
    return signature
