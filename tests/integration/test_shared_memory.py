"""The system shared memory extension, driven by NVIDIA's own clients: tritonclient's
`shared_memory` utilities with its HTTP and gRPC clients, and perf_analyzer `--shared-memory system`.

Each refusal is checked for Triton's words and status (as Triton 2.51 answers them; where Triton
says INTERNAL to a client's mistake, a key it cannot open or an output region too small, 400 /
INVALID_ARGUMENT here), and the server serves an ordinary request after all of them. CUDA shared
memory is refused clearly where it cannot work (tests/gpu drives it where it can); the routes of extensions the server does not offer answer 501, not 404.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config
from v2kit.runtime import cuda

pytestmark = pytest.mark.integration

TRANSPORTS = ["http", "grpc"]


def _model(
    repository: Path, name: str, nodes: list[Any], inputs: dict[str, int], outputs: dict[str, int], extra: str = ""
) -> None:
    def infos(tensors: dict[str, int]) -> list[Any]:
        return [helper.make_tensor_value_info(n, t, ["batch", "n"]) for n, t in tensors.items()]

    graph = helper.make_graph(nodes, name, infos(inputs), infos(outputs))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    (repository / name / "1").mkdir(parents=True)
    onnx.save(model, repository / name / "1" / "model.onnx")
    kinds = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.STRING: "TYPE_STRING"}
    tensors = {
        kind: ", ".join(f'{{ name: "{n}" data_type: {kinds[t]} dims: [ -1 ] }}' for n, t in ts.items())
        for kind, ts in (("input", inputs), ("output", outputs))
    }
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f"input [ {tensors['input']} ]\noutput [ {tensors['output']} ]\n{extra}"
    )


#: A python model that says when it starts (a file) and answers only once the test lets it (another).
_GATED = """
import json, os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        open(self.gate + ".started", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(self.gate + ".open") and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests
        ]
"""


def _gated_model(repository: Path, gate: Path) -> None:
    (repository / "gated" / "1").mkdir(parents=True)
    (repository / "gated" / "1" / "model.py").write_text(_GATED)
    (repository / "gated" / "config.pbtxt").write_text(
        'name: "gated"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f'parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}\n'
    )


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "gate"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[ReferenceServer]:
    repository = tmp_path_factory.mktemp("shm") / "models"
    _gated_model(repository, gate)
    f32, text = TensorProto.FLOAT, TensorProto.STRING
    _model(repository, "identity", [helper.make_node("Identity", ["X"], ["Y"])], {"X": f32}, {"Y": f32})
    cached = "response_cache { enable: true }\n"
    _model(repository, "cached", [helper.make_node("Identity", ["X"], ["Y"])], {"X": f32}, {"Y": f32}, cached)
    _model(repository, "add", [helper.make_node("Add", ["A", "B"], ["SUM"])], {"A": f32, "B": f32}, {"SUM": f32})
    _model(repository, "echo", [helper.make_node("Identity", ["T"], ["U"])], {"T": text}, {"U": text})
    with running_server(loopback_config(repository, response_cache_bytes=1 << 20)) as running:
        yield running


class Regions:
    """Shared-memory objects made with tritonclient's utilities, destroyed after the test."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def create(self, byte_size: int) -> tuple[str, Any]:
        key = f"/perfkit-test-{uuid.uuid4().hex}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, byte_size)
        self.handles.append(handle)
        return key, handle


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    for handle in made.handles:
        shm.destroy_shared_memory_region(handle)


Client = Any  # httpclient or grpcclient InferenceServerClient


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, server: ReferenceServer) -> Iterator[tuple[Any, Client]]:
    if request.param == "http":
        module: Any = httpclient
        client: Client = httpclient.InferenceServerClient(server.http_url)
    else:
        module, client = grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield module, client
    client.unregister_system_shared_memory()  # whatever a test left registered
    client.close()


def shm_input(module: Any, name: str, shape: list[int], datatype: str, region: str, size: int, offset: int = 0) -> Any:
    tensor = module.InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, size, offset=offset)
    return tensor


def shm_output(module: Any, name: str, region: str, size: int, offset: int = 0) -> Any:
    output = module.InferRequestedOutput(name)
    output.set_shared_memory(region, size, offset=offset)
    return output


def failure(call: Callable[[], Any]) -> tuple[str, str]:
    """The status of a call that must fail (an HTTP code, or a gRPC code's name) and its message."""
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode."), exc.message() or ""
    raise AssertionError("the call succeeded")


def test_metadata_lists_cuda_shared_memory_only_where_it_works(transport: tuple[Any, Client]) -> None:
    module, client = transport
    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if module is httpclient else list(metadata.extensions)
    assert "system_shared_memory" in extensions
    assert ("cuda_shared_memory" in extensions) == (cuda.unavailable_reason() is None)


def test_register_infer_through_regions_and_unregister(transport: tuple[Any, Client], regions: Regions) -> None:
    module, client = transport
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    in_key, in_handle = regions.create(x.nbytes)
    out_key, out_handle = regions.create(64)
    shm.set_shared_memory_region(in_handle, [x])
    client.register_system_shared_memory("in", in_key, x.nbytes)
    client.register_system_shared_memory("out", out_key, 48, offset=16)

    status = client.get_system_shared_memory_status()
    if module is grpcclient:
        status = [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in status.regions.values()
        ]
    assert sorted(status, key=lambda r: r["name"]) == [
        {"name": "in", "key": in_key, "offset": 0, "byte_size": 32},
        {"name": "out", "key": out_key, "offset": 16, "byte_size": 48},
    ]

    result = client.infer(
        "identity", [shm_input(module, "X", [2, 4], "FP32", "in", 32)], outputs=[shm_output(module, "Y", "out", 32, 8)]
    )
    # The data is in the region, not the response: no data and no parameters, as in Triton's.
    if module is httpclient:
        assert result.get_output("Y") == {"name": "Y", "datatype": "FP32", "shape": [2, 4]}
    else:
        assert not result.get_output("Y").parameters
        assert list(result.get_response().raw_output_contents) == [b""]
    got = shm.get_contents_as_numpy(out_handle, np.float32, [2, 4], offset=16 + 8)
    np.testing.assert_array_equal(got, x)

    client.unregister_system_shared_memory("in")
    client.unregister_system_shared_memory()
    remaining = client.get_system_shared_memory_status()
    assert (remaining if module is httpclient else list(remaining.regions)) == []


def test_bytes_and_mixed_inputs(transport: tuple[Any, Client], regions: Regions) -> None:
    module, client = transport
    texts = np.array([[b"he\x00llo", b"", "caf\u00e9".encode()]], dtype=object)
    serialized = serialize_byte_tensor(texts)  # Triton's length-prefixed form
    key, handle = regions.create(256)
    shm.set_shared_memory_region(handle, [serialized])
    client.register_system_shared_memory("strings", key, 256)
    client.register_system_shared_memory("strings_out", key, 128, offset=128)  # the same object's second half
    client.infer(
        "echo",
        [shm_input(module, "T", [1, 3], "BYTES", "strings", len(serialized.item()))],
        outputs=[shm_output(module, "U", "strings_out", 128)],
    )
    got = shm.get_contents_as_numpy(handle, np.object_, [1, 3], offset=128)
    assert got.tolist() == texts.tolist()

    # One input from a region, the other in the request (gRPC: one raw entry, for B alone).
    a = np.full((1, 3), 1.5, np.float32)
    b = np.array([[1, 2, 3]], np.float32)
    shm.set_shared_memory_region(handle, [a])
    client.register_system_shared_memory("a", key, 12)
    inline = module.InferInput("B", [1, 3], "FP32")
    inline.set_data_from_numpy(b)
    result = client.infer("add", [shm_input(module, "A", [1, 3], "FP32", "a", 12), inline])
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)


def test_refusals_in_tritons_words(transport: tuple[Any, Client], regions: Regions) -> None:
    module, client = transport
    http = module is httpclient
    key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [np.ones(16, np.float32)])
    client.register_system_shared_memory("r", key, 64)

    def infer(region: str = "r", offset: int = 0, out_size: int = 16) -> Any:
        output = shm_output(module, "Y", "r", out_size, 48)
        return client.infer("identity", [shm_input(module, "X", [1, 4], "FP32", region, 16, offset)], outputs=[output])

    cases = [
        (lambda: client.register_system_shared_memory("r", key, 8), "400", "ALREADY_EXISTS", "shared memory region 'r' already in manager"),
        (lambda: client.register_system_shared_memory("n", "/perfkit-no-such-key", 8), "400", "INVALID_ARGUMENT", "Unable to open shared memory region: '/perfkit-no-such-key'"),
        (lambda: client.register_system_shared_memory("p", key, 16, offset=56), "400", "INVALID_ARGUMENT", "failed to register shared memory region 'p': invalid args"),
        (lambda: client.get_system_shared_memory_status("nope"), "404", "NOT_FOUND", "Unable to find system shared memory region: 'nope'"),
        (lambda: infer(region="nope"), "400", "INVALID_ARGUMENT", "Unable to find shared memory region: 'nope'"),
        (lambda: infer(offset=56), "400", "INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'r'"),
        (lambda: infer(offset=64), "400", "INVALID_ARGUMENT", "Invalid offset for shared memory region: 'r'"),
        (lambda: infer(out_size=8), "400", "INVALID_ARGUMENT", "output 'Y' (8 bytes) should be at least 16 bytes to hold the results"),
    ]  # fmt: skip
    for call, http_status, grpc_code, fragment in cases:
        status, message = failure(call)
        assert (status, fragment in message) == (http_status if http else grpc_code, True), message
    # The server's element limit holds before anything is copied out of a region (none is named here).
    huge = shm_input(module, "X", [1, 20_000_000], "FP32", "not-even-registered", 80_000_000)
    with pytest.raises(InferenceServerException, match="--max-tensor-elements"):
        client.infer("identity", [huge])
    with pytest.raises(InferenceServerException, match="input byte size mismatch for input 'X' for model 'identity'"):
        client.infer("identity", [shm_input(module, "X", [1, 3], "FP32", "r", 16)])

    client.unregister_system_shared_memory("never-registered")  # Triton: success
    infer()  # the server and the region are fine after all that
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [4], offset=48), np.ones(4))


def test_a_region_a_request_uses_cannot_be_unregistered_until_it_is_done(
    server: ReferenceServer, regions: Regions, gate: Path
) -> None:
    """Triton 2.51's refusal (shared_memory_manager.cc), over HTTP (500) and gRPC (INTERNAL)."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory("in_use", key, 64)
    pending = client.async_infer(
        "gated",
        [shm_input(httpclient, "X", [1, 3], "FP32", "in_use", 12)],
        outputs=[shm_output(httpclient, "Y", "in_use", 12, offset=32)],
    )
    started = Path(f"{gate}.started")
    deadline = time.monotonic() + 60
    while not started.exists():  # the model is running the request
        assert time.monotonic() < deadline, "the gated model never started"
        time.sleep(0.01)
    in_use = "Cannot unregister shared memory region 'in_use', it is currently in use."
    assert failure(lambda: client.unregister_system_shared_memory("in_use")) == ("500", in_use)
    all_words = "Failed to unregister the following system shared memory regions: in_use ,"
    assert failure(lambda: client.unregister_system_shared_memory()) == ("500", all_words)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as rpc:
        with pytest.raises(InferenceServerException) as caught:
            rpc.unregister_system_shared_memory("in_use")
        assert (caught.value.status(), caught.value.message()) == ("StatusCode.INTERNAL", in_use)
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["in_use"]

    Path(f"{gate}.open").touch()  # let the model answer: its output goes to the region
    pending.get_result(timeout=60)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 3], offset=32), x)
    client.unregister_system_shared_memory("in_use")  # done: now it goes
    assert client.get_system_shared_memory_status() == []
    client.close()


def test_a_cache_hit_still_writes_the_requests_own_output_region(
    transport: tuple[Any, Client], regions: Regions
) -> None:
    module, client = transport
    # Inputs of this transport's own: the module's one server keeps the other's in its cache.
    x = np.array([[4.0, 5.0, 6.0]], np.float32) + (0 if module is httpclient else 10)
    key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory("x", key, 12)
    client.register_system_shared_memory("first", key, 16, offset=16)
    client.register_system_shared_memory("second", key, 16, offset=32)
    before = _cache_hits(client, module)
    for out in ("first", "second"):  # the same inputs: the second is answered from the cache
        client.infer(
            "cached", [shm_input(module, "X", [1, 3], "FP32", "x", 12)], outputs=[shm_output(module, "Y", out, 16)]
        )
    assert _cache_hits(client, module) == before + 1
    for offset in (16, 32):
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 3], offset=offset), x)


def _cache_hits(client: Client, module: Any) -> int:
    stats = client.get_inference_statistics("cached")
    if module is httpclient:
        return int(stats["model_stats"][0]["inference_stats"]["cache_hit"]["count"])
    return int(stats.model_stats[0].inference_stats.cache_hit.count)


def test_cuda_shared_memory_is_refused_clearly(transport: tuple[Any, Client]) -> None:
    module, client = transport
    status, message = failure(lambda: client.register_cuda_shared_memory("c", base64.b64encode(bytes(64)), 0, 64))
    assert status == ("400" if module is httpclient else "INVALID_ARGUMENT")
    # A handle of zeros opens nowhere; without a GPU or cuda-python, the refusal says which is missing.
    words = "CUDA shared memory is not available on this server" if cuda.unavailable_reason() else "invalid args"
    assert "failed to register CUDA shared memory region 'c'" in message and words in message
    status_reply = client.get_cuda_shared_memory_status()
    assert (status_reply if module is httpclient else list(status_reply.regions)) == []
    client.unregister_cuda_shared_memory()


class DeviceStandIn:
    """Host memory standing in for a client's device allocation, as `cuda.IpcMemory` offers it."""

    def __init__(self, size: int) -> None:
        self.size, self.data, self.closed = size, bytearray(size), False

    def read(self, offset: int, byte_size: int) -> bytes:
        return bytes(self.data[offset : offset + byte_size])

    def write(self, offset: int, data: bytes) -> None:
        self.data[offset : offset + len(data)] = data

    def close(self) -> None:
        self.closed = True


def test_cuda_routes_and_binding_over_a_stand_in_for_the_device(
    transport: tuple[Any, Client], server: ReferenceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA extension's front ends and request binding, where only opening the handle is not real
    (tests/gpu opens real ones)."""
    module, client = transport
    registry = server.dataplane.shared_memory  # type: ignore[union-attr]
    memory, opened = DeviceStandIn(64), []
    monkeypatch.setattr(registry, "_cuda_opener", lambda handle, device: opened.append((handle, device)) or memory)
    monkeypatch.setattr(registry, "_cuda_reason", [None])
    metadata = client.get_server_metadata()
    assert "cuda_shared_memory" in (metadata["extensions"] if module is httpclient else metadata.extensions)
    x = np.arange(4, dtype=np.float32)
    memory.write(0, x.tobytes())
    client.register_cuda_shared_memory("dev", base64.b64encode(bytes(range(64))), 0, 64)
    try:
        assert opened == [(bytes(range(64)), 0)]
        status = client.get_cuda_shared_memory_status("dev")
        if module is grpcclient:
            status = [
                {"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in status.regions.values()
            ]
        assert status == [{"name": "dev", "device_id": 0, "byte_size": 64}]
        client.infer(
            "identity",
            [shm_input(module, "X", [1, 4], "FP32", "dev", 16)],
            outputs=[shm_output(module, "Y", "dev", 16, 32)],
        )
        np.testing.assert_array_equal(np.frombuffer(memory.read(32, 16), np.float32), x)
    finally:
        client.unregister_cuda_shared_memory("dev")
    assert memory.closed


REGISTER = "/v2/systemsharedmemory/region/r/register"
CUDA_REGISTER = "/v2/cudasharedmemory/region/c/register"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fragment"),
    [
        ("POST", "/v2/trace/setting", b'{"trace_file": "t.json"}', 501, "trace file location can not be updated"),
        ("POST", "/v2/models/identity/trace/setting", b'{"trace_rate": "x"}', 400, "Unable to parse 'trace_rate'"),
        ("GET", "/v2/models/nosuch/trace/setting", None, 400, "Request for unknown model : nosuch"),
        ("POST", "/v2/logging", b'{"log_file": "l.txt"}', 501, "log file location can not be updated"),
        ("POST", REGISTER, b"{}", 400, "Shared memory register request has no 'key' field"),
        ("POST", REGISTER, b'{"key": "/k"}', 400, "Shared memory register request has no 'byte_size' field"),
        ("POST", REGISTER, b'{"key": 5, "byte_size": 8}', 400, "field 'key' must be a string"),
        ("POST", REGISTER, b'{"key": "/k", "byte_size": -8}', 400, "field 'byte_size' must be an integer >= 0"),
        ("POST", REGISTER, b'{"key": "/k", "byte_size": 8, "offset": true}', 400, "'offset' must be an integer"),
        ("POST", REGISTER, b"[", 400, "not valid JSON"),
        ("POST", "/v2/cudasharedmemory/region/c/register", b"{}", 400, "has no 'raw_handle' field"),
        ("POST", CUDA_REGISTER, b'{"raw_handle": {"b64": "!"}, "byte_size": 8}', 400, "valid base64 encoded"),
        ("POST", CUDA_REGISTER, b'{"raw_handle": "AAAA", "byte_size": 8}', 400, "'raw_handle' must be a JSON object"),
        ("POST", CUDA_REGISTER, b'{"raw_handle": {"b64": "AAAA"}, "byte_size": 8}', 400, "(64 bytes, got 3)"),
        ("GET", REGISTER, None, 405, "Method Not Allowed"),
    ],
)
def test_http_routes(
    server: ReferenceServer, method: str, path: str, body: bytes | None, status: int, fragment: str
) -> None:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method=method)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == status
    assert fragment in json.loads(caught.value.read())["error"]


#: perf_analyzer's flags per transport; the stream goes through the data plane's `infer_stream`.
PA_TRANSPORTS = {"http": [], "grpc": ["-i", "grpc"], "grpc-streaming": ["-i", "grpc", "--streaming"]}


@pytest.mark.peers
@pytest.mark.parametrize("transport_name", list(PA_TRANSPORTS))
def test_perf_analyzer_with_system_shared_memory(peers: Path, server: ReferenceServer, transport_name: str) -> None:
    port = server.http_port if transport_name == "http" else server.grpc_port
    flags = PA_TRANSPORTS[transport_name]
    result = subprocess.run(
        [
            str(peers / "bin" / "perf_analyzer"), *flags, "-m", "identity", "-u", f"127.0.0.1:{port}",
            "--shared-memory", "system", "--output-shared-memory-size", "1024", "--shape", "X:16",
            "--concurrency-range", "2", "--request-count", "200",  # a fixed count: no stability search
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Inference count" in result.stdout
    # perf_analyzer unregisters its regions when it is done.
    with urllib.request.urlopen(f"http://{server.http_url}/v2/systemsharedmemory/status", timeout=30) as reply:
        assert json.loads(reply.read()) == []
