"""One served version of a model: its completed config, instances, scheduler and statistics.

`ModelVersion` is what a request is served by (the data plane, validation and metrics read it);
`start_version` turns a version built off the loop (`PreparedVersion`: instances created and warmed
up) into one that serves, with its scheduler, rate-limiter gate and response cache. The repository
decides which versions to build and when to swap them in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends import close_instances
from reference_server.core.classification import Labels
from reference_server.core.ensemble.config import ENSEMBLE_PLATFORM
from reference_server.core.response_cache import ResponseCache, cached
from reference_server.scheduling.execute import ModelInstance
from reference_server.scheduling.model_scheduler import ModelScheduler
from reference_server.scheduling.rate_limiter import RateLimiter
from reference_server.scheduling.reshape import with_reshape
from reference_server.scheduling.sequence.batcher import make_scheduler
from reference_server.scheduling.stats import ModelStats
from v2kit.tensors import config_type_to_datatype, datatype_to_numpy


@dataclass(slots=True)
class ModelVersion:
    """One served version of a model: its completed config, instances, scheduler and statistics.

    An ensemble has no instances; its scheduler runs its steps on the composing models.
    """

    name: str
    version: int
    config: mc.ModelConfig
    instances: Sequence[ModelInstance]
    scheduler: ModelScheduler
    stats: ModelStats
    inputs: dict[str, mc.ModelInput]
    outputs: dict[str, mc.ModelOutput]
    #: GPU index → bytes this version's instances took on that GPU when they were created and
    #: warmed up (NVML); empty without GPU instances.
    gpu_memory_bytes: dict[int, int] = field(default_factory=dict)
    #: An ensemble's composing models, as (name, version or "" for the latest).
    composing: tuple[tuple[str, str], ...] = ()
    #: Output name -> the lines of its `label_filename` (the classification extension).
    labels: Labels = field(default_factory=dict)
    #: Input name -> (datatype, dims), output name -> datatype: the config's, read once for the
    #: checks and answers of every request (a protobuf read of each costs about a microsecond).
    input_types: dict[str, tuple[str, tuple[int, ...]]] = field(init=False)
    output_datatypes: dict[str, str] = field(init=False)
    #: Output name -> its numpy dtype: an output of another dtype (a python model's) is answered as made.
    output_dtypes: dict[str, np.dtype[Any]] = field(init=False)
    #: `model_transaction_policy { decoupled: true }`: it may answer a request 0..N times.
    decoupled: bool = field(init=False)
    #: `platform: "ensemble"`: its responses carry the request's sequence parameters, as Triton's.
    ensemble: bool = field(init=False)
    #: With --model-namespacing true, its repository's path (metrics' `namespace` label); else "".
    namespace: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.input_types = {n: (_datatype(t.data_type), tuple(t.dims)) for n, t in self.inputs.items()}
        self.output_datatypes = {n: _datatype(t.data_type) for n, t in self.outputs.items()}
        self.output_dtypes = {n: datatype_to_numpy(d) for n, d in self.output_datatypes.items()}
        self.decoupled = bool(self.config.model_transaction_policy.decoupled)
        self.ensemble = self.config.platform == ENSEMBLE_PLATFORM

    async def close(self, grace_s: float) -> None:
        await self.scheduler.close(grace_s)
        # Then the instances that hold more than memory (python stubs: finalize, then exit).
        await asyncio.get_running_loop().run_in_executor(None, close_instances, self.instances)


def _datatype(data_type: int) -> str:
    return config_type_to_datatype(mc.DataType.Name(data_type))


@dataclass(frozen=True, slots=True)
class PreparedVersion:
    name: str
    version: int
    config: mc.ModelConfig
    instances: Sequence[ModelInstance]
    gpu_memory_bytes: dict[int, int]
    labels: Labels


def start_version(
    prepared: PreparedVersion, cache: ResponseCache | None, limiter: RateLimiter | None, stats: ModelStats
) -> ModelVersion:
    config = prepared.config
    gate = limiter.register(config, prepared.instances) if limiter is not None else None
    scheduler = make_scheduler(config, prepared.instances, stats, gate)
    return ModelVersion(
        name=prepared.name,
        version=prepared.version,
        config=config,
        instances=prepared.instances,
        scheduler=cached(with_reshape(scheduler, config), cache, config, stats, prepared.version),
        stats=stats,
        inputs={i.name: i for i in config.input},
        outputs={o.name: o for o in config.output},
        gpu_memory_bytes=prepared.gpu_memory_bytes,
        labels=prepared.labels,
    )
