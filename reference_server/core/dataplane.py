"""Transport-agnostic KServe v2 operations. The REST and gRPC front ends only decode, call and encode.

Everything here speaks codec types (`v2kit.codec`) and plain dicts in the protocol's JSON shapes, and
raises `ServerError`s that carry their own HTTP and gRPC status.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr
from tritonclient.grpc import model_config_pb2 as mc

from reference_server._version import __version__
from reference_server.backends.context import ModelCall
from reference_server.backends.custom_metrics import CustomMetrics
from reference_server.backends.onnxruntime import ONNX_PLATFORM
from reference_server.core import model_config, streamed
from reference_server.core.classification import classify, requested_classes
from reference_server.core.load_overrides import OverrideFolders
from reference_server.core.log_settings import LogSettings
from reference_server.core.model_management import ModelManagement, checked_model_name
from reference_server.core.model_version import ModelVersion
from reference_server.core.repository import ModelRepository
from reference_server.core.shared_memory import RequestBinding, SharedMemoryRegistry
from reference_server.core.trace_tensors import BACKEND_OUTPUT, QUEUE_INPUT
from reference_server.core.tracing import RequestTrace, Tracing
from reference_server.core.validation import datatype_of, validated_inputs, validated_outputs
from reference_server.errors import InvalidArgument, NotFound, Unavailable, Unsupported
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.stats import ModelStats
from v2kit import codec as v2

log = logging.getLogger(__name__)

SERVER_NAME = "perfkit-reference-server"
EXTENSIONS = [
    "classification",
    "sequence",
    "binary_tensor_data",
    "model_configuration",
    "system_shared_memory",
    "model_repository",
    "statistics",
    "schedule_policy",
    "trace",
    "logging",
]


#: The front ends' names in Triton's refusal of a decoupled model on a unary endpoint.
HTTP_ENDPOINT = "HTTP end point"
GRPC_ENDPOINT = "ModelInfer RPC"

StreamResponse = streamed.StreamResponse


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by interpreted classes (compiled: docs/compiled.md)
class InflightSlots:
    """The in-flight inference requests: counted, limited (`max_inflight_requests`, 0 = no limit)
    and told to `inflight_listeners` (the HTTP front end's read gate) whenever the count changes.
    The count is owned by the event loop, like everything else here."""

    def __init__(self, max_inflight_requests: int = 0) -> None:
        self.max_inflight_requests = max_inflight_requests
        self.inflight = 0
        self.inflight_listeners: list[Callable[[int], None]] = []

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one of the server-wide in-flight slots for an inference request, or fail at once
        (`acquire` and `release` around the block)."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self) -> None:
        """Take one of the server-wide in-flight slots for an inference request, or fail at once.

        The front ends take the slot before they read or decode the request, so a burst beyond the
        limit costs neither memory nor latency: it is answered UNAVAILABLE (HTTP 503) straight away,
        which tells a client to back off and retry, as Triton's full queues do.
        """
        if self.max_inflight_requests and self.inflight >= self.max_inflight_requests:
            raise Unavailable(
                f"server is overloaded: {self.inflight} inference requests in flight, the limit is "
                f"{self.max_inflight_requests} (--max-inflight-requests); retry later"
            )
        self.inflight += 1
        for listener in self.inflight_listeners:
            listener(self.inflight)

    def release(self) -> None:
        """Give back a slot taken by `acquire`."""
        self.inflight -= 1
        for listener in self.inflight_listeners:
            listener(self.inflight)


class DataPlane(InflightSlots, ModelManagement):
    def __init__(
        self,
        repository: ModelRepository,
        *,
        model_control_mode: str = "none",
        strict_readiness: bool = True,
        max_inflight_requests: int = 0,
        max_tensor_elements: int = 0,
        server_name: str = SERVER_NAME,
        log_settings: LogSettings | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        super().__init__(max_inflight_requests)
        self.repository = repository
        self.server_name = server_name  # the server metadata's name (--server-name)
        self.model_control_mode = model_control_mode
        self.strict_readiness = strict_readiness
        self.accepting = True
        self.max_tensor_elements = max_tensor_elements
        #: The folders of the models loaded with the load API's `file:` overrides.
        self.override_folders = OverrideFolders()
        #: The shared memory extensions' regions (`core/shared_memory.py`).
        self.shared_memory = SharedMemoryRegistry()
        #: The logging and trace extensions' settings (`core/log_settings.py`, `core/tracing.py`).
        self.logs = log_settings if log_settings is not None else LogSettings()
        self.tracing = tracing if tracing is not None else Tracing()
        #: A version's statistics as the extension reports them: its own, or with what the front-end
        #: workers' instances of it counted (`workers/hosting.py`).
        self.stats_of: Callable[[ModelVersion], ModelStats] = own_stats
        # Models calling models (python BLS) go through the same checks as a client's request.
        repository.call_model = self.call_model
        repository.stream_model = self.stream_model
        #: The metric families models register (pb_utils.MetricFamily), listed on the metrics port.
        self.custom_metrics = CustomMetrics()
        repository.custom_metrics = self.custom_metrics
        repository.model_control = self  # pb_utils.load_model and its kin: the repository API's checks

    # --- health and metadata ---------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if not self.accepting:
            return False
        return self.repository.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        cuda = ["cuda_shared_memory"] if self.shared_memory.cuda_available() else []
        return {"name": self.server_name, "version": __version__, "extensions": EXTENSIONS + cuda}

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            checked_model_name(name)
        except NotFound:
            return False
        return self.repository.is_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        served = self.repository.get(checked_model_name(name), version)
        config = served.config
        batch_dim = [-1] if config.max_batch_size > 0 else []
        versions = [str(v) for v in self._versions(name)] if not version else [version]
        tensors = {
            kind: [
                {"name": t.name, "datatype": datatype_of(t.data_type), "shape": batch_dim + list(t.dims)} for t in ts
            ]
            for kind, ts in (("inputs", config.input), ("outputs", config.output))
        }
        # Triton reports a python model's backend as its platform here (its config's platform is "").
        platform = config.platform or config.backend or ONNX_PLATFORM
        return {"name": name, "versions": versions, "platform": platform, **tensors}

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return model_config.config_to_json(self.repository.get(checked_model_name(name), version).config)

    def model_config_proto(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.repository.get(checked_model_name(name), version).config

    def _versions(self, name: str) -> list[int]:
        return sorted(mv.version for mv in self.repository.loaded() if mv.name == name)

    # --- inference -------------------------------------------------------------------------------

    async def infer(self, request: v2.InferRequest, *, endpoint: str = HTTP_ENDPOINT) -> v2.InferResponse:
        """One request, one response. A decoupled model is refused with Triton's UNSUPPORTED, whose
        message names the `endpoint` (`HTTP_ENDPOINT`, `GRPC_ENDPOINT`): it may answer 0..N times,
        which only a stream can carry."""
        received_ns = time.perf_counter_ns()
        served = self._unary(request, endpoint)
        if not self.tracing.active:
            return await self._infer(served, request, received_ns)
        trace = self._trace(served, request, endpoint, received_ns)
        try:
            return await self._infer(served, request, received_ns, trace)
        finally:
            if trace is not None:
                trace.returned(endpoint == GRPC_ENDPOINT)

    async def _infer(
        self, served: ModelVersion, request: v2.InferRequest, received_ns: int, trace: RequestTrace | None = None
    ) -> v2.InferResponse:
        inputs, output_names, timeout_us, classes, binding = self._prepare(served, request)
        if trace is not None:
            trace.record_tensors(QUEUE_INPUT, inputs)
        try:
            results = await served.scheduler.infer(
                inputs,
                output_names,
                timeout_us=timeout_us,
                received_ns=received_ns,
                request_id=request.id,
                parameters=_model_parameters(request.parameters),
                secondary_stats=trace,
            )
            if trace is not None:
                trace.record_tensors(BACKEND_OUTPUT, results)
            response = _response(served, request, output_names, results, classes)
            return response if binding is None else binding.write(response)
        finally:
            if binding is not None:
                binding.release()

    def start_infer(
        self,
        request: v2.InferRequest,
        done: Callable[[v2.InferResponse | Exception], None],
        *,
        endpoint: str = HTTP_ENDPOINT,
    ) -> None:
        """`infer` without a coroutine: checks `request` and raises at once as `infer` does, else
        queues it and calls `done` once, on the loop, with its response or the error that failed
        it, from the scheduler's own callback when its batch is done (`ModelScheduler.submit`): no
        task and no loop pass for a plain scheduler, a reshape or a chain of ensemble steps; the
        other wrappers (response cache, sequence batcher) run the request in a task of their own.
        `done` must not raise (the scheduler answers a whole batch in one go)."""
        received_ns = time.perf_counter_ns()
        served = self._unary(request, endpoint)
        inputs, output_names, timeout_us, classes, binding = self._prepare(served, request)
        trace = self._trace(served, request, endpoint, received_ns, inputs) if self.tracing.active else None
        if trace is not None:
            done = partial(trace.answered, done, endpoint == GRPC_ENDPOINT)
        try:
            finished = partial(_finished, done, served, request, output_names, classes, binding)
            if trace is not None:
                finished = partial(trace.results, finished)
            served.scheduler.submit(
                inputs, output_names, finished, timeout_us=timeout_us, received_ns=received_ns,
                request_id=request.id, parameters=_model_parameters(request.parameters), secondary_stats=trace,
            )  # fmt: skip
        except BaseException:
            if binding is not None:
                binding.release()
            raise

    def _trace(
        self,
        served: ModelVersion,
        request: v2.InferRequest,
        endpoint: str,
        received_ns: int,
        inputs: Tensors | None = None,
    ) -> RequestTrace | None:
        """A trace of `request` (its checked `inputs`, if known yet) if the trace settings take it
        (`core/tracing.py`)."""
        trace = self.tracing.sample(served.name, served.version, request.id)
        if trace is not None:
            trace.start(endpoint == GRPC_ENDPOINT, received_ns, self.tracing.received)
            if inputs is not None:
                trace.record_tensors(QUEUE_INPUT, inputs)
        return trace

    def _unary(self, request: v2.InferRequest, endpoint: str) -> ModelVersion:
        """The model version a unary request goes to; a decoupled one is refused."""
        served = self.repository.get(checked_model_name(request.model_name), request.model_version)
        if is_decoupled(served):
            raise Unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")
        return served

    def infer_stream(
        self, request: v2.InferRequest, *, endpoint: str = HTTP_ENDPOINT
    ) -> AsyncGenerator[tuple[StreamResponse, bool], None]:
        """The responses to one request, as the model sends them, each with whether it is the last.

        A response is a `v2.InferResponse`; a `ServerError` that the model sent in place of a
        response (the stream goes on, as Triton's does); or None, when the model's last word is the
        final flag alone. A model that is not decoupled answers once, with final True.

        The request is checked here, before anything runs: a bad one raises at once (a
        `ServerError`, as `infer` would). An error that ends the execution raises from the
        iteration. Closing the iteration early (`aclose`, a cancelled task) cancels the request.
        `endpoint` names the front end (`GRPC_ENDPOINT` for gRPC), for the request's trace.
        """
        received_ns = time.perf_counter_ns()
        served = self.repository.get(checked_model_name(request.model_name), request.model_version)
        inputs, output_names, timeout_us, classes, binding = self._prepare(served, request)
        trace = self._trace(served, request, endpoint, received_ns, inputs) if self.tracing.active else None
        return self._stream(
            served, request, inputs, output_names, timeout_us, received_ns, classes, binding, trace,
            endpoint == GRPC_ENDPOINT,
        )  # fmt: skip

    def _stream(
        self,
        served: ModelVersion,
        request: v2.InferRequest,
        inputs: dict[str, np.ndarray],
        output_names: list[str],
        timeout_us: int | None,
        received_ns: int,
        classes: Mapping[str, int],
        binding: RequestBinding | None = None,
        trace: RequestTrace | None = None,
        grpc: bool = False,
    ) -> AsyncGenerator[tuple[StreamResponse, bool], None]:
        def start() -> streamed.SchedulerStream:
            return served.scheduler.infer_stream(
                inputs,
                output_names,
                timeout_us=timeout_us,
                received_ns=received_ns,
                request_id=request.id,
                parameters=_model_parameters(request.parameters),
                secondary_stats=trace,
            )

        def respond(results: Tensors) -> v2.InferResponse:
            return _response(served, request, output_names, results, classes)

        return streamed.responses(start, respond, binding, trace, grpc)

    def _prepare(
        self, served: ModelVersion, request: v2.InferRequest
    ) -> tuple[dict[str, np.ndarray], list[str], int | None, Mapping[str, int], RequestBinding | None]:
        """A client's request checked for `served`: its inputs, output names, timeout, classification
        counts, and its shared-memory binding (inputs come out of the regions before validation;
        outputs go back in after the model), which the caller releases when the request is done.
        A request that fails the checks has its binding released here."""
        binding = self.shared_memory.bind(request, self._check_elements)
        try:
            self._check_elements(request)
            inputs = validated_inputs(served, request)
            output_names = validated_outputs(served, request)
            timeout_us = request.parameters.get("timeout")
            if timeout_us is not None and (
                not isinstance(timeout_us, int) or isinstance(timeout_us, bool) or timeout_us < 0
            ):
                raise InvalidArgument("request parameter 'timeout' must be a non-negative integer (microseconds)")
            classes = requested_classes(served.name, request.outputs, served.outputs)
        except BaseException:
            if binding is not None:
                binding.release()
            raise
        return inputs, output_names, timeout_us, classes, binding

    def _model_call(self, call: ModelCall) -> tuple[ModelVersion, v2.InferRequest, Tensors, list[str]]:
        request = v2.InferRequest(
            model_name=call.model_name,
            model_version=call.model_version,
            id=call.request_id,
            inputs=[v2.InferTensor(n, v2.numpy_to_datatype(a.dtype), list(a.shape), a) for n, a in call.inputs.items()],
            outputs=[v2.RequestedOutput(n) for n in call.output_names] or None,
            parameters=dict(call.parameters),
        )
        # No --max-tensor-elements here: that bounds what a client's bytes make the server allocate,
        # and a model's tensors are already made (Triton sets no such bound on BLS either).
        served = self.repository.get(checked_model_name(call.model_name), call.model_version)
        return served, request, validated_inputs(served, request), validated_outputs(served, request)

    async def call_model(self, call: ModelCall) -> Tensors:
        """A request from one model to another (python BLS), checked as a client's and run through
        the target's scheduler, so that it shows in the target's statistics."""
        served, request, inputs, output_names = self._model_call(call)
        return await served.scheduler.infer(
            inputs, output_names, timeout_us=call.timeout_us, request_id=request.id, parameters=request.parameters
        )

    def stream_model(self, call: ModelCall) -> AsyncIterator[tuple[Tensors | None, bool]]:
        """`call_model` for a decoupled target: its responses as they come; an error response ends it."""

        def start() -> streamed.SchedulerStream:
            served, request, inputs, output_names = self._model_call(call)
            return served.scheduler.infer_stream(
                inputs, output_names, timeout_us=call.timeout_us, request_id=request.id, parameters=request.parameters
            )

        return streamed.outputs_or_raise(start)

    def _check_elements(self, request: v2.InferRequest) -> None:
        # After the wire decode (whose allocations the body-size limit bounds, and which checks each
        # shape against the bytes present) and before the batcher or the model allocate anything.
        limit = self.max_tensor_elements
        if not limit:
            return
        total = sum(math.prod(t.shape) for t in request.inputs)
        if total > limit:
            raise InvalidArgument(
                f"inference request for model '{request.model_name}' holds {total} input elements, more than "
                f"the server's limit of {limit} (--max-tensor-elements)"
            )

    def decode_raw_request(self, name: str, version: str, body: bytes) -> v2.InferRequest:
        """The binary extension's raw form: the body is the only input's bytes, batch size 1."""
        served = self.repository.get(checked_model_name(name), version)
        if len(served.inputs) != 1:
            raise InvalidArgument(
                f"Raw request must only have 1 input (found 1) to be deduced but got {len(served.inputs)} inputs "
                f"in '{name}' model configuration (Inference-Header-Content-Length: 0 is a raw binary request)"
            )
        (spec,) = served.inputs.values()
        # As Triton infers it: [1] for the batch dimension where the model batches, then the dims.
        dims = ([1] if served.config.max_batch_size > 0 else []) + list(spec.dims)
        datatype = datatype_of(spec.data_type)
        if datatype == "BYTES":
            if -1 in spec.dims or math.prod(spec.dims) != 1:
                raise InvalidArgument(
                    f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1] "
                    f"(model '{name}' has dims {list(spec.dims)}); send a JSON header with the shape"
                )
        elif dims.count(-1) == 1:
            itemsize = v2.datatype_to_numpy(datatype).itemsize
            known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
            if known == 0 or len(body) % (known * itemsize):
                raise InvalidArgument(
                    f"raw binary request for '{name}': {len(body)} bytes do not fill input '{spec.name}' "
                    f"of shape {dims} {datatype}"
                )
            dims[dims.index(-1)] = len(body) // (known * itemsize)
        elif -1 in dims:
            raise InvalidArgument(
                f"The shape of the raw input '{spec.name}' can not be deduced because there are more than one "
                f"variable-sized dimension (model '{name}', shape {dims}); send a JSON header with the shape"
            )
        return v2.decode_raw_binary_request(body, name, version, spec.name, datatype, dims)

    # --- the logging and trace extensions ----------------------------------------------------------

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The log settings, after `changes` (checked by `log_settings.changes_from_*`) if given."""
        if changes:
            self.logs.apply(changes)
        return self.logs.as_dict()

    def trace_settings(self, model: str = "", changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`model`'s trace settings ('' for the global ones), after `changes` (checked by
        `tracing.changes_from_*`; an empty update changes nothing) if given."""
        if model and not self.model_ready(model):
            raise InvalidArgument(f"Request for unknown model : {model}")
        if changes is not None:
            self.tracing.update(model, changes)
        return self.tracing.settings(model)


#: Request parameters the protocol itself reads and keeps; as in Triton's front ends, models never
#: see them. The sequence parameters go on with the request (`scheduling/sequence/batcher.py` reads them).
_SERVER_ONLY_PARAMETERS = frozenset(("priority", "timeout", "binary_data_output"))


def own_stats(served: ModelVersion) -> ModelStats:
    """The statistics `served` counted in this process."""
    return served.stats


def is_decoupled(served: ModelVersion) -> bool:
    """Whether `served` may answer a request 0..N times (`model_transaction_policy { decoupled: true }`)."""
    return served.decoupled


def _model_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    # The sequence parameters go on, as Triton's correlation id and flags go with every request: a
    # sequence model's scheduler reads them, a python model sees them as correlation_id() and flags().
    if not parameters:
        return {}
    return {k: v for k, v in parameters.items() if k not in _SERVER_ONLY_PARAMETERS}


def _finished(
    done: Callable[[v2.InferResponse | Exception], None],
    served: ModelVersion,
    request: v2.InferRequest,
    output_names: list[str],
    classes: Mapping[str, int],
    binding: RequestBinding | None,
    results: Tensors | Exception,
) -> None:
    """A `ModelScheduler.submit` callback: `done` with the response made of `results`, or their error."""
    try:
        answer: v2.InferResponse | Exception
        if isinstance(results, Exception):
            answer = results
        else:
            try:
                answer = _response(served, request, output_names, results, classes)
                if binding is not None:
                    answer = binding.write(answer)
            except Exception as exc:  # an output that does not fit its region, say: the client hears it
                answer = exc
        _answer(done, served.name, answer)
    finally:
        if binding is not None:
            binding.release()


def _answer(
    done: Callable[[v2.InferResponse | Exception], None], model: str, answer: v2.InferResponse | Exception
) -> None:
    try:
        done(answer)
    except Exception:  # the scheduler answers the rest of the batch all the same
        log.exception("internal error answering a request for model '%s'", model)


def _response(
    served: ModelVersion,
    request: v2.InferRequest,
    output_names: list[str],
    results: Tensors,
    classes: Mapping[str, int],
) -> v2.InferResponse:
    # A decoupled model may send some of the outputs in a response: those it sent, in the order asked.
    outputs = []
    for name in output_names:
        array = results.get(name)
        if array is None:
            continue
        datatype = served.output_datatypes[name]
        if array.dtype != served.output_dtypes[name]:  # a python model's output is answered as it made it
            datatype = v2.numpy_to_datatype(array.dtype)
        if name in classes:  # the classification extension: top-k "value:index[:label]" strings
            array = classify(array, classes[name], served.config.max_batch_size > 0, served.labels.get(name, ()))
            datatype = "BYTES"
        outputs.append(v2.InferTensor(name, datatype, list(array.shape), array))
    parameters = {}
    if served.ensemble:
        # Triton 2.51's ensemble answers with the request's sequence, whether it has one or not.
        given = request.parameters
        parameters = {
            "sequence_id": given.get("sequence_id", 0),
            "sequence_start": bool(given.get("sequence_start", False)),
            "sequence_end": bool(given.get("sequence_end", False)),
        }
    return v2.InferResponse(
        model_name=served.name, model_version=str(served.version), id=request.id, outputs=outputs, parameters=parameters
    )


__all__ = [
    "GRPC_ENDPOINT", "HTTP_ENDPOINT", "DataPlane", "InflightSlots", "SERVER_NAME", "StreamResponse", "is_decoupled",
    "own_stats",
]  # fmt: skip
