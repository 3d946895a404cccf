"""CUDA shared memory without a GPU: the server's registry of CUDA regions over host memory standing
in for opened IPC handles (validation, Triton's words, one namespace with system regions, a
request's tensors bound to a CUDA region), the refusals that name what is missing, and perfkit's
region lifetime over stand-ins for tritonclient's utilities. tests/gpu drives the real thing."""

from __future__ import annotations

import base64
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from perfkit.errors import PerfkitError
from perfkit.wire import shared_memory as client_shm
from reference_server.core.shared_memory import SharedMemoryRegistry
from reference_server.errors import AlreadyExists, InternalError, InvalidArgument, NotFound
from v2kit import codec as v2
from v2kit.runtime import cuda

HANDLE = bytes(range(64))


class HostMemory:
    """What `cuda.IpcMemory` offers, over a bytearray: the allocation a handle names."""

    def __init__(self, size: int) -> None:
        self.size, self.data, self.closed = size, bytearray(size), False

    def read(self, offset: int, byte_size: int) -> bytes:
        assert not self.closed
        return bytes(self.data[offset : offset + byte_size])

    def write(self, offset: int, data: bytes) -> None:
        assert not self.closed
        self.data[offset : offset + len(data)] = data

    def close(self) -> None:
        self.closed = True


class Allocations:
    """The device allocations clients exported, by handle; opening an unknown handle fails as CUDA does."""

    def __init__(self) -> None:
        self.by_handle: dict[bytes, HostMemory] = {}
        self.opened: list[tuple[bytes, int]] = []

    def open(self, raw_handle: bytes, device_id: int) -> HostMemory:
        self.opened.append((raw_handle, device_id))
        if raw_handle not in self.by_handle:
            raise cuda.CudaError("cudaIpcOpenMemHandle failed: cudaErrorInvalidValue")
        return self.by_handle[raw_handle]


@pytest.fixture
def allocations() -> Allocations:
    return Allocations()


@pytest.fixture
def registry(allocations: Allocations) -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry(cuda_opener=allocations.open, cuda_unavailable=lambda: None)
    yield reg
    reg.close()


def test_register_status_and_unregister_in_tritons_words(
    registry: SharedMemoryRegistry, allocations: Allocations
) -> None:
    memory = allocations.by_handle[HANDLE] = HostMemory(256)
    assert registry.cuda_available()
    registry.cuda_register("c", HANDLE, 0, 128)
    assert allocations.opened == [(HANDLE, 0)]
    assert registry.cuda_status() == [{"name": "c", "device_id": 0, "byte_size": 128}]
    assert registry.cuda_status("c") == registry.cuda_status()
    assert registry.status() == []  # the system extension sees only its own kind
    with pytest.raises(NotFound, match="'c' is registered as CUDA shared memory, not system shared memory"):
        registry.status("c")
    with pytest.raises(AlreadyExists, match="shared memory region 'c' already in manager"):
        registry.cuda_register("c", HANDLE, 0, 8)
    registry.unregister("c")  # the system extension's unregister leaves a CUDA region alone
    assert not memory.closed and len(registry.cuda_status()) == 1
    registry.cuda_unregister()
    assert memory.closed and registry.cuda_status() == []


@pytest.mark.parametrize(
    ("handle", "device_id", "byte_size", "words"),
    [
        (HANDLE[:10], 0, 8, r"'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t \(64 bytes, got 10\)"),
        (HANDLE, 0, 0, "invalid args: byte_size must be greater than 0"),
        (HANDLE, -1, 8, "device_id must be an integer >= 0, got -1"),
        (HANDLE, 0, 257, r"invalid args: byte_size 257 is past the end of the CUDA allocation \(256 bytes\)"),
        (bytes(64), 0, 8, r"invalid args: cannot open the CUDA IPC handle on device 0 \(cudaIpcOpenMemHandle failed"),
    ],
    ids=["short-handle", "zero-size", "negative-device", "past-the-allocation", "unknown-handle"],
)
def test_bad_registrations_are_refused(
    registry: SharedMemoryRegistry, allocations: Allocations, handle: bytes, device_id: int, byte_size: int, words: str
) -> None:
    memory = allocations.by_handle[HANDLE] = HostMemory(256)
    with pytest.raises(InvalidArgument, match=words):
        registry.cuda_register("c", handle, device_id, byte_size)
    assert registry.cuda_status() == []
    assert memory.closed == (byte_size == 257)  # opened, found too small, closed again


def test_a_request_reads_inputs_from_and_writes_outputs_to_cuda_regions(
    registry: SharedMemoryRegistry, allocations: Allocations
) -> None:
    memory = allocations.by_handle[HANDLE] = HostMemory(64)
    values = np.arange(4, dtype=np.float32)
    memory.write(0, values.tobytes())
    registry.cuda_register("c", HANDLE, 0, 64)
    where = {"shared_memory_region": "c", "shared_memory_offset": 0, "shared_memory_byte_size": 16}
    tensor = v2.InferTensor("X", "FP32", [4], np.empty(0, np.float32), dict(where))
    out = {**where, "shared_memory_offset": 32}
    request = v2.InferRequest("m", inputs=[tensor], outputs=[v2.RequestedOutput("Y", parameters=out)])
    binding = registry.bind(request)
    assert binding is not None
    np.testing.assert_array_equal(request.inputs[0].data, values)
    response = v2.InferResponse("m", "1", outputs=[v2.InferTensor("Y", "FP32", [4], values * 2)])
    (written,) = binding.write(response).outputs
    assert written.data.size == 0 and written.parameters["shared_memory_region"] == "c"
    np.testing.assert_array_equal(np.frombuffer(memory.read(32, 16), np.float32), values * 2)
    with pytest.raises(InternalError, match="Cannot unregister shared memory region 'c', it is currently in use"):
        registry.cuda_unregister("c")  # the request still holds it
    assert not memory.closed
    binding.release()
    registry.cuda_unregister("c")
    assert memory.closed
    registry.cuda_register("c", HANDLE, 0, 64)  # the name is free again once unregistered
    past_the_end = v2.InferTensor("X", "FP32", [4], np.empty(0, np.float32), {**where, "shared_memory_offset": 60})
    with pytest.raises(InvalidArgument, match=r"Invalid offset \+ byte size for shared memory region: 'c'"):
        registry.bind(v2.InferRequest("m", inputs=[past_the_end]))


def test_refusals_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda.gpu, "gpu_count", lambda: 0)
    assert cuda.unavailable_reason() == "no GPU: NVML (pynvml) sees none on this machine"
    monkeypatch.setattr(cuda.gpu, "gpu_count", lambda: 1)

    def no_cuda_python() -> Any:
        raise ModuleNotFoundError("No module named 'cuda'")

    monkeypatch.setattr(cuda, "_runtime", no_cuda_python)
    reason = cuda.unavailable_reason()
    assert reason is not None and "pip install cuda-python" in reason
    registry = SharedMemoryRegistry()
    assert not registry.cuda_available()
    with pytest.raises(InvalidArgument, match=r"not available on this server \(cuda-python is not installed; pip"):
        registry.cuda_register("c", HANDLE, 0, 8)
    message = client_shm.cuda_unsupported()
    assert message is not None and message.startswith("--shared-memory cuda: cuda-python is not installed")


def test_perfkit_says_when_tritonclients_cuda_utilities_do_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_shm.cuda, "unavailable_reason", lambda: None)
    monkeypatch.setitem(sys.modules, "tritonclient.utils.cuda_shared_memory", None)  # import fails
    message = client_shm.cuda_unsupported()
    assert message is not None and "pip install 'tritonclient[cuda]'" in message


class FakeUtilities(types.ModuleType):
    """tritonclient.utils.cuda_shared_memory's calls that perfkit makes, recorded."""

    class CudaSharedMemoryException(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("fake_cuda_shared_memory")
        self.calls: list[tuple[Any, ...]] = []

    def create_shared_memory_region(self, name: str, byte_size: int, device_id: int) -> str:
        self.calls.append(("create", name, byte_size, device_id))
        return f"handle-{name}"

    def set_shared_memory_region(self, handle: str, values: list[np.ndarray]) -> None:
        self.calls.append(("set", handle, b"".join(v.tobytes() for v in values)))

    def get_raw_handle(self, handle: str) -> bytes:
        return base64.b64encode(handle.encode())

    def destroy_shared_memory_region(self, handle: str) -> None:
        self.calls.append(("destroy", handle))


class Registrar:
    url = "127.0.0.1:1"

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.calls.append(("register", name, raw_handle, device_id, byte_size))

    async def unregister_cuda_shared_memory(self, name: str) -> None:
        self.calls.append(("unregister", name))

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        raise AssertionError("a CUDA run registers no system region")

    async def unregister_system_shared_memory(self, name: str) -> None:
        raise AssertionError("a CUDA run registers no system region")


async def test_perfkit_registers_cuda_regions_and_frees_them_however_the_run_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    utilities = FakeUtilities()
    monkeypatch.setattr(client_shm, "_cuda_utilities", lambda: utilities)
    request = v2.InferRequest("m", inputs=[v2.InferTensor("X", "INT32", [2], np.array([1, 2], np.int32))])
    plan = client_shm.plan_regions([request], ["Y"], output_size=16, batch_size=1, prefix="p")
    with pytest.raises(RuntimeError, match="the run failed"):
        async with client_shm.registered_regions(Registrar(utilities.calls), plan, "cuda") as requests:
            assert requests[0].inputs[0].parameters["shared_memory_region"] == "p_in0_0"
            raise RuntimeError("the run failed")
    assert utilities.calls == [
        ("create", "p_out0", 16, 0),
        ("create", "p_in0_0", 8, 0),
        ("set", "handle-p_in0_0", np.array([1, 2], np.int32).tobytes()),
        ("register", "p_out0", b"handle-p_out0", 0, 16),
        ("register", "p_in0_0", b"handle-p_in0_0", 0, 8),
        ("unregister", "p_in0_0"),
        ("unregister", "p_out0"),
        ("destroy", "handle-p_out0"),
        ("destroy", "handle-p_in0_0"),
    ]


def test_perfkit_refuses_a_server_without_the_cuda_extension() -> None:
    with pytest.raises(PerfkitError, match="does not offer Triton's CUDA shared memory extension") as caught:
        client_shm.check_extension({"extensions": ["system_shared_memory"]}, "h:1", "cuda")
    assert caught.value.exit_code == 2


def test_a_region_that_fails_to_close_is_unregistered_all_the_same(
    registry: SharedMemoryRegistry, allocations: Allocations, caplog: pytest.LogCaptureFixture
) -> None:
    memory = allocations.by_handle[HANDLE] = HostMemory(64)

    def fail() -> None:
        raise cuda.CudaError("cudaIpcCloseMemHandle failed: cudaErrorInvalidValue")

    memory.close = fail  # type: ignore[method-assign]
    registry.cuda_register("c", HANDLE, 0, 64)
    registry.cuda_unregister("c")
    assert registry.cuda_status() == [] and "did not close cleanly" in caplog.text
