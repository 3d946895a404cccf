"""The shared-memory registry (`core/shared_memory.py`) on real /dev/shm objects: registration and
its refusals in Triton's words, bounds, overlapping regions, a region unregistered while a request
holds it, an object shrunk under a region, and a request's inputs and outputs bound to regions."""

from __future__ import annotations

import mmap
import os
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from reference_server.core import shared_memory as shm
from reference_server.core.shared_memory import SharedMemoryRegistry
from reference_server.errors import AlreadyExists, InternalError, InvalidArgument, NotFound
from v2kit import codec as v2

MakeKey = Callable[[int], str]


@pytest.fixture
def make_key() -> Iterator[MakeKey]:
    """Creates POSIX shared-memory objects of a given size (as shm_open + ftruncate would) and
    removes them after the test."""
    paths: list[str] = []

    def make(size: int) -> str:
        key = f"/perfkit-test-{uuid.uuid4().hex}"
        path = shm.SHM_DIR + key
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)
        paths.append(path)
        return key

    yield make
    for path in paths:
        os.unlink(path)


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry()
    yield reg
    reg.close()


def put(key: str, offset: int, data: bytes) -> None:
    with open(shm.SHM_DIR + key, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def get(key: str, offset: int, size: int) -> bytes:
    with open(shm.SHM_DIR + key, "rb") as handle:
        handle.seek(offset)
        return handle.read(size)


def test_register_status_unregister(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    key = make_key(64)
    registry.register("a", key, 8, 32)
    assert registry.status() == [{"name": "a", "key": key, "offset": 8, "byte_size": 32}]
    assert registry.status("a") == registry.status()
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'b'"):
        registry.status("b")
    registry.unregister("b")  # unknown: success, as in Triton
    registry.unregister("a")
    assert registry.status() == []


def test_refusals_in_tritons_words(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    key = make_key(64)
    registry.register("a", key, 0, 64)
    with pytest.raises(AlreadyExists, match="shared memory region 'a' already in manager"):
        registry.register("a", key, 0, 8)
    with pytest.raises(InvalidArgument, match=r"Unable to open shared memory region: '/perfkit-no-such-key': no such"):
        registry.register("b", "/perfkit-no-such-key", 0, 8)
    with pytest.raises(InvalidArgument, match=r"failed to register shared memory region 'c': invalid args: offset 60"):
        registry.register("c", key, 60, 8)
    with pytest.raises(InvalidArgument, match="byte_size must be greater than 0"):
        registry.register("d", key, 0, 0)
    with pytest.raises(InvalidArgument, match="offset must be an integer >= 0"):
        registry.register("e", key, -1, 8)
    with pytest.raises(InvalidArgument, match="a name of 1 to 1024 characters, got 1025"):
        registry.register("n" * 1025, key, 0, 8)
    with pytest.raises(InvalidArgument, match="^'region name' is necessary to register system shared memory region$"):
        registry.register("", key, 0, 8)
    assert [r["name"] for r in registry.status()] == ["a"]


@pytest.mark.parametrize("key", ["/../etc/passwd", "/a/b", "/", "", "/..", "/x\0y"])
def test_keys_that_are_no_shm_name_are_refused(registry: SharedMemoryRegistry, key: str) -> None:
    with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
        registry.register("r", key, 0, 8)


def test_a_key_that_is_not_a_regular_file_is_refused(registry: SharedMemoryRegistry) -> None:
    name = f"perfkit-test-dir-{uuid.uuid4().hex}"
    os.mkdir(os.path.join(shm.SHM_DIR, name))
    try:
        with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
            registry.register("r", "/" + name, 0, 8)
    finally:
        os.rmdir(os.path.join(shm.SHM_DIR, name))


def test_unaligned_offsets_and_overlapping_regions_share_bytes(
    registry: SharedMemoryRegistry, make_key: MakeKey
) -> None:
    key = make_key(2 * mmap.ALLOCATIONGRANULARITY)
    offset = mmap.ALLOCATIONGRANULARITY + 12  # neither page-aligned nor at the start
    put(key, offset, b"0123456789")
    registry.register("wide", key, offset, 10)
    registry.register("narrow", key, offset + 4, 4)  # inside "wide"
    wide, narrow = registry.acquire("wide"), registry.acquire("narrow")
    assert wide.read(0, 10) == b"0123456789"
    assert narrow.read(0, 4) == b"4567"
    narrow.write(0, b"abcd")
    assert wide.read(0, 10) == b"0123abcd89"
    assert get(key, offset, 10) == b"0123abcd89"  # the client's view: it is the same memory
    registry.release([wide, narrow])


def test_window_bounds_in_tritons_words(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    registry.register("r", make_key(64), 0, 64)
    region = registry.acquire("r")
    region.check_window(60, 4)
    with pytest.raises(InvalidArgument, match="Invalid offset for shared memory region: 'r'"):
        region.check_window(64, 0)
    with pytest.raises(InvalidArgument, match=r"Invalid offset \+ byte size for shared memory region: 'r'"):
        region.check_window(60, 8)
    registry.release([region])
    with pytest.raises(InvalidArgument, match="Unable to find shared memory region: 'other'"):
        registry.acquire("other")


def test_unregister_while_held_is_refused_in_tritons_words(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    key = make_key(16)
    registry.register("r", key, 0, 16)
    held = registry.acquire("r")
    with pytest.raises(InternalError, match=r"^Cannot unregister shared memory region 'r', it is currently in use\.$"):
        registry.unregister("r")
    assert [r["name"] for r in registry.status()] == ["r"]
    held.write(0, b"still mapped")
    registry.release([held])
    assert not held.closed
    registry.unregister("r")  # once no request holds it
    assert held.closed and registry.status() == []


def test_unregister_all_leaves_held_regions_and_names_them(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    for name in ("c", "a", "b"):
        registry.register(name, make_key(8), 0, 8)
    held = [registry.acquire("c"), registry.acquire("a")]
    with pytest.raises(InternalError) as caught:
        registry.unregister()
    assert caught.value.message == "Failed to unregister the following system shared memory regions: a ,c ,"
    assert sorted(r["name"] for r in registry.status()) == ["a", "c"]
    registry.release(held)
    registry.unregister()
    assert registry.status() == [] and all(region.closed for region in held)


def test_the_servers_stop_retires_held_regions_once_released(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    registry.register("a", make_key(8), 0, 8)
    held = registry.acquire("a")
    registry.close()
    assert registry.status() == []
    assert held.read(0, 8) == bytes(8)
    registry.release([held])
    assert held.closed


def test_an_object_shrunk_after_registering_is_refused_not_a_crash(
    registry: SharedMemoryRegistry, make_key: MakeKey
) -> None:
    key = make_key(2 * mmap.ALLOCATIONGRANULARITY)
    registry.register("r", key, 0, 2 * mmap.ALLOCATIONGRANULARITY)
    os.truncate(shm.SHM_DIR + key, 16)  # touching the mapping past 16 bytes would now be SIGBUS
    region = registry.acquire("r")
    with pytest.raises(InvalidArgument, match=f"key '{key}' shrank to 16 bytes"):
        region.read(mmap.ALLOCATIONGRANULARITY, 8)
    with pytest.raises(InvalidArgument, match="shrank"):
        region.write(0, b"x")
    registry.release([region])


def test_the_number_of_regions_is_bounded(make_key: MakeKey) -> None:
    registry = SharedMemoryRegistry(max_regions=2)
    key = make_key(8)
    registry.register("a", key, 0, 8)
    registry.register("b", key, 0, 8)
    with pytest.raises(InvalidArgument, match="already holds 2 regions, its limit; unregister some"):
        registry.register("c", key, 0, 8)
    registry.close()


def _request(inputs: list[v2.InferTensor], outputs: list[v2.RequestedOutput] | None = None) -> v2.InferRequest:
    return v2.InferRequest("m", inputs=inputs, outputs=outputs)


def _placeholder(name: str, datatype: str, shape: list[int], region: str, offset: int, size: int) -> v2.InferTensor:
    parameters = {"shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": size}
    return v2.InferTensor(name, datatype, shape, np.empty(0, v2.datatype_to_numpy(datatype)), parameters)


def test_bind_reads_inputs_and_writes_outputs(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    key = make_key(256)
    values = np.arange(6, dtype=np.int32)
    strings = v2.serialize_bytes_tensor(np.array([b"ab", b"", b"\x00\xff"], dtype=object))
    put(key, 0, values.tobytes())
    put(key, 32, strings)
    registry.register("in", key, 0, 128)
    registry.register("out", key, 128, 128)
    request = _request(
        [_placeholder("X", "INT32", [2, 3], "in", 0, 24), _placeholder("S", "BYTES", [3], "in", 32, len(strings))],
        [v2.RequestedOutput("Y", parameters={"shared_memory_region": "out", "shared_memory_byte_size": 64})],
    )
    binding = registry.bind(request)
    assert binding is not None
    np.testing.assert_array_equal(request.inputs[0].data, values.reshape(2, 3))
    assert list(request.inputs[1].data) == [b"ab", b"", b"\x00\xff"]
    put(key, 0, bytes(24))  # the client reuses its buffer: the request keeps what it read
    assert request.inputs[0].data.sum() == values.sum()

    result = np.full((2, 2), 7.5, np.float32)
    response = v2.InferResponse("m", "1", outputs=[v2.InferTensor("Y", "FP32", [2, 2], result)])
    written = binding.write(response).outputs[0]
    assert written.data.size == 0 and written.parameters["shared_memory_region"] == "out"
    assert get(key, 128, 16) == result.tobytes()
    binding.release()
    registry.unregister()  # nothing holds them any more: unmapped at once


def test_bind_refusals(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    registry.register("r", make_key(64), 0, 64)
    with pytest.raises(
        InvalidArgument, match=r"input byte size mismatch for input 'X' for model 'm'. Expected 16, got 12"
    ):
        registry.bind(_request([_placeholder("X", "FP32", [4], "r", 0, 12)]))
    with pytest.raises(InvalidArgument, match="Unable to find shared memory region: 'gone'"):
        registry.bind(_request([_placeholder("X", "FP32", [4], "gone", 0, 16)]))
    bad_output = [v2.RequestedOutput("Y", parameters={"shared_memory_region": "r", "shared_memory_offset": 64})]
    with pytest.raises(v2.CodecError, match="needs shared_memory_byte_size"):
        registry.bind(_request([v2.InferTensor("X", "FP32", [1], np.zeros(1, np.float32))], bad_output))

    small = [v2.RequestedOutput("Y", parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})]
    binding = registry.bind(_request([v2.InferTensor("X", "FP32", [1], np.zeros(1, np.float32))], small))
    assert binding is not None
    response = v2.InferResponse("m", "1", outputs=[v2.InferTensor("Y", "FP32", [4], np.zeros(4, np.float32))])
    with pytest.raises(
        InvalidArgument, match=r"output 'Y' \(8 bytes\) should be at least 16 bytes to hold the results"
    ):
        binding.write(response)
    binding.release()
    # Every refusal above let go of what it held: the region unmaps at once.
    region = registry.acquire("r")
    registry.release([region])
    registry.unregister("r")
    assert region.closed


def test_bind_checks_the_request_before_reading_a_region(registry: SharedMemoryRegistry, make_key: MakeKey) -> None:
    registry.register("r", make_key(64), 0, 64)
    seen: list[v2.InferRequest] = []

    def refuse(request: v2.InferRequest) -> None:
        seen.append(request)
        raise InvalidArgument("too many elements")

    request = _request([_placeholder("X", "FP32", [4], "r", 0, 16)])
    with pytest.raises(InvalidArgument, match="too many elements"):
        registry.bind(request, refuse)
    assert seen == [request] and request.inputs[0].data.size == 0  # nothing was read
    region = registry.acquire("r")
    registry.release([region])
    registry.unregister("r")
    assert region.closed  # and nothing is held


def test_a_request_naming_no_region_binds_nothing(registry: SharedMemoryRegistry) -> None:
    assert registry.bind(_request([v2.InferTensor("X", "FP32", [1], np.zeros(1, np.float32))])) is None


def test_cuda_shared_memory_is_refused_clearly_without_a_gpu(make_key: MakeKey) -> None:
    registry = SharedMemoryRegistry(cuda_unavailable=lambda: "no GPU: NVML (pynvml) sees none on this machine")
    assert not registry.cuda_available()
    with pytest.raises(InvalidArgument, match=r"CUDA shared memory is not available on this server \(no GPU"):
        registry.cuda_register("c", b"\0" * 64, 0, 64)
    assert registry.cuda_status() == []
    registry.cuda_unregister("c")
    registry.register("sys", make_key(8), 0, 8)
    with pytest.raises(NotFound, match="'sys' is registered as system shared memory, not CUDA shared memory"):
        registry.cuda_status("sys")
    with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'c'"):
        registry.cuda_status("c")
    registry.close()
