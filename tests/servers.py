"""Reference-server configurations and model folders the integration tests share."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from reference_server.config import ServerConfig


def loopback_config(repository: Path, *, load: tuple[str, ...] | None = None, **overrides: Any) -> ServerConfig:
    """A server on free loopback ports. `load` puts it in explicit model control loading those
    models ("*" for all); without it every model in the repository loads at start."""
    if load is not None:
        overrides = {"model_control_mode": "explicit", "load_models": load, **overrides}
    return ServerConfig(model_repository=repository, http_port=0, grpc_port=0, metrics_port=0, **overrides)


def write_identity_model(repository: Path, name: str, batching: str) -> Path:
    """A copy of the demo `identity` model as `name` in `repository` (FP32 in and out, any length,
    max_batch_size 8), its config.pbtxt ending with `batching`: a dynamic_batching block, or ""."""
    target = repository / name
    shutil.copytree(repository / "identity", target)
    (target / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"{batching}\n"
    )
    return target
