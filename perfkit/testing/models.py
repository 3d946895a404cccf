"""Triton python-backend models for tests and benchmarks against the real tritonserver.

The peers' tritonserver bundles only the python backend, so every model here is a folder
`REPO/NAME/config.pbtxt` + `REPO/NAME/1/model.py`. The `model.py` sources are fixed strings below;
everything that varies (service time, stall cycle, thread counts) travels in the config's
`parameters` and reaches `initialize` through `json.loads(args["model_config"])["parameters"]`.

How python models serve concurrent requests: Triton runs each instance of a python model in its
own stub process, and an instance executes one batch at a time. A model with one instance and no
dynamic batching therefore serves strictly one request after another, however many clients send.
Concurrency is served by `instances=N` (N stub processes, N executions in parallel) or by
`dynamic_batching=True` (the batcher hands one `execute` call all the requests that queued, up to
`max_batch_size`). The sleeper and the staller sleep once per `execute` call, not per request, so
with dynamic batching a batch of requests shares one service time, like a real batched model.

The stub runs Debian's /usr/bin/python3.11 with numpy<2 and onnxruntime from its dist-packages
(put there by the peers' install.sh): the model sources must not import perfkit or anything
from the virtual environment.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from v2kit.runtime.cpus import affinity_cpus

__all__ = ["read_ort_times", "write_bls", "write_onnx_wrapper", "write_sleeper", "write_staller"]

# The record `_ONNX_MODEL` writes with `struct.pack("<4Q", ...)`.
_ORT_RECORD = struct.Struct("<4Q")

# Shared by the sleeper and the staller: the sleeper is a staller that never stalls.
_DELAY_MODEL = '''\
"""Identity model that sleeps to simulate service time (written by perfkit.testing.models)."""

import json
import math
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.service_s = float(params["service_ms"]["string_value"]) / 1000.0
        self.stall_s = float(params.get("stall_ms", {}).get("string_value", "0")) / 1000.0
        self.stall_every_s = float(params.get("stall_every_s", {}).get("string_value", "0"))
        # Stall periods are aligned to the wall clock (time.time() // stall_every_s), so that all
        # instances share the same boundaries. The period that is under way at load time does
        # not stall: the first stall is at the next boundary.
        self.last_period = self._period()

    def _period(self):
        if self.stall_s <= 0 or self.stall_every_s <= 0:
            return 0
        return math.floor(time.time() / self.stall_every_s)

    def execute(self, requests):
        period = self._period()
        if period != self.last_period:
            # The first execution of this instance in a new period stalls, once per period.
            self.last_period = period
            time.sleep(self.stall_s)
        else:
            time.sleep(self.service_s)
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", data.copy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''

# A BLS model: each request's INPUT0 through the models named in its `steps` parameter, one after
# another (a step's OUTPUT0 is the next one's INPUT0). The requests of a batch are sent on at once
# (async_exec), so that a composing model can batch what the BLS model's batch brings it.
_BLS_MODEL = '''\
"""A BLS model chaining composing models (written by perfkit.testing.models)."""

import asyncio
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.steps = params["steps"]["string_value"].split(",")

    async def _chain(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
        for step in self.steps:
            call = pb_utils.InferenceRequest(
                model_name=step, inputs=[pb_utils.Tensor("INPUT0", tensor.as_numpy())],
                requested_output_names=["OUTPUT0"],
            )
            response = await call.async_exec()
            if response.has_error():
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{step}: {response.error().message()}"))
            tensor = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", tensor.as_numpy())])

    async def execute(self, requests):
        return list(await asyncio.gather(*(self._chain(request) for request in requests)))
'''

_ONNX_MODEL = '''\
"""An ONNX file served by onnxruntime inside Triton's python backend (written by perfkit.testing.models)."""

import json
import os
import struct
import time

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.input_name = params["input_name"]
        self.output_name = params["output_name"]
        options = ort.SessionOptions()
        # Each instance is its own stub process with its own session: the cores are split between
        # the instances instead of every session spinning one thread per core.
        options.intra_op_num_threads = int(params["intra_op_threads"])
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if "allow_spinning" in params:
            options.add_session_config_entry("session.intra_op.allow_spinning", params["allow_spinning"])
        path = os.path.join(args["model_repository"], args["model_version"], params["onnx_file"])
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        # Optional session.run timing: one fixed-size record per instance, rewritten in place after
        # every execute, so a reader can difference two reads without talking to the stub.
        self.time_fd = None
        self.totals = [0, 0, 0, 0]  # requests, run ns x requests, executions, run ns
        time_dir = params.get("ort_time_dir", "")
        if time_dir:
            record = os.path.join(time_dir, args["model_instance_name"] + ".ortns")
            self.time_fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self.time_fd, struct.pack("<4Q", *self.totals), 0)

    def execute(self, requests):
        run_ns = 0
        try:
            inputs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
            if len({x.shape[1:] for x in inputs}) == 1:
                # One run for the whole batch the dynamic batcher formed, split back per request.
                batch = np.concatenate(inputs, axis=0) if len(inputs) > 1 else inputs[0]
                started = time.perf_counter_ns()
                (result,) = self.session.run([self.output_name], {self.input_name: batch})
                run_ns = time.perf_counter_ns() - started
                splits = np.cumsum([x.shape[0] for x in inputs])[:-1]
                outputs = np.split(result, splits, axis=0)
            else:
                # Variable dims that differ between requests cannot share a run.
                outputs = []
                for x in inputs:
                    started = time.perf_counter_ns()
                    outputs.append(self.session.run([self.output_name], {self.input_name: x})[0])
                    run_ns += time.perf_counter_ns() - started
        except Exception as error:  # report to every client rather than crash the stub
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))) for _ in requests]
        if self.time_fd is not None:
            totals = self.totals
            totals[0] += len(requests)
            # Every request of the batch waited for the whole run, as Triton counts compute_infer.
            totals[1] += run_ns * len(requests)
            totals[2] += 1
            totals[3] += run_ns
            os.pwrite(self.time_fd, struct.pack("<4Q", *totals), 0)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output_name, np.ascontiguousarray(out))])
            for out in outputs
        ]
'''


def read_ort_times(ort_time_dir: Path, name: str) -> tuple[int, int, int, int]:
    """Sum of the `session.run` records of model `name`'s instances (see `write_onnx_wrapper`):
    (requests, run ns summed per request, executions, run ns), cumulative since load.

    A stub rewrites its record after every execute; read between loads, not during one, for
    totals that belong together.
    """
    totals = [0, 0, 0, 0]
    for record in sorted((Path(ort_time_dir) / name).glob("*.ortns")):
        data = record.read_bytes()
        if len(data) == _ORT_RECORD.size:
            for index, value in enumerate(_ORT_RECORD.unpack(data)):
                totals[index] += value
    return totals[0], totals[1], totals[2], totals[3]


def write_sleeper(
    repo: Path,
    name: str,
    *,
    service_ms: float,
    max_batch_size: int = 8,
    dynamic_batching: bool = False,
    instances: int = 1,
    max_queue_delay_us: int = 0,
) -> Path:
    """Write an identity model (INPUT0 FP32 [-1] → OUTPUT0) whose every execution sleeps `service_ms`.

    Returns the model folder. One execution serves one request, or one batch with `dynamic_batching`.
    """
    return write_staller(
        repo,
        name,
        service_ms=service_ms,
        stall_ms=0.0,
        stall_every_s=0.0,
        max_batch_size=max_batch_size,
        dynamic_batching=dynamic_batching,
        instances=instances,
        max_queue_delay_us=max_queue_delay_us,
    )


def write_bls(
    repo: Path, name: str, steps: Sequence[str], *, max_batch_size: int = 8, dynamic_batching: bool = False
) -> Path:
    """Write a BLS model (INPUT0 FP32 [-1] → OUTPUT0 FP32 [-1]) that sends each request through the
    composing models `steps` in turn, each taking INPUT0 and giving OUTPUT0. Returns the model folder."""
    if not steps:
        raise ValueError("a BLS model needs at least one composing model")
    io = (
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    return _write_model(
        repo, name, _BLS_MODEL, io=io, params={"steps": ",".join(steps)}, max_batch_size=max_batch_size,
        dynamic_batching=dynamic_batching, instances=1, max_queue_delay_us=0,
    )  # fmt: skip


def write_staller(
    repo: Path,
    name: str,
    *,
    service_ms: float,
    stall_ms: float,
    stall_every_s: float,
    max_batch_size: int = 8,
    dynamic_batching: bool = False,
    instances: int = 1,
    max_queue_delay_us: int = 0,
) -> Path:
    """Write a sleeper that stalls periodically: a server with pauses, for coordinated-omission tests.

    The wall clock is cut into periods of `stall_every_s` seconds (aligned to `time.time()`), and
    the first execution of each instance in each period sleeps `stall_ms` instead of `service_ms`;
    every other execution sleeps `service_ms`. The period under way when the model loads does not
    stall. With one instance and no dynamic batching, requests that arrive during a stall queue
    behind it. `stall_ms=0` gives a plain sleeper. Returns the model folder.
    """
    if service_ms < 0 or stall_ms < 0 or stall_every_s < 0:
        raise ValueError("service_ms, stall_ms and stall_every_s must be >= 0")
    if stall_ms > 0 and stall_every_s <= 0:
        raise ValueError("a staller needs stall_every_s > 0")
    io = (
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    params = {"service_ms": service_ms, "stall_ms": stall_ms, "stall_every_s": stall_every_s}
    return _write_model(
        repo,
        name,
        _DELAY_MODEL,
        io=io,
        params=params,
        max_batch_size=max_batch_size,
        dynamic_batching=dynamic_batching,
        instances=instances,
        max_queue_delay_us=max_queue_delay_us,
    )


def write_onnx_wrapper(
    repo: Path,
    name: str,
    onnx_path: Path,
    *,
    max_batch_size: int,
    dynamic_batching: bool = False,
    instances: int = 1,
    max_queue_delay_us: int = 0,
    input_name: str | None = None,
    output_name: str | None = None,
    input_dims: Sequence[int] | None = None,
    output_dims: Sequence[int] | None = None,
    intra_op_threads: int | None = None,
    allow_spinning: bool | None = None,
    ort_time_dir: Path | None = None,
) -> Path:
    """Serve an FP32 ONNX file with one input and one output through Triton's python backend.

    The ONNX file is copied into the version folder and opened with onnxruntime (CPU) in
    `initialize`; `execute` concatenates the inputs of all the requests in the batch, runs once and
    splits the output back per request. Names and per-request dims (without the batch dim) default
    to the graph's first input and first output, read with `onnx.load`; the graph's first dim must
    be the batch dim. `intra_op_threads` defaults to this machine's usable cores (counted when the
    model is written) divided by `instances`, at least 1, so that N instances in N stub processes
    do not oversubscribe the CPU; inter-op threads are 1. `allow_spinning` sets onnxruntime's
    `session.intra_op.allow_spinning` (None keeps its default, spinning on). Returns the model folder.

    `ort_time_dir` (benchmarks): each instance then times its `session.run` calls and, after every
    `execute`, rewrites the file `ort_time_dir/<name>/<instance name>.ortns` (the folder is created
    here; tritonserver must be able to write to it) with four little-endian uint64 running totals:
    requests, run ns summed per request (a batch's run time counted once for each request in it, as
    Triton counts compute_infer), executions, run ns. `read_ort_times` sums the instances' records.
    """
    if max_batch_size < 1:
        raise ValueError("the ONNX wrapper batches along the first dim: max_batch_size must be >= 1")
    if None in (input_name, output_name, input_dims, output_dims):
        graph_input, graph_output = _graph_io(onnx_path)
        input_name = input_name or graph_input[0]
        output_name = output_name or graph_output[0]
        input_dims = graph_input[1] if input_dims is None else input_dims
        output_dims = graph_output[1] if output_dims is None else output_dims
    assert input_name and output_name and input_dims is not None and output_dims is not None
    if intra_op_threads is None:
        intra_op_threads = max(1, affinity_cpus() // max(1, instances))
    io = (
        f'input [ {{ name: "{input_name}" data_type: TYPE_FP32 dims: {_dims(input_dims)} }} ]\n'
        f'output [ {{ name: "{output_name}" data_type: TYPE_FP32 dims: {_dims(output_dims)} }} ]\n'
    )
    params = {
        "onnx_file": "model.onnx",
        "input_name": input_name,
        "output_name": output_name,
        "intra_op_threads": intra_op_threads,
    }
    if allow_spinning is not None:
        params["allow_spinning"] = int(allow_spinning)
    if ort_time_dir is not None:
        # One folder per model, so that models whose names share a prefix never mix their records.
        record_dir = Path(ort_time_dir).resolve() / name
        record_dir.mkdir(parents=True, exist_ok=True)
        params["ort_time_dir"] = os.fspath(record_dir)
    folder = _write_model(
        repo,
        name,
        _ONNX_MODEL,
        io=io,
        params=params,
        max_batch_size=max_batch_size,
        dynamic_batching=dynamic_batching,
        instances=instances,
        max_queue_delay_us=max_queue_delay_us,
    )
    shutil.copyfile(onnx_path, folder / "1" / "model.onnx")
    return folder


def _write_model(
    repo: Path,
    name: str,
    source: str,
    *,
    io: str,
    params: Mapping[str, object],
    max_batch_size: int,
    dynamic_batching: bool,
    instances: int,
    max_queue_delay_us: int,
) -> Path:
    if max_batch_size < 0 or instances < 1 or max_queue_delay_us < 0:
        raise ValueError("need max_batch_size >= 0, instances >= 1 and max_queue_delay_us >= 0")
    if dynamic_batching and max_batch_size < 1:
        raise ValueError("dynamic batching needs max_batch_size >= 1")
    lines = [
        f"name: {json.dumps(name)}",
        'backend: "python"',
        f"max_batch_size: {max_batch_size}",
        io.rstrip("\n"),
        # KIND_CPU: `instances` is then the exact number of stub processes, GPU or not.
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]",
    ]
    if dynamic_batching:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}")
    for key, value in params.items():
        lines.append(f"parameters {{ key: {json.dumps(key)} value: {{ string_value: {json.dumps(str(value))} }} }}")
    folder = Path(repo) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "1" / "model.py").write_text(source, encoding="utf-8")
    return folder


def _dims(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(int(d)) for d in dims) + " ]"


def _graph_io(onnx_path: Path) -> tuple[tuple[str, list[int]], tuple[str, list[int]]]:
    """(name, dims without the batch dim) of the graph's first real input and first output."""
    import onnx  # only the ONNX wrapper needs it

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    inputs = [value for value in graph.input if value.name not in initializers]
    found = []
    for value in (inputs[0], graph.output[0]):
        tensor = value.type.tensor_type
        if tensor.elem_type != onnx.TensorProto.FLOAT:
            raise ValueError(f"{onnx_path}: {value.name} is not FP32; the ONNX wrapper serves FP32 only")
        # A symbolic or missing dim is variable (-1) for Triton.
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        if not dims:
            raise ValueError(f"{onnx_path}: {value.name} has no batch dim")
        found.append((value.name, dims[1:]))
    return found[0], found[1]


