"""One batch through one model instance: gather the requests' inputs, run, split the outputs back.

What the scheduler hands an instance and what it gets back, apart from when and where it runs.
Two kinds of instance: one that runs a concatenated batch (`ModelInstance.run`: ONNX Runtime), and
one that takes the requests as they are (`RequestsInstance.run_requests`: the python backend, whose
`execute` gets a list of requests, as in Triton) and answers each, or fails each, on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "BatchItem",
    "Deferred",
    "ModelInstance",
    "Outcome",
    "RequestsInstance",
    "RequestsOutcome",
    "RESCHEDULE_REFUSED",
    "Rescheduled",
    "ResponseSink",
    "RunCost",
    "Tensor",
    "TensorSignature",
    "Tensors",
    "batch_elements",
    "execute",
    "requests_outcome",
]

Tensor = npt.NDArray[Any]
Tensors = dict[str, Tensor]

#: Where a decoupled model's responses go, from any thread: (outputs or None, final flag, error or
#: None). An error is one response sent as an error: the stream ends with the final flag.
ResponseSink = Callable[["Tensors | None", bool, "Exception | None"], None]


#: core infer_request.cc's words for a release with RESCHEDULE that nothing takes: the model is not
#: an iterative sequence one, or the request ENDs its sequence.
RESCHEDULE_REFUSED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to "
    "handle such a flag."
)


class Rescheduled(dict[str, Tensor]):
    """The answer, with no outputs, for a request its model released with
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: it is to run again, the same request, as the next of its
    sequence. Only an `iterative_sequence` model's instance answers it (the sequence batcher runs
    the request again); a decoupled request's stream stays open meanwhile."""

    __slots__ = ()


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
    #: The client's request id and parameters (KServe v2 `id`, `parameters`), for backends that show
    #: them to the model.
    request_id: str
    parameters: dict[str, Any]
    #: Set for a request to a decoupled model: its responses go there, not to the batch's result.
    sink: ResponseSink | None


class Deferred(Exception):
    """A request's answer that comes after its batch ended: the instance left the request open
    (a python model that returned None for it and keeps its response sender) and settles it once,
    from any thread, with the outputs or the error that fails it (`answers.Answers` waits for it).

    An Exception only so that it rides, unlooked at, through every path that passes a request's
    own error along: the requests answered at once pay no check for it.
    """

    def __init__(self) -> None:
        super().__init__("the request is answered after its batch")
        self._lock = threading.Lock()
        self._result: Tensors | Exception | None = None
        self._then: Callable[[Tensors | Exception], None] | None = None
        self._kept: Tensors | None = None
        #: Called once, before the answer goes on, by whoever settles it (the instance lets go of it).
        self.on_settled: Callable[[], None] | None = None

    def settle(self, result: Tensors | Exception) -> bool:
        """Answer the request, unless it was answered already; whether this call answered it."""
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            then = self._then
        if self.on_settled is not None:
            self.on_settled()
        if then is not None:
            then(result)
        return True

    def then(self, callback: Callable[[Tensors | Exception], None]) -> None:
        """Have `callback` called with the answer, now if it has come, else from `settle`."""
        with self._lock:
            result = self._result
            if result is None:
                self._then = callback
                return
        callback(result)

    def sink(self, outputs: Tensors | None, final: bool, error: Exception | None) -> None:
        """The `ResponseSink` of a request answered once: its response, then (or with it) the final
        flag; an error response settles it at once."""
        if error is not None:
            self.settle(error)
            return
        if outputs is not None:
            self._kept = outputs
        if final:
            kept = self._kept
            self.settle(kept if kept is not None else RuntimeError("the final flag came without a response"))


#: (one entry per request: its outputs, the error that fails it alone, or a `Deferred` answer;
#: start and end of the model's own run, perf_counter_ns, which bound compute_infer).
RequestsOutcome = tuple["list[Tensors | Exception]", int, int]


class RequestsInstance(Protocol):
    """An instance that takes a batch as its requests, unconcatenated (Triton's backend API).

    It may also offer `start_requests(batch, done)`: called on the event loop, it must not block,
    and calls `done` once, on the loop, with the `RequestsOutcome` or the exception that fails the
    whole batch. The scheduler then runs that instance without a worker thread (the python
    backend, whose stub answers through a socket the loop watches).
    """

    name: str

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        """Execute the requests together; blocking, called like `ModelInstance.run`. Raising fails
        every request of the batch."""
        ...


def requests_outcome(batch: Sequence[BatchItem], t0: int, result: RequestsOutcome | Exception) -> Outcome:
    """The Outcome of a `run_requests` or `start_requests` batch that started at `t0`: each
    request's outputs narrowed to those it asked for (a missing one fails that request alone)."""
    if isinstance(result, Exception):
        return t0, t0, t0, t0, None, result
    answers, t1, t2 = result
    selected: list[Tensors | Exception] = []
    for request, answer in zip(batch, answers):
        if not isinstance(answer, Exception) and request.sink is None:
            try:
                answer = _select(answer, request.output_names)
            except RuntimeError as error:
                # A rescheduled request has no outputs yet (checked here, off the common path).
                answer = answer if isinstance(answer, Rescheduled) else error
        selected.append(answer)
    return t0, t1, t2, perf_counter_ns(), selected, None


# (t0, t1, t2, t3, per-request outputs or errors, error); t0..t3 bracket compute_input,
# compute_infer and compute_output.
Outcome = tuple[int, int, int, int, "list[Tensors | Exception] | None", "Exception | None"]


def execute(instance: ModelInstance | RequestsInstance, batch: Sequence[BatchItem]) -> Outcome:
    """Gather, run and split one batch, in the instance's worker thread or on the event loop."""
    t0 = perf_counter_ns()
    run_requests = getattr(instance, "run_requests", None)
    if run_requests is not None:
        try:
            result: RequestsOutcome | Exception = run_requests(batch)
        except Exception as error:
            result = error
        return requests_outcome(batch, t0, result)
    try:
        first = batch[0]
        if len(batch) == 1:
            inputs = first.inputs
            names: Sequence[str] = first.output_names
        else:
            inputs = {name: np.concatenate([r.inputs[name] for r in batch]) for name in first.inputs}
            names = _union_outputs(batch)
        t1 = perf_counter_ns()
        outputs = instance.run(inputs, names)  # type: ignore[union-attr]
        t2 = perf_counter_ns()
        if len(batch) == 1:
            results: list[Tensors | Exception] = [_select(outputs, first.output_names)]
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
                chosen = _select(outputs, request.output_names)
                results.append({name: array[start:end] for name, array in chosen.items()})
                start = end
        t3 = perf_counter_ns()
    except Exception as error:  # any failure of this batch is reported to its requests
        return t0, t0, t0, t0, None, error
    for request, answer in zip(batch, results):
        # A decoupled config on an instance that answers once (onnxruntime): that answer is its
        # one response, final, as Triton's backends send it.
        if request.sink is not None and not isinstance(answer, Exception):
            request.sink(answer, True, None)
    return t0, t1, t2, t3, results, None


class RunCost:
    """The CPU time a batch is expected to take on one instance, from its number of input elements.

    A batch costs a fixed part (a small model reads all its weights for any batch) plus a part
    per element, so the cost is fitted as `fixed + per_element * elements` by least squares over
    recent batches, each weighted 3/4 of the one after it: a run far over the estimate moves it
    at once. While every batch had about the same size, the cost is taken as proportional to the
    elements, which errs high for larger batches until one is measured. Costs are CPU time of
    the thread that ran the batch, not wall time: a batch run on a worker thread also waits for
    the GIL, and one run anywhere may wait for a CPU, and neither wait is the model's.
    """

    __slots__ = ("_n", "_x", "_xx", "_y", "_xy")

    def __init__(self) -> None:
        self._n = self._x = self._xx = self._y = self._xy = 0.0

    def record(self, elements: int, cpu_ns: int) -> None:
        keep = 0.75
        self._n = self._n * keep + 1
        self._x = self._x * keep + elements
        self._xx = self._xx * keep + elements * elements
        self._y = self._y * keep + cpu_ns
        self._xy = self._xy * keep + elements * cpu_ns

    def expected_ns(self, elements: int) -> float:
        """The expected CPU time (ns) of a batch of `elements`; 0 before any batch was recorded."""
        n, x, y = self._n, self._x, self._y
        if n == 0 or x == 0:
            return 0.0
        spread = n * self._xx - x * x
        if spread <= 1e-6 * n * self._xx:
            return y / x * elements
        per_element = max(0.0, (n * self._xy - x * y) / spread)
        fixed = (y - per_element * x) / n
        if fixed < 0:  # the fit's line crosses zero: the proportional estimate errs high, not low
            return y / x * elements
        return fixed + per_element * elements


def batch_elements(batch: Sequence[BatchItem]) -> int:
    """The input elements of a batch, summed over its requests and their inputs."""
    return sum(array.size for request in batch for array in request.inputs.values())


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
