"""One batch through one model instance: gather the requests' inputs, run, split the outputs back.

What the scheduler hands an instance and what it gets back, apart from when and where it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["BatchItem", "ModelInstance", "Outcome", "Tensor", "TensorSignature", "Tensors", "execute"]

Tensor = npt.NDArray[Any]
Tensors = dict[str, Tensor]


@dataclass(frozen=True, slots=True)
class TensorSignature:
    """One graph input or output as the config describes it."""

    name: str
    datatype: str  # config enum name, e.g. "TYPE_FP32"; TYPE_INVALID for types a config cannot name
    dims: tuple[int, ...]  # full model dims, -1 for dynamic


class ModelInstance(Protocol):
    """One loaded copy of a model (one `instance_group` instance)."""

    name: str
    # Optional: `runs_on_loop = True` lets the scheduler call `run` on the event-loop thread for
    # short batches (see "Short runs on the loop"); an instance without it always gets a worker.
    # Optional: `prepare_inputs(inputs) -> inputs`, which the scheduler calls on the event loop for
    # each request before it joins a batch: it converts what the backend takes in another form
    # and raises InvalidArgument for what the backend cannot take, failing that request alone
    # (onnxruntime's strings). The scheduler reads it from the first instance, once.

    def run(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        """Execute one batch. Blocking; called from this instance's worker thread, or from the event
        loop if the instance has `runs_on_loop` set (one call at a time either way).

        An empty `output_names` asks for every output.
        """
        ...


class BatchItem(Protocol):
    """One request of a batch, as `execute` reads it."""

    inputs: Tensors
    output_names: Sequence[str]
    batch_size: int


# (t0, t1, t2, t3, per-request outputs, error); t0..t3 bracket compute_input, compute_infer and
# compute_output.
Outcome = tuple[int, int, int, int, "list[Tensors] | None", "Exception | None"]


def execute(instance: ModelInstance, batch: Sequence[BatchItem]) -> Outcome:
    """Gather, run and split one batch, in the instance's worker thread or on the event loop."""
    t0 = perf_counter_ns()
    try:
        first = batch[0]
        if len(batch) == 1:
            inputs = first.inputs
            names: Sequence[str] = first.output_names
        else:
            inputs = {name: np.concatenate([r.inputs[name] for r in batch]) for name in first.inputs}
            names = _union_outputs(batch)
        t1 = perf_counter_ns()
        outputs = instance.run(inputs, names)
        t2 = perf_counter_ns()
        if len(batch) == 1:
            results = [_select(outputs, first.output_names)]
        else:
            total = sum(r.batch_size for r in batch)
            for name in names or outputs:
                array = outputs.get(name)
                if array is not None and (array.ndim == 0 or array.shape[0] != total):
                    raise RuntimeError(
                        f"output '{name}' has shape {list(array.shape)}, expected batch dimension {total}"
                    )
            results = []
            start = 0
            for request in batch:
                end = start + request.batch_size
                selected = _select(outputs, request.output_names)
                results.append({name: array[start:end] for name, array in selected.items()})
                start = end
        t3 = perf_counter_ns()
    except Exception as error:  # any failure of this batch is reported to its requests
        return t0, t0, t0, t0, None, error
    return t0, t1, t2, t3, results, None


def _union_outputs(batch: Sequence[BatchItem]) -> Sequence[str]:
    names: dict[str, None] = {}
    for request in batch:
        if not request.output_names:
            return ()  # someone wants every output
        names.update(dict.fromkeys(request.output_names))
    return list(names)


def _select(outputs: Tensors, names: Sequence[str]) -> Tensors:
    if not names:
        return outputs
    try:
        return {name: outputs[name] for name in names}
    except KeyError as missing:
        raise RuntimeError(f"model did not produce requested output {missing}") from None
