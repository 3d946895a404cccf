"""Reshape (config.pbtxt `reshape { shape }`): the client sees a tensor's `dims`, the model its reshape.

Triton's model configuration lets a tensor's shape on the wire differ from the model's: NVIDIA's
densenet_onnx quick start takes `dims: [3,224,224]` from the client and feeds the graph
`[1,3,224,224]`, and answers `dims: [1000]` for the graph's `[1,1000,1,1]`. The element count is
the same (checked at load, `core.model_config.reshape_problem`), so only the shape changes: a
view, never a copy of contiguous data.

The batch dimension, where the model batches, is kept in front. Variable (-1) dimensions carry
their sizes over in order, as Triton's core does (`InferenceRequest` for inputs,
`InferenceResponse::Output::Reshape` for outputs).

`ReshapingScheduler` wraps a version's scheduler, so every path into the model reshapes alike:
the data plane's requests, a python model's BLS calls, and an ensemble's steps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import InternalError, ServerError
from reference_server.scheduling.execute import Tensor, Tensors
from reference_server.scheduling.model_scheduler import Done, ModelScheduler
from reference_server.scheduling.stats import ModelStats

__all__ = ["ReshapePlan", "ReshapingScheduler", "with_reshape"]

#: tensor name -> (the shape it has, the shape it takes), without the batch dimension.
_Shapes = Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]


def _convert(array: Tensor, source: tuple[int, ...], target: tuple[int, ...], batching: bool) -> Tensor:
    lead = array.shape[:1] if batching else ()
    rest = array.shape[1:] if batching else array.shape
    if len(rest) != len(source):
        raise ValueError(f"shape {list(array.shape)} does not have the rank of {list(source)}")
    sizes = iter([size for dim, size in zip(source, rest) if dim == -1])
    shape = [next(sizes) if dim == -1 else dim for dim in target]
    return array.reshape((*lead, *shape))


@dataclass(frozen=True, slots=True)
class ReshapePlan:
    """Which tensors of one model version change shape between the client and the model."""

    model_name: str
    batching: bool
    inputs: _Shapes  # dims -> reshape
    outputs: _Shapes  # reshape -> dims

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> ReshapePlan | None:
        """The plan of a completed config; None when no tensor has a reshape."""
        inputs = {t.name: (tuple(t.dims), tuple(t.reshape.shape)) for t in config.input if t.HasField("reshape")}
        outputs = {t.name: (tuple(t.reshape.shape), tuple(t.dims)) for t in config.output if t.HasField("reshape")}
        if not inputs and not outputs:
            return None
        return cls(config.name, config.max_batch_size > 0, inputs, outputs)

    def to_model(self, inputs: Tensors) -> Tensors:
        """The client's inputs in the shapes the model takes (validated against `dims` before)."""
        converted = dict(inputs)
        for name, (source, target) in self.inputs.items():
            if name in converted:
                converted[name] = _convert(converted[name], source, target, self.batching)
        return converted

    def to_client(self, outputs: Tensors) -> Tensors:
        """The model's outputs in the shapes the config's `dims` give the client."""
        converted = dict(outputs)
        for name, (source, target) in self.outputs.items():
            array = converted.get(name)
            if array is None:
                continue
            try:
                converted[name] = _convert(array, source, target, self.batching)
            except ValueError as error:
                batch = "[-1]+" if self.batching else ""
                raise InternalError(
                    f"model '{self.model_name}' produced output '{name}' of shape {list(array.shape)}, which "
                    f"does not fit its reshape {batch}{list(source)} (dims {list(target)}): {error}"
                ) from None
        return converted


class ReshapingScheduler:
    """A `ModelScheduler` that reshapes inputs on the way in and outputs on the way out."""

    def __init__(self, inner: ModelScheduler, plan: ReshapePlan) -> None:
        self.inner = inner
        self.plan = plan

    async def infer(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> Tensors:
        outputs = await self.inner.infer(
            self.plan.to_model(inputs),
            output_names,
            timeout_us=timeout_us,
            received_ns=received_ns,
            request_id=request_id,
            parameters=parameters,
            secondary_stats=secondary_stats,
        )
        return self.plan.to_client(outputs)

    def submit(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        done: Done,
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> None:
        to_client = self.plan.to_client

        def reshaped(outputs: Tensors | Exception) -> None:
            if isinstance(outputs, Exception):
                done(outputs)
                return
            try:
                converted = to_client(outputs)
            except Exception as error:
                done(error)
                return
            done(converted)

        self.inner.submit(
            self.plan.to_model(inputs), output_names, reshaped, timeout_us=timeout_us, received_ns=received_ns,
            request_id=request_id, parameters=parameters, secondary_stats=secondary_stats,
        )  # fmt: skip

    async def infer_stream(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]:
        stream = self.inner.infer_stream(
            self.plan.to_model(inputs),
            output_names,
            timeout_us=timeout_us,
            received_ns=received_ns,
            request_id=request_id,
            parameters=parameters,
            secondary_stats=secondary_stats,
        )
        try:
            async for outputs, final in stream:
                yield (self.plan.to_client(outputs) if isinstance(outputs, dict) else outputs), final
        finally:
            # Closed early (the client went away): the inner iteration ends now too, cancelling the request.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def close(self, grace_s: float) -> None:
        await self.inner.close(grace_s)


def with_reshape(scheduler: ModelScheduler, config: mc.ModelConfig) -> ModelScheduler:
    """`scheduler`, wrapped in a `ReshapingScheduler` when the config reshapes a tensor."""
    plan = ReshapePlan.from_config(config)
    return scheduler if plan is None else ReshapingScheduler(scheduler, plan)
