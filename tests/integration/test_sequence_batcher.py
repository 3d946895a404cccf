"""The sequence batcher end to end, driven by NVIDIA's tritonclient over HTTP, gRPC and a gRPC stream:
control inputs the server fills in (never the client), uint64 and string sequence ids, sequences
interleaved and concurrent, the direct and oldest strategies, the idle reaper freeing a slot for a
backlogged sequence, implicit state in an ONNX model, and Triton's errors for hostile sequences."""

from __future__ import annotations

import asyncio
import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer, running_server
from tests.sequence_models import (
    CORRELATION,
    expected_totals,
    write_accumulator,
    write_decoupled_accumulator,
    write_state_accumulator,
)
from tests.servers import loopback_config

pytestmark = pytest.mark.integration

#: The one-slot model's idle limit: long enough that a test's back-to-back requests never reach it,
#: even on a loaded machine.
IDLE_US = 1_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    repository = tmp_path_factory.mktemp("sequence") / "models"
    write_accumulator(repository, "accumulator")
    write_accumulator(repository, "accumulator_str", corrid="TYPE_STRING")
    write_accumulator(repository, "accumulator_one", max_batch_size=1, idle_us=IDLE_US)
    write_accumulator(
        repository,
        "accumulator_oldest",
        strategy="oldest { max_candidate_sequences: 8 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000 }",
    )
    write_state_accumulator(repository)
    write_decoupled_accumulator(repository)
    folder = write_accumulator(repository, "correlation", corrid="TYPE_STRING")
    (folder / "1" / "model.py").write_text(CORRELATION)
    config = (folder / "config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(
        config.replace('"CONTROLS" data_type: TYPE_INT32 dims: [ 3 ]', '"SEEN" data_type: TYPE_STRING dims: [ 1 ]')
    )
    with running_server(loopback_config(repository)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: ReferenceServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: ReferenceServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()


def _step(
    client: Any, module: Any, model: str, value: int, sequence_id: int | str, start: bool = False, end: bool = False
) -> tuple[int, list[int]]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0]), result.as_numpy("CONTROLS")[0].tolist()


def _run(client: Any, module: Any, model: str, values: list[int], sequence_id: int | str) -> list[int]:
    last = len(values) - 1
    return [_step(client, module, model, v, sequence_id, start=i == 0, end=i == last)[0] for i, v in enumerate(values)]


def test_control_inputs_are_the_servers_not_the_clients(http: httpclient.InferenceServerClient) -> None:
    metadata = http.get_model_metadata("accumulator")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
    config = http.get_model_config("accumulator")
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 5_000_000
    assert "sequence" in http.get_server_metadata()["extensions"]
    # START, END, READY as the model sees them: [start, end, ready] per request.
    assert _step(http, httpclient, "accumulator", 3, 11, start=True) == (3, [1, 0, 1])
    assert _step(http, httpclient, "accumulator", 4, 11) == (7, [0, 0, 1])
    assert _step(http, httpclient, "accumulator", 5, 11, end=True) == (12, [0, 1, 1])
    assert _step(http, httpclient, "accumulator", 9, 12, start=True, end=True) == (9, [1, 1, 1])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_interleaved_sequences_keep_their_own_totals(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, transport: str
) -> None:
    client, module = (http, httpclient) if transport == "http" else (grpc, grpcclient)
    # A sequence id beyond int64 over HTTP (JSON carries uint64); tritonclient.grpc sends int64_param.
    big = 2**64 - 5 if transport == "http" else 2**63 - 5
    got: dict[int, list[int]] = {21: [], big: []}
    for i, (a, b) in enumerate([(1, 10), (2, 20), (3, 30)]):
        got[21].append(_step(client, module, "accumulator", a, 21, start=i == 0, end=i == 2)[0])
        got[big].append(_step(client, module, "accumulator", b, big, start=i == 0, end=i == 2)[0])
    assert got == {21: [1, 3, 6], big: [10, 30, 60]}


def test_string_sequence_ids_reach_a_string_corrid(grpc: grpcclient.InferenceServerClient) -> None:
    assert _run(grpc, grpcclient, "accumulator_str", [5, 6, 7], "session-a") == [5, 11, 18]
    assert _run(grpc, grpcclient, "accumulator_str", [1, 1], "session-b") == [1, 2]


@pytest.mark.parametrize("model", ["accumulator", "accumulator_oldest"])
def test_concurrent_sequences_batch_and_keep_their_totals(server: ReferenceServer, model: str) -> None:
    # Eight sequences at once, batched across sequences on one instance. A client keeps a sequence's
    # own requests in order: it sends the next once the last is answered.
    sequences = {100 + k: [k + 1] * 5 for k in range(8)}

    async def run() -> tuple[dict[int, list[int]], dict[str, Any]]:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        got: dict[int, list[int]] = {k: [] for k in sequences}
        for step in range(5):
            calls = []
            for sequence_id, values in sequences.items():
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[values[step]]], dtype=np.int32))
                calls.append(client.infer(
                    model, [tensor], sequence_id=sequence_id, sequence_start=step == 0, sequence_end=step == 4
                ))  # fmt: skip
            for sequence_id, result in zip(sequences, await asyncio.gather(*calls)):
                got[sequence_id].append(int(result.as_numpy("OUTPUT")[0, 0]))
        stats = await client.get_inference_statistics(model, as_json=True)
        await client.close()
        return got, stats

    got, stats = asyncio.run(run())
    assert got == {k: expected_totals(v) for k, v in sequences.items()}
    assert max(int(b["batch_size"]) for b in stats["model_stats"][0]["batch_stats"]) > 1


def test_a_grpc_stream_carries_a_sequence(server: ReferenceServer) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, value in enumerate([4, 5, 6, 7]):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            client.async_stream_infer(
                "accumulator", [tensor], sequence_id=31, sequence_start=i == 0, sequence_end=i == 3
            )
        got = [int(answers.get(timeout=30).as_numpy("OUTPUT")[0, 0]) for _ in range(4)]
    finally:
        client.stop_stream()
        client.close()
    assert got == [4, 9, 15, 22]


def test_a_decoupled_sequence_model_streams_its_responses_in_order(server: ReferenceServer) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for sequence_id, scale in ((71, 1), (72, 100)):
            for i, value in enumerate([1, 2, 3]):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[value * scale]], dtype=np.int32))
                client.async_stream_infer(
                    "decoupled_accumulator", [tensor], sequence_id=sequence_id, sequence_start=i == 0,
                    sequence_end=i == 2,
                )  # fmt: skip
        got = [int(answers.get(timeout=30).as_numpy("OUTPUT")[0, 0]) for _ in range(12)]
    finally:
        client.stop_stream()
        client.close()
    # Each sequence's responses come in its own order (the two sequences may interleave).
    assert [g for g in got if g < 100] == [1, 10, 3, 30, 6, 60]
    assert [g for g in got if g >= 100] == [100, 1000, 300, 3000, 600, 6000]


def test_implicit_state_carries_an_onnx_models_total(grpc: grpcclient.InferenceServerClient) -> None:
    assert [i["name"] for i in grpc.get_model_metadata("onnx_state", as_json=True)["inputs"]] == ["INPUT"]

    def step(sequence_id: int, value: float, start: bool = False) -> list[float]:
        tensor = grpcclient.InferInput("INPUT", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[value, -value]], dtype=np.float32))
        result = grpc.infer("onnx_state", [tensor], sequence_id=sequence_id, sequence_start=start)
        assert result.as_numpy("OUTPUT_STATE") is None  # the state stays the server's
        return result.as_numpy("OUTPUT")[0].tolist()

    assert step(41, 1.0, start=True) == [1.0, -1.0]
    assert step(42, 10.0, start=True) == [10.0, -10.0]
    assert step(41, 2.0) == [3.0, -3.0]
    assert step(42, 5.0) == [15.0, -15.0]
    assert step(41, 4.0, start=True) == [4.0, -4.0]  # a START again restarts the state


def test_an_idle_sequence_is_released_for_the_backlog(http: httpclient.InferenceServerClient) -> None:
    # accumulator_one holds one sequence. The second START waits in the backlog until the first,
    # abandoned, goes idle past max_sequence_idle_microseconds; then the first is gone.
    assert _step(http, httpclient, "accumulator_one", 1, 51, start=True)[0] == 1
    started = time.monotonic()
    assert _step(http, httpclient, "accumulator_one", 2, 52, start=True, end=True)[0] == 2
    assert time.monotonic() - started >= IDLE_US / 1e6 * 0.9
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(http, httpclient, "accumulator_one", 3, 51)


def test_a_backlogged_sequence_runs_when_a_slot_ends(http: httpclient.InferenceServerClient) -> None:
    assert _step(http, httpclient, "accumulator_one", 1, 61, start=True)[0] == 1
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[7]], dtype=np.int32))
    second = http.async_infer("accumulator_one", [tensor], sequence_id=62, sequence_start=True, sequence_end=True)
    assert _step(http, httpclient, "accumulator_one", 2, 61, end=True)[0] == 3
    assert int(second.get_result().as_numpy("OUTPUT")[0, 0]) == 7


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_hostile_sequences_get_tritons_errors(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, transport: str
) -> None:
    client, module = (http, httpclient) if transport == "http" else (grpc, grpcclient)
    never = "inference request for sequence 777 to model 'accumulator' must specify the START flag on the first " \
            "request of the sequence"  # fmt: skip
    with pytest.raises(InferenceServerException, match=never) as info:
        _step(client, module, "accumulator", 1, 777)
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(client, module, "accumulator", 1, 778, end=True)  # END without START
    _run(client, module, "accumulator", [1, 2], 779)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(client, module, "accumulator", 1, 779)  # after its END
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        _step(client, module, "accumulator", 1, 0, start=True)
    tensor = module.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of sequence"):
        client.infer("accumulator", [tensor], sequence_id=780, sequence_start=True)
    # A START on a live sequence restarts it (Triton logs the conflict and goes on).
    assert _step(client, module, "accumulator", 5, 781, start=True)[0] == 5
    assert _step(client, module, "accumulator", 6, 781, start=True)[0] == 6
    assert _step(client, module, "accumulator", 1, 781, end=True)[0] == 7


def test_a_string_id_for_a_numeric_corrid_is_refused(http: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="CORRID control 'CORRID' is UINT64"):
        _step(http, httpclient, "accumulator", 1, "text-id", start=True, end=True)


def test_a_python_model_reads_correlation_id_and_flags(grpc: grpcclient.InferenceServerClient) -> None:
    def seen(sequence_id: int | str, start: bool, end: bool) -> list[Any]:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        result = grpc.infer(
            "correlation", [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end,
            parameters={"custom": "x"},
        )  # fmt: skip
        return json.loads(result.as_numpy("SEEN")[0, 0])

    assert seen("s-1", True, False) == ["s-1", 1, {"custom": "x"}]
    assert seen("s-1", False, False) == ["s-1", 0, {"custom": "x"}]
    assert seen("s-1", False, True) == ["s-1", 2, {"custom": "x"}]
    assert seen(2**63 - 1, True, True) == [2**63 - 1, 3, {"custom": "x"}]
