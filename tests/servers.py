"""Reference-server configurations the integration tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reference_server.config import ServerConfig


def loopback_config(repository: Path, *, load: tuple[str, ...] | None = None, **overrides: Any) -> ServerConfig:
    """A server on free loopback ports. `load` puts it in explicit model control loading those
    models ("*" for all); without it every model in the repository loads at start."""
    if load is not None:
        overrides = {"model_control_mode": "explicit", "load_models": load, **overrides}
    return ServerConfig(model_repository=repository, http_port=0, grpc_port=0, metrics_port=0, **overrides)
