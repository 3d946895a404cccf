"""Reference-server configurations, model folders and the tritonserver start the integration tests share."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from perfkit.testing import TritonProcess, triton_server
from reference_server.config import ServerConfig
from reference_server.server import ReferenceServer


@dataclass
class Endpoints:
    """Where a test reaches one server: its name ("ours", "triton"), HTTP and gRPC addresses, and
    the reference server itself when it is ours (for looking inside)."""

    name: str
    http: str
    grpc: str
    ours: ReferenceServer | None = None


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


def running_triton(
    peers: Path, repository: Path, *, extra_args: Sequence[str] = (), auto_complete: bool = True
) -> AbstractContextManager[TritonProcess]:
    """Real tritonserver for tests: 90 s to start (python models on a busy 2-core machine), and killed
    at once when the block ends (its stubs' shared memory removed), since no test that uses it is about
    Triton's own graceful stop, which takes 2-3 s with python models (tests/integration/test_triton_peer.py
    tests the stop).

    `auto_complete=False` adds --disable-auto-complete-config. With auto-completion on, Triton 2.51's
    python backend starts a stub for each python model just to run its auto_complete_config, then waits
    a fixed second for that stub's health flag (StubLauncher::UpdateHealth) before it starts the
    instances' stubs: 1.2 s or more a model, one model after another (10 python models: 12.7-16 s to
    start on the busy 2-core test machine, 2.4 s without). A test whose models have complete configs
    and define no auto_complete_config, and which does not look at what auto-completion adds, starts
    Triton without it."""
    if not auto_complete:
        extra_args = ["--disable-auto-complete-config", *extra_args]
    return triton_server(peers, repository, extra_args=extra_args, start_timeout_s=90, stop_timeout_s=0)


def http_client(server: ReferenceServer) -> httpclient.InferenceServerClient:
    """tritonclient's HTTP client on a running server's port."""
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def grpc_client(server: ReferenceServer) -> grpcclient.InferenceServerClient:
    """tritonclient's gRPC client on a running server's port."""
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
