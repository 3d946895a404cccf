"""gRPC fuzzing: malformed ModelInfer requests (and bytes that are no message at all), hostile names
on every other method, and fuzzed streams. Every answer is a status a client mistake may get
(INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, UNIMPLEMENTED, RESOURCE_EXHAUSTED) with a reason, never
INTERNAL or UNKNOWN, a stream reports each failed request and ends OK, and the server serves
normally afterwards."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from reference_server.server import ReferenceServer
from tests.fuzz.wire import fuzz_settings
from v2kit import codec as v2
from v2kit.grpc_proto import response_from_proto

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

SERVICE = "/inference.GRPCInferenceService/"
CLIENT_MISTAKE_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
MODELS = [
    ("mlp", "INPUT0", "FP32", [256]),
    ("identity", "INPUT0", "FP32", [-1]),
    ("convnet", "INPUT0", "FP32", [1, 28, 28]),
    ("strings", "TEXT", "BYTES", [-1]),
]
NAME_TRICKS = [
    "..", "../mlp", "../outside", "/etc/passwd", "\x00", "mlp\x00", "..\\outside", ".", ".hidden", "a" * 3000,
    "\u202emlp", "mlp/", "%2e%2e", "C:\\windows", "\ud7ff", "~",
]  # fmt: skip
DATATYPES = [*v2.DATATYPES, "FP99", "", "fp32", "TYPE_FP32", "STRING"]
INT64 = st.integers(-(2**63), 2**63 - 1)
HUGE_DIMS = st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, -(2**63), -1, 0, 65, 10**6])
METHODS = [
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer", "ModelConfig",
    "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
    "SystemSharedMemoryStatus", "CudaSharedMemoryRegister", "TraceSetting", "LogSettings",
]  # fmt: skip

names = st.one_of(st.sampled_from([m[0] for m in MODELS]), st.sampled_from(NAME_TRICKS), st.text(max_size=16))
versions = st.one_of(st.just(""), st.sampled_from(["1", "0", "-1", "2", "99999999999999999999999", "abc"]))


PARAMETER_VALUES = {
    "bool_param": st.booleans(),
    "int64_param": INT64,
    "string_param": st.text(max_size=20),
    "double_param": st.floats(),
    "uint64_param": st.integers(0, 2**64 - 1),
    "bytes_param": st.binary(max_size=20),
}


def _parameter(draw: st.DrawFn, target: Any) -> None:
    """One entry of a parameters map (InferParameter or ModelRepositoryParameter), of any kind."""
    key = draw(
        st.one_of(st.sampled_from(["timeout", "binary_data_output", "priority", "config", "x"]), st.text(max_size=8))
    )
    entry = target[key]
    kinds = sorted(f.name for f in entry.DESCRIPTOR.oneofs_by_name["parameter_choice"].fields)
    kind = draw(st.sampled_from(kinds))
    setattr(entry, kind, draw(PARAMETER_VALUES[kind]))


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A valid ModelInferRequest for a real model, then 1 to 3 mutations."""
    model, name, datatype, dims = draw(st.sampled_from(MODELS))
    batch = draw(st.sampled_from([1, 1, 2, 3]))
    shape = [batch] + [draw(st.integers(0, 6)) if d == -1 else d for d in dims]
    count = int(np.prod(shape))
    request = pb.ModelInferRequest(model_name=model, id=draw(st.text(max_size=6)))
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    typed = draw(st.booleans())
    if datatype == "BYTES":
        values = [s.encode() for s in draw(st.lists(st.text(max_size=5), min_size=count, max_size=count))]
        if typed:
            tensor.contents.bytes_contents.extend(values)
        else:
            request.raw_input_contents.append(v2.serialize_bytes_tensor(np.array(values, dtype=object)))
    else:
        values32 = np.linspace(-1, 1, count, dtype=np.float32)
        if typed:
            tensor.contents.fp32_contents.extend(values32.tolist())
        else:
            request.raw_input_contents.append(values32.tobytes())
    # In list order, so that dropping the inputs comes last.
    for mutation in sorted(
        set(draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3))), key=MUTATIONS.index
    ):
        mutation(draw, request)
    return request


def _m_name(draw: st.DrawFn, r: Any) -> None:
    r.inputs[0].name = draw(st.one_of(st.text(max_size=8), st.sampled_from(["", "OUTPUT0", "INPUT1"])))


def _m_datatype(draw: st.DrawFn, r: Any) -> None:
    r.inputs[0].datatype = draw(st.sampled_from(DATATYPES))


def _m_shape(draw: st.DrawFn, r: Any) -> None:
    del r.inputs[0].shape[:]
    r.inputs[0].shape.extend(draw(st.lists(st.one_of(st.integers(-3, 300), HUGE_DIMS, INT64), max_size=5)))


def _m_dim(draw: st.DrawFn, r: Any) -> None:
    if r.inputs[0].shape:
        r.inputs[0].shape[draw(st.integers(0, len(r.inputs[0].shape) - 1))] = draw(HUGE_DIMS)


def _m_raw(draw: st.DrawFn, r: Any) -> None:
    raw = draw(st.one_of(st.binary(max_size=64), st.just(b"\x00" * 1023), st.just(b"\xff\xff\xff\x7f")))
    if r.raw_input_contents and draw(st.booleans()):
        r.raw_input_contents[0] = raw
    else:
        r.raw_input_contents.append(raw)


def _m_contents(draw: st.DrawFn, r: Any) -> None:
    field = draw(st.sampled_from(["int_contents", "int64_contents", "bool_contents", "uint_contents", "fp64_contents"]))
    values = {
        "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8),
        "int64_contents": st.lists(INT64, max_size=8),
        "bool_contents": st.lists(st.booleans(), max_size=8),
        "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=8),
        "fp64_contents": st.lists(st.floats(), max_size=8),
    }[field]
    getattr(r.inputs[0].contents, field).extend(draw(values))


def _m_params(draw: st.DrawFn, r: Any) -> None:
    for _ in range(draw(st.integers(1, 3))):
        _parameter(draw, draw(st.sampled_from([r.parameters, r.inputs[0].parameters])))


def _m_outputs(draw: st.DrawFn, r: Any) -> None:
    for name in draw(
        st.lists(st.one_of(st.sampled_from(["OUTPUT0", "ECHO", "", "nope"]), st.text(max_size=6)), max_size=3)
    ):
        output = r.outputs.add(name=name)
        if draw(st.booleans()):
            _parameter(draw, output.parameters)


def _m_model(draw: st.DrawFn, r: Any) -> None:
    r.model_name = draw(names)


def _m_version(draw: st.DrawFn, r: Any) -> None:
    r.model_version = draw(versions)


def _m_duplicate(draw: st.DrawFn, r: Any) -> None:
    r.inputs.add().CopyFrom(r.inputs[0])


def _m_no_inputs(draw: st.DrawFn, r: Any) -> None:
    del r.inputs[:]


MUTATIONS = [
    _m_name, _m_datatype, _m_shape, _m_dim, _m_raw, _m_contents, _m_params, _m_outputs, _m_model, _m_version,
    _m_duplicate, _m_no_inputs,
]  # fmt: skip


@st.composite
def other_calls(draw: st.DrawFn) -> tuple[str, bytes]:
    """(method, serialized request) for the other methods, with hostile names, or bytes that are no message."""
    method = draw(st.sampled_from(METHODS))
    if draw(st.integers(0, 3)) == 0:
        return method, draw(st.binary(max_size=48))
    name, version = draw(names), draw(versions)
    if method in ("ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"):
        request: Any = getattr(pb, method + "Request")(name=name, version=version)
    elif method in ("RepositoryModelLoad", "RepositoryModelUnload"):
        # Never a real model: a fuzzed unload would take it away from the tests that follow.
        request = getattr(pb, method + "Request")(
            model_name=draw(st.sampled_from(NAME_TRICKS)), repository_name=draw(st.sampled_from(["", "other"]))
        )
        for _ in range(draw(st.integers(0, 2))):
            _parameter(draw, request.parameters)
    elif method == "RepositoryIndex":
        request = pb.RepositoryIndexRequest(repository_name=draw(st.sampled_from(["", "x"])), ready=draw(st.booleans()))
    elif method == "ModelInfer":
        request = draw(infer_requests())
    else:
        request = getattr(pb, method + "Request")()
    return method, request.SerializeToString()


@pytest.fixture(scope="module")
def channel(fuzz_server: ReferenceServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{fuzz_server.grpc_port}") as channel:
        yield channel


def _call(channel: grpc.Channel, method: str, payload: bytes) -> tuple[grpc.StatusCode, bytes]:
    try:
        return grpc.StatusCode.OK, channel.unary_unary(SERVICE + method)(payload, timeout=30)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        event(f"{method}: {code.name}")
        assert code in CLIENT_MISTAKE_CODES, (method, code, details)
        assert details, (method, code)
        return code, b""


@fuzz_settings(700)
@given(request=infer_requests())
def test_malformed_model_infer_gets_client_statuses(
    channel: grpc.Channel, crashes: list[logging.LogRecord], request: pb.ModelInferRequest
) -> None:
    code, reply = _call(channel, "ModelInfer", request.SerializeToString())
    if code == grpc.StatusCode.OK:
        event("ModelInfer: OK")
        response_from_proto(pb.ModelInferResponse.FromString(reply))


@fuzz_settings(300)
@given(call=other_calls())
def test_malformed_calls_to_every_method_get_client_statuses(
    channel: grpc.Channel, crashes: list[logging.LogRecord], call: tuple[str, bytes]
) -> None:
    _call(channel, *call)


@fuzz_settings(100)
@given(requests=st.lists(infer_requests(), min_size=1, max_size=6))
def test_a_fuzzed_stream_answers_every_request_and_ends_ok(
    channel: grpc.Channel, crashes: list[logging.LogRecord], requests: list[pb.ModelInferRequest]
) -> None:
    stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer
    replies = list(stream(iter(requests), timeout=30))
    assert len(replies) == len(requests)
    for reply in replies:
        event("stream: error" if reply.error_message else "stream: ok")


def test_the_server_still_serves_and_nothing_crashed(channel: grpc.Channel, crashes: list[logging.LogRecord]) -> None:
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    request.raw_input_contents.append(np.ones(256, np.float32).tobytes())
    reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert list(reply.outputs[0].shape) == [1, 10]
    assert [r.getMessage() for r in crashes] == []
