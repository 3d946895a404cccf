"""One step of an ensemble request: what every step carries, its inputs and its outputs.

The pieces each way of running an ensemble request shares (`EnsembleScheduler`'s tasks and
streams, and `chain.SubmitChain`'s callbacks): a step's inputs gathered by the composing model's
names and checked against its datatypes (Triton's words), its outputs merged back into the
request's tensors, and the request's timeout, id, parameters and statistics every step is given.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from reference_server.core.ensemble.config import Step
from reference_server.errors import InvalidArgument
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.model_scheduler import ModelScheduler
from reference_server.scheduling.stats import ModelStats
from v2kit.tensors import DATATYPES, numpy_to_datatype


class Composing(Protocol):
    """What the ensemble needs of a served composing model version."""

    @property
    def scheduler(self) -> ModelScheduler: ...

    #: Input name -> (v2 datatype, dims), as `ModelVersion.input_types`.
    input_types: dict[str, tuple[str, tuple[int, ...]]]


class StepCall:
    """What every step of one ensemble request carries."""

    __slots__ = ("timeout_us", "request_id", "parameters", "steps_stats")

    def __init__(
        self, timeout_us: int | None, request_id: str, parameters: dict[str, Any] | None, steps_stats: ModelStats
    ) -> None:
        self.timeout_us = timeout_us
        self.request_id = request_id
        self.parameters = parameters
        self.steps_stats = steps_stats


def step_inputs(served: Composing, step: Step, tensors: Tensors) -> Tensors:
    """`step`'s inputs by the composing model's names, each of the datatype the model expects."""
    inputs = {model_input: tensors[tensor] for model_input, tensor in step.inputs}
    types = served.input_types
    for name, array in inputs.items():
        spec = types.get(name)
        if spec is not None and array.dtype != DATATYPES[spec[0]]:
            raise InvalidArgument(
                f"inference input '{name}' data-type is '{numpy_to_datatype(array.dtype)}', but model "
                f"'{step.model_name}' expects '{spec[0]}'"
            )
    return inputs


def merge_outputs(tensors: Tensors, step: Step, outputs: Tensors) -> None:
    for model_output, tensor in step.outputs:
        tensors[tensor] = outputs[model_output]


async def merge_next(
    running: set[asyncio.Future[tuple[Step, Tensors]]], tensors: Tensors
) -> set[asyncio.Future[tuple[Step, Tensors]]]:
    """Wait for the next step(s) to finish and merge their outputs; the steps still running.

    A failed step raises its error; the caller cancels the rest.
    """
    done, pending = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    failed = [task.exception() for task in done if task.exception() is not None]
    if failed:
        raise failed[0]  # type: ignore[misc]  # an Exception: steps are not cancelled but by us
    for task in done:
        merge_outputs(tensors, *task.result())
    return pending
