"""What a backend may ask of the server around it, without importing it (`core` stands above us).

The repository fills a `BackendContext` in for every load: the backend settings (`--backend-config`),
the config completion it would apply (for a backend that must know its final config before its
model initializes), hooks to call other models the way a client would (python BLS), the server's
custom metric families, and the repository API (python's model loading API).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.custom_metrics import CustomMetrics
from reference_server.scheduling.execute import Tensors, TensorSignature

__all__ = ["BackendContext", "ModelCall", "ModelControl"]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One request from a model to another model (BLS), as a client would send it."""

    model_name: str
    model_version: str  # "" = the highest ready version
    inputs: Tensors
    output_names: Sequence[str]  # empty = every output
    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout_us: int | None = None


class ModelControl(Protocol):
    """The repository API as a model calls it (python's pb_utils.load_model, unload_model and
    is_model_ready): the data plane's, with its checks (explicit model control mode, the parameters)."""

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...


#: (config as given, inputs, outputs) → the completed config, checked as the repository checks it.
CompleteConfig = Callable[[mc.ModelConfig, Sequence[TensorSignature], Sequence[TensorSignature]], mc.ModelConfig]


@dataclass(frozen=True, slots=True)
class BackendContext:
    """The server around a backend. Hooks are None where the server offers none (unit tests)."""

    #: `--backend-config` settings, by key (the backend prefix dropped).
    settings: Mapping[str, str] = field(default_factory=dict)
    complete_config: CompleteConfig | None = None
    #: Run a request through the target model's scheduler (validated as a client's); raises ServerError.
    call_model: Callable[[ModelCall], Awaitable[Tensors]] | None = None
    #: The same for a decoupled target: its (outputs, final) responses.
    stream_model: Callable[[ModelCall], AsyncIterator[tuple[Tensors | None, bool]]] | None = None
    #: The loop the hooks run on.
    loop: asyncio.AbstractEventLoop | None = None
    #: Whether the backend may complete the config (python's auto_complete_config); off with
    #: --disable-auto-complete-config, as in Triton.
    auto_complete: bool = True
    #: The server's custom metric families (python's pb_utils.MetricFamily).
    custom_metrics: CustomMetrics | None = None
    #: Load, unload and readiness of other models (python's model loading API).
    model_control: ModelControl | None = None
