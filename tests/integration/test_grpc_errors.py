"""Bad gRPC requests get the status code Triton would give, and the server keeps serving; one error
hierarchy means the same failure reads the same on HTTP and gRPC."""

from __future__ import annotations

import base64
import http.client
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from reference_server import errors
from reference_server.config import ServerConfig
from reference_server.frontends.grpc.server import GrpcServer
from reference_server.frontends.grpc.service import InferenceServicer
from reference_server.frontends.http.rest import build_rest_server
from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config
from v2kit.codec import CodecError

pytestmark = pytest.mark.integration

Stub = service_pb2_grpc.GRPCInferenceServiceStub
Client = grpcclient.InferenceServerClient


@pytest.fixture(scope="module")
def client(demo_server: ReferenceServer) -> Iterator[Client]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{demo_server.grpc_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(demo_server: ReferenceServer) -> Iterator[Stub]:
    with grpc.insecure_channel(f"127.0.0.1:{demo_server.grpc_port}") as channel:
        yield Stub(channel)


def fp32(shape: list[int], name: str = "INPUT0", datatype: str = "FP32") -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, shape, datatype)
    inp.set_data_from_numpy(np.zeros(shape, dtype=np.float32 if datatype == "FP32" else np.int32))
    return inp


def raw_request(
    shape: list[int] | None = None, raw: list[bytes] | None = None, model: str = "mlp", datatype: str = "FP32"
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id="bad")
    request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 256] if shape is None else shape)
    request.raw_input_contents.extend([bytes(1024)] if raw is None else raw)
    return request


def typed_request(field: str = "fp32_contents", count: int = 256, datatype: str = "FP32") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 256])
    getattr(tensor.contents, field).extend([0] * count)
    return request


def mixed_request() -> pb.ModelInferRequest:
    request = raw_request()
    request.inputs[0].contents.fp32_contents.extend([0.0] * 256)
    return request


def duplicate_request() -> pb.ModelInferRequest:
    request = raw_request(raw=[bytes(1024), bytes(1024)])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    return request


Call = Callable[[Client, Stub], Any]
X = [fp32([1, 256])]

CASES: list[tuple[str, Call, str, str]] = [
    # (name, the call, status code, message fragment)
    ("unknown model", lambda c, s: c.infer("nope", X), "NOT_FOUND", "'nope'"),
    ("unknown version", lambda c, s: c.infer("mlp", X, model_version="9"), "NOT_FOUND", "version 9"),
    ("non-numeric version", lambda c, s: c.infer("mlp", X, model_version="abc"), "INVALID_ARGUMENT", "'abc'"),
    ("path trick", lambda c, s: c.infer("../mlp", X), "NOT_FOUND", ""),
    ("empty model name", lambda c, s: s.ModelInfer(raw_request(model=""), timeout=30), "NOT_FOUND", ""),
    ("metadata of unknown model", lambda c, s: c.get_model_metadata("nope"), "NOT_FOUND", "nope"),
    ("config of unknown model", lambda c, s: c.get_model_config("nope"), "NOT_FOUND", "nope"),
    ("stats of unknown model", lambda c, s: c.get_inference_statistics("nope"), "NOT_FOUND", "nope"),
    ("stats of unknown version", lambda c, s: c.get_inference_statistics("mlp", "3"), "NOT_FOUND", "version 3"),
    ("wrong input name", lambda c, s: c.infer("mlp", [fp32([1, 256], "X")]), "INVALID_ARGUMENT", "input 'X'"),
    (
        "wrong datatype",
        lambda c, s: c.infer("mlp", [fp32([1, 256], datatype="INT32")]),
        "INVALID_ARGUMENT",
        "expects 'FP32'",
    ),
    ("wrong shape", lambda c, s: c.infer("mlp", [fp32([1, 128])]), "INVALID_ARGUMENT", "unexpected shape"),
    (
        "no batch dimension",
        lambda c, s: s.ModelInfer(raw_request(shape=[], raw=[bytes(4)]), timeout=30),
        "INVALID_ARGUMENT",
        "has no shape but model requires batch dimension",
    ),
    ("batch too large", lambda c, s: c.infer("mlp", [fp32([65, 256])]), "INVALID_ARGUMENT", "must be <= 64"),
    (
        "unknown output",
        lambda c, s: c.infer("mlp", X, outputs=[grpcclient.InferRequestedOutput("NOPE")]),
        "INVALID_ARGUMENT",
        "output 'NOPE'",
    ),
    (
        "negative class count",
        lambda c, s: c.infer("mlp", X, outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=-1)]),
        "INVALID_ARGUMENT",
        "invalid value for 'classification' parameter of output 'OUTPUT0'",
    ),
    (
        "raw contents too short",
        lambda c, s: s.ModelInfer(raw_request(raw=[bytes(1020)]), timeout=30),
        "INVALID_ARGUMENT",
        "Expected 1024, got 1020",
    ),
    (
        "raw contents too long",
        lambda c, s: s.ModelInfer(raw_request(raw=[bytes(2048)]), timeout=30),
        "INVALID_ARGUMENT",
        "got 2048",
    ),
    (
        "missing raw contents",
        lambda c, s: s.ModelInfer(raw_request(raw=[]), timeout=30),
        "INVALID_ARGUMENT",
        "INPUT0",
    ),
    (
        "more raw contents than inputs",
        lambda c, s: s.ModelInfer(raw_request(raw=[bytes(1024)] * 2), timeout=30),
        "INVALID_ARGUMENT",
        "raw_input_contents has 2 entries",
    ),
    (
        "raw and typed contents mixed",
        lambda c, s: s.ModelInfer(mixed_request(), timeout=30),
        "INVALID_ARGUMENT",
        "must not be specified when using raw_input_contents",
    ),
    (
        "typed contents count",
        lambda c, s: s.ModelInfer(typed_request(count=255), timeout=30),
        "INVALID_ARGUMENT",
        "needs 256 elements",
    ),
    (
        "typed contents wrong field",
        lambda c, s: s.ModelInfer(typed_request(field="int_contents"), timeout=30),
        "INVALID_ARGUMENT",
        "takes fp32_contents",
    ),
    (
        "FP16 as typed contents",
        lambda c, s: s.ModelInfer(typed_request(field="fp32_contents", datatype="FP16"), timeout=30),
        "INVALID_ARGUMENT",
        "raw_input_contents",
    ),
    (
        "unknown datatype",
        lambda c, s: s.ModelInfer(raw_request(datatype="FP33"), timeout=30),
        "INVALID_ARGUMENT",
        "FP33",
    ),
    (
        "negative dimension",
        lambda c, s: s.ModelInfer(raw_request(shape=[-1, 256]), timeout=30),
        "INVALID_ARGUMENT",
        "negative dimension",
    ),
    (
        "duplicate input",
        lambda c, s: s.ModelInfer(duplicate_request(), timeout=30),
        "INVALID_ARGUMENT",
        "duplicate",
    ),
    (
        "no inputs",
        lambda c, s: s.ModelInfer(pb.ModelInferRequest(model_name="mlp"), timeout=30),
        "INVALID_ARGUMENT",
        "expected 1 inputs but got 0 inputs for model 'mlp'",
    ),
    ("load outside explicit mode", lambda c, s: c.load_model("mlp"), "UNAVAILABLE", "--model-control-mode explicit"),
    ("unload outside explicit mode", lambda c, s: c.unload_model("mlp"), "UNAVAILABLE", "explicit"),
    (
        "named repository",
        lambda c, s: s.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other"), timeout=30),
        "UNIMPLEMENTED",
        "repository_name",
    ),
    (
        "cuda shared memory",
        lambda c, s: c.register_cuda_shared_memory("c", base64.b64encode(bytes(64)), 0, 64),
        "INVALID_ARGUMENT",
        "failed to register CUDA shared memory region 'c'",
    ),
    (
        "trace settings",
        lambda c, s: c.update_trace_settings(settings={"trace_count": "-2"}),
        "INVALID_ARGUMENT",
        "Unable to parse 'trace_count'. Expecting value >= -1, got: -2",
    ),
    (
        "log settings",
        lambda c, s: c.update_log_settings({"log_file": "l.txt"}),
        "UNIMPLEMENTED",
        "log file location can not be updated through network protocol",
    ),
]


def failure(call: Callable[[], Any]) -> tuple[str, str]:
    """The status-code name and message of a call that must fail, through tritonclient or a stub."""
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode."), exc.message()
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()
    raise AssertionError("the call succeeded")


def assert_still_serving(client: Client) -> None:
    result = client.infer("mlp", [fp32([1, 256])])
    assert result.as_numpy("OUTPUT0").shape == (1, 10)


@pytest.mark.parametrize("name,call,code,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_triton_status(
    client: Client, stub: Stub, name: str, call: Call, code: str, fragment: str
) -> None:
    got_code, message = failure(lambda: call(client, stub))
    assert got_code == code, message
    assert message and fragment in message
    assert_still_serving(client)


def test_stream_reports_errors_in_band_with_the_request_id(stub: Stub, client: Client) -> None:
    good = raw_request()
    good.id = "good"
    bad = raw_request(raw=[bytes(10)])
    bad.id = "short"
    replies = list(stub.ModelStreamInfer(iter([bad, good, raw_request(model="nope")]), timeout=30))
    assert len(replies) == 3
    by_id = {r.infer_response.id: r for r in replies}
    assert by_id["short"].error_message.startswith(
        "input byte size mismatch for input 'INPUT0' for model 'mlp'. Expected 1024"
    )
    assert by_id["good"].error_message == "" and len(by_id["good"].infer_response.raw_output_contents) == 1
    assert "'nope'" in by_id["bad"].error_message
    assert_still_serving(client)


def test_oversized_message_is_refused(demo_repository: Path) -> None:
    config = loopback_config(demo_repository, http_max_input_size=4096)
    with running_server(config) as server:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            code, message = failure(lambda: c.infer("mlp", [fp32([8, 256])]))
            assert code == "RESOURCE_EXHAUSTED", message
            assert_still_serving(c)
        finally:
            c.close()


def test_a_model_infer_message_that_does_not_parse_is_invalid_argument(demo_server: ReferenceServer) -> None:
    # Bytes that are no ModelInferRequest (a field 1 of wire type 7, which does not exist).
    with grpc.insecure_channel(f"127.0.0.1:{demo_server.grpc_port}") as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(b"\x0f\xff\xff", timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid inference.ModelInferRequest message" in (refused.value.details() or "")
        assert Stub(channel).ServerLive(pb.ServerLiveRequest(), timeout=30).live  # the connection serves on


async def test_busy_grpc_port_stops_the_started_listeners(demo_repository: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = ReferenceServer(
            ServerConfig(model_repository=demo_repository, http_port=0, grpc_port=port, metrics_port=0)
        )
        with pytest.raises(OSError, match="--grpc-port"):
            await server.start()
    assert server.http_port is not None
    # The HTTP listener had started before the gRPC bind failed, and is closed again.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.http_port), timeout=5).close()


# --- one error hierarchy, two transports ---------------------------------------------------------

# Triton's table (server docs/protocol/README.md): NOT_FOUND↔404, INVALID_ARG↔400, UNAVAILABLE↔503,
# UNSUPPORTED↔501, INTERNAL↔500.
MAPPING = [
    (errors.NotFound, 404, "NOT_FOUND"),
    (errors.InvalidArgument, 400, "INVALID_ARGUMENT"),
    (errors.ModelConfigError, 400, "INVALID_ARGUMENT"),
    (errors.Unavailable, 503, "UNAVAILABLE"),
    (errors.Unsupported, 501, "UNIMPLEMENTED"),
    (errors.InternalError, 500, "INTERNAL"),
    (errors.PayloadTooLarge, 413, "INVALID_ARGUMENT"),
    (CodecError, 400, "INVALID_ARGUMENT"),
    (RuntimeError, 500, "INTERNAL"),  # a bug, not a client error
]


class RaisingPlane:
    """A stand-in DataPlane whose server_metadata fails with the given error."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def server_metadata(self) -> dict[str, Any]:
        raise self.exc


@pytest.mark.parametrize("cls,http_status,grpc_code", MAPPING, ids=[m[0].__name__ for m in MAPPING])
async def test_each_error_class_means_the_same_on_both_transports(
    cls: type[Exception], http_status: int, grpc_code: str, caplog: pytest.LogCaptureFixture
) -> None:
    plane: Any = RaisingPlane(cls("the reason"))
    http_server = build_rest_server(plane, max_request_bytes=1024)
    http_port = await http_server.listen("127.0.0.1", 0)
    grpc_server = GrpcServer(InferenceServicer(plane), max_message_bytes=1024)
    grpc_port = await grpc_server.listen("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{http_port}/v2") as response:
                assert response.status == http_status
                assert "the reason" in (await response.json())["error"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await Stub(channel).ServerMetadata(pb.ServerMetadataRequest(), timeout=30)
        assert info.value.code() == grpc.StatusCode[grpc_code]
        assert "the reason" in (info.value.details() or "")
    finally:
        await grpc_server.stop(0)
        await http_server.stop(0)
    if issubclass(cls, errors.ServerError):
        assert (cls.http_status, cls.grpc_code) == (http_status, grpc_code)
    if cls is RuntimeError:  # a bug: logged with its traceback by both front ends
        assert "internal error serving GET /v2" in caplog.text
        assert "internal error serving gRPC ServerMetadata" in caplog.text


@pytest.mark.parametrize(
    "cls,grpc_call,http_request",
    [
        (errors.NotFound, lambda c: c.get_model_metadata("nope"), ("GET", "/v2/models/nope")),
        (errors.InvalidArgument, lambda c: c.infer("mlp", [fp32([1, 128])]), None),
        (errors.Unavailable, lambda c: c.load_model("mlp"), ("POST", "/v2/repository/models/mlp/load")),
    ],
    ids=["NotFound", "InvalidArgument", "Unavailable"],
)
def test_real_failures_read_the_same_on_both_transports(
    demo_server: ReferenceServer,
    client: Client,
    cls: type[errors.ServerError],
    grpc_call: Callable[[Client], Any],
    http_request: tuple[str, str] | None,
) -> None:
    code, _ = failure(lambda: grpc_call(client))
    method, path = http_request or ("POST", "/v2/models/mlp/infer")
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,128],"datatype":"FP32","data":[' + b",".join([b"0"] * 128) + b"]}]}"
    assert demo_server.http_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", demo_server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body if http_request is None else b"")
        status = conn.getresponse().status
    finally:
        conn.close()
    assert (status, code) == (cls.http_status, cls.grpc_code)
