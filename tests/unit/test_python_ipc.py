"""The python backend's shared memory and control channel (`backends/python/ipc.py`), and the parts of
`triton_python_backend_utils` that need no stub."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_server.backends.python import ipc
from reference_server.backends.python.pb import triton_python_backend_utils as pb_utils


@pytest.fixture
def arena() -> Any:
    arena = ipc.Arena.create("test", 1 << 16)
    yield arena
    arena.close()


def test_the_allocator_reuses_and_merges_freed_space(arena: ipc.Arena) -> None:
    blocks = [arena.allocate(1000) for _ in range(8)]
    assert all(b is not None for b in blocks) and len(set(blocks)) == 8
    offsets = [b for b in blocks if b is not None]
    assert arena.allocate(1 << 16) is None  # no block that large is free
    for offset in offsets[::2] + offsets[1::2]:  # freed out of order, merged back into one
        arena.release(offset, 1000)
    assert arena.free_bytes() == arena.size
    assert arena.allocate(arena.size) == 0


@given(st.lists(st.binary(max_size=300), max_size=12))
@settings(max_examples=60, deadline=None)
def test_bytes_tensors_round_trip_exactly(items: list[bytes]) -> None:
    arena = ipc.Arena.create("bytes", 1 << 14)
    try:
        array = np.empty(len(items), dtype=object)
        array[:] = items
        fds: list[int] = []
        desc = ipc.write_tensor(arena, "T", array, fds)
        got = ipc.read_tensor(arena, desc, fds, copy=True)
        ipc.close_fds(fds)
        assert got.dtype == object and list(got) == items
    finally:
        arena.close()


def test_numeric_tensors_are_views_of_the_arena_unless_copied(arena: ipc.Arena) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    desc = ipc.write_tensor(arena, "X", x, [])
    assert desc[:3] == ("X", "FP32", (3, 4)) and desc[3][0] == "a"
    view = ipc.read_tensor(arena, desc, [], copy=False)
    copy = ipc.read_tensor(arena, desc, [], copy=True)
    np.testing.assert_array_equal(view, x)
    arena.view[desc[3][1] : desc[3][1] + 4] = np.float32(-1).tobytes()  # the writer's side changes
    assert view[0, 0] == -1 and copy[0, 0] == 0


def test_a_tensor_larger_than_the_free_space_gets_its_own_shared_memory(arena: ipc.Arena) -> None:
    big = np.arange(1 << 15, dtype=np.int64)  # 256 KiB, four times the arena
    fds: list[int] = []
    desc = ipc.write_tensor(arena, "BIG", big, fds)
    assert desc[3][0] == "f" and len(fds) == 1
    np.testing.assert_array_equal(ipc.read_tensor(arena, desc, fds, copy=True), big)
    ipc.close_fds(fds)
    assert arena.free_bytes() == arena.size


def test_the_channel_carries_messages_and_file_descriptors(arena: ipc.Arena) -> None:
    ours, theirs_socket = ipc.Channel.pair()
    theirs = ipc.Channel(theirs_socket)
    fds: list[int] = []
    desc = ipc.write_tensor(arena, "BIG", np.ones(1 << 15), fds)
    ours.send({"op": "execute", "inputs": [desc]}, fds)
    ipc.close_fds(fds)
    message, received = theirs.recv()
    assert message["op"] == "execute" and len(received) == 1
    np.testing.assert_array_equal(ipc.read_tensor(arena, message["inputs"][0], received, copy=True), np.ones(1 << 15))
    ipc.close_fds(received)
    ours.close()
    with pytest.raises(ipc.ChannelClosed):
        theirs.recv()
    theirs.close()


def test_the_outbox_sends_executes_held_in_one_loop_pass_as_one_message() -> None:
    server, child = ipc.Channel.pair()
    stub_end = ipc.Channel(child)
    lost: list[list[dict[str, Any]]] = []
    loop = asyncio.new_event_loop()
    try:
        outbox = ipc.Outbox(server, loop, lost.append)

        def one_pass() -> None:
            outbox.send({"op": "execute", "id": 1}, hold=True)
            outbox.send({"op": "execute", "id": 2}, hold=True)
            with pytest.raises(BlockingIOError):
                stub_end.recv(wait=False)  # nothing sent yet: held until the pass ends

        loop.call_soon(one_pass)
        loop.run_until_complete(asyncio.sleep(0))
        message, _ = stub_end.recv(wait=False)
        assert message == {"op": "execute_many", "executes": [{"op": "execute", "id": 1}, {"op": "execute", "id": 2}]}
        outbox.send({"op": "execute", "id": 3}, hold=True)
        outbox.send({"op": "free", "blocks": []})  # not held, and after what is
        assert [stub_end.recv(wait=False)[0]["op"] for _ in range(2)] == ["execute", "free"]
        stub_end.close()
        outbox.send({"op": "execute", "id": 4}, hold=True)
        outbox.flush()  # the stub is gone: its callers hear of it
        assert lost == [[{"op": "execute", "id": 4}]]
    finally:
        loop.close()
        server.close()


def test_auto_complete_config_follows_tritons_rules() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 8, "input": [], "output": []}))
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})  # the same again: no change
    assert config.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}]
    with pytest.raises(
        ValueError, match="configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT8"
    ):
        config.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [4]})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4], "shape": [4]})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        config.set_max_batch_size(4)
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        config.set_model_transaction_policy({"decoupled": False})


def test_utilities_convert_types_and_strings() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.numpy_to_triton_type(np.float32) == 11 and pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    tensor = pb_utils.Tensor("S", np.array([b"\x00a", b"bc"]))  # numpy itself drops trailing NULs of S
    assert tensor.as_numpy().dtype == object and list(tensor.as_numpy()) == [b"\x00a", b"bc"]
    serialized = pb_utils.serialize_byte_tensor(np.array([b"xy", b""], dtype=object))
    assert serialized is not None
    assert list(pb_utils.deserialize_bytes_tensor(serialized.tobytes())) == [b"xy", b""]
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code()) == ("nope", 2)
    with pytest.raises(pb_utils.TritonModelException, match="only usable inside a model"):
        pb_utils.InferenceRequest(model_name="m").exec()


def test_python_ints_in_a_bytes_output_travel_as_their_str() -> None:
    arena = ipc.Arena.create("test-as-text", 1 << 16)
    try:
        fds: list[int] = []
        desc = ipc.write_tensor(arena, "S", np.array([[1, "two", b"\xff", 4.5]], dtype=np.object_), fds)
        assert desc[1] == "BYTES" and desc[2] == (1, 4)
        assert ipc.read_tensor(arena, desc, fds, copy=True).tolist() == [[b"1", b"two", b"\xff", b"4.5"]]
    finally:
        arena.close()
