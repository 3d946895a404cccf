"""The embedded default target: the bundled reference server on the demo model repository,
bound to free loopback ports for the duration of one command."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from reference_server.config import ServerConfig
from reference_server.demo import ensure_demo_repository
from reference_server.server import ReferenceServer, running_server


@contextlib.contextmanager
def embedded_server(model_repository: Path | None = None) -> Iterator[ReferenceServer]:
    """Start the reference server on 127.0.0.1 with free ports; stop it on exit."""
    repository = model_repository or ensure_demo_repository()
    config = ServerConfig(model_repository=repository, http_port=0, grpc_port=0, metrics_port=0)
    with running_server(config) as server:
        yield server
