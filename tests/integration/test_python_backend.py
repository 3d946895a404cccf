"""Triton's python backend on the reference server, driven by NVIDIA's tritonclient (HTTP and gRPC):
model.py files importing triton_python_backend_utils, each instance in its own stub process."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.errors import ServerError
from reference_server.server import ReferenceServer
from tests.pymodels import write_python_models
from tests.servers import loopback_config
from tests.waiting import eventually

pytestmark = pytest.mark.integration

EXECUTE_TIMEOUT_S = 2


class Served:
    """A server on its own loop thread, whose loop the tests may use (Scheduler.infer_stream)."""

    def __init__(self, server: ReferenceServer, loop: asyncio.AbstractEventLoop, repository: Path) -> None:
        self.server = server
        self.loop = loop
        self.repository = repository

    def run(self, coroutine: Any, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)


@pytest.fixture(scope="module")
def served(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repository = tmp_path_factory.mktemp("python_backend") / "models"
    repository.mkdir()
    for name in ("identity", "python_linear"):
        shutil.copytree(demo_repository / name, repository / name)
    write_python_models(repository)
    config = loopback_config(repository, backend_config={"execute-timeout-seconds": str(EXECUTE_TIMEOUT_S)})
    server = ReferenceServer(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(120)
        yield Served(server, loop, repository)
    finally:
        try:
            asyncio.run_coroutine_threadsafe(server.stop(grace_s=5.0), loop).result(60)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


@pytest.fixture(scope="module")
def http(served: Served) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(served.server.http_url, concurrency=8)


@pytest.fixture(scope="module")
def grpc(served: Served) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"{served.server.config.host}:{served.server.grpc_port}")


def http_input(x: np.ndarray, datatype: str = "FP32", name: str = "INPUT0") -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


def grpc_input(x: np.ndarray, datatype: str = "FP32", name: str = "INPUT0") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def fp32(*values: float) -> np.ndarray:
    return np.array([values], dtype=np.float32)


def execution_count(http: httpclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = http.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


# --- serving ------------------------------------------------------------------------------------


def test_fp32_identity_over_http_and_grpc(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(http.infer("py_identity", [http_input(x)]).as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(grpc.infer("py_identity", [grpc_input(x)]).as_numpy("OUTPUT0"), x)
    metadata = http.get_model_metadata("py_identity")
    assert metadata["platform"] == "python"  # as Triton reports it
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]


def test_each_instance_runs_in_its_own_process(http: httpclient.InferenceServerClient) -> None:
    pids = {int(http.infer("py_identity", [http_input(fp32(1.0))]).as_numpy("PID")[0, 0]) for _ in range(4)}
    assert len(pids) == 2 and os.getpid() not in pids  # instance_group count: 2


def test_bytes_round_trip_exactly(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    items = [b"he\x00llo", b"\xff\xfe\x80 not utf-8", b"", "ünï".encode(), b"\x00" * 1000]
    x = np.empty((1, len(items)), dtype=object)
    x[0, :] = items
    for got in (
        http.infer("py_bytes", [http_input(x, "BYTES")]).as_numpy("OUTPUT0"),
        grpc.infer("py_bytes", [grpc_input(x, "BYTES")]).as_numpy("OUTPUT0"),
    ):
        assert got.dtype == object and got.shape == (1, len(items))
        assert list(got[0]) == items


def test_weights_model_matches_numpy(served: Served, grpc: grpcclient.InferenceServerClient) -> None:
    folder = served.repository / "python_linear" / "1"
    weights, bias = np.load(folder / "weights.npy"), np.load(folder / "bias.npy")
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    got = grpc.infer("python_linear", [grpc_input(x)]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, np.maximum(x @ weights + bias, 0), rtol=1e-5, atol=1e-6)


def test_dynamic_batching_hands_execute_several_requests(http: httpclient.InferenceServerClient) -> None:
    before = execution_count(http, "py_batch")
    calls = []
    for index in range(4):
        tensor = http_input(fp32(index, index))
        calls.append(
            http.async_infer("py_batch", [tensor], request_id=f"req-{index}", parameters={"tag": index, "note": "x"})
        )
    results = [call.get_result(timeout=30) for call in calls]
    for index, result in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), fp32(index, index))
        assert result.as_numpy("COUNT").tolist() == [[4]]  # one execute, four requests
        assert result.as_numpy("ID")[0, 0] == f"req-{index}".encode()
        assert result.as_numpy("PARAMS")[0, 0] == b'{"tag":%d,"note":"x"}' % index  # as Triton writes it
    after = execution_count(http, "py_batch")
    assert (after[0] - before[0], after[1] - before[1]) == (4, 1)


def test_a_model_may_answer_through_the_response_sender(http: httpclient.InferenceServerClient) -> None:
    # Not decoupled: one response per request through its sender, and execute returns None.
    np.testing.assert_array_equal(http.infer("py_sender", [http_input(fp32(1.0, 2.0))]).as_numpy("OUTPUT0"), fp32(2, 3))


def test_auto_complete_config_completes_the_model(http: httpclient.InferenceServerClient) -> None:
    config = http.get_model_config("py_auto")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("INPUT0", "TYPE_INT32", [2])]
    x = np.array([[1, 2], [3, 4]], dtype=np.int32)
    np.testing.assert_array_equal(http.infer("py_auto", [http_input(x, "INT32")]).as_numpy("OUTPUT0"), x * 2)


def test_bls_calls_onnx_and_python_models_counted_in_their_statistics(
    http: httpclient.InferenceServerClient,
) -> None:
    before = {model: execution_count(http, model) for model in ("identity", "py_identity")}
    x = fp32(1.5, -2.0, 3.25)
    result = http.infer("py_bls", [http_input(x)])
    np.testing.assert_array_equal(result.as_numpy("OUT_ONNX"), x)
    np.testing.assert_array_equal(result.as_numpy("OUT_PY"), x)
    assert b"no_such_model" in result.as_numpy("ERROR")[0, 0]
    for model, (inferences, executions) in before.items():
        assert execution_count(http, model) == (inferences + 1, executions + 1), model


def test_bls_streams_a_decoupled_model(http: httpclient.InferenceServerClient) -> None:
    result = http.infer("py_bls_stream", [http_input(np.array([3], dtype=np.int32), "INT32", "N")])
    assert result.as_numpy("VALUES").tolist() == [0, 1, 2, -1]


def test_statistics_time_the_python_model(http: httpclient.InferenceServerClient) -> None:
    http.infer("py_identity", [http_input(fp32(1.0))])
    stats = http.get_inference_statistics("py_identity")["model_stats"][0]
    inference = stats["inference_stats"]
    assert inference["success"]["count"] >= 1
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert inference[part]["ns"] > 0, part
    # The stub's execute is most of the time the model takes.
    assert inference["compute_infer"]["ns"] < inference["success"]["ns"]


# --- decoupled, at the scheduler ------------------------------------------------------------------


def stream(served: Served, n: int, **parameters: Any) -> list[tuple[Any, bool]]:
    scheduler = served.server.repository.get("py_decoupled").scheduler  # type: ignore[union-attr]

    async def collect() -> list[tuple[Any, bool]]:
        inputs = {"N": np.array([n], dtype=np.int32)}
        items = []
        async for outputs, final in scheduler.infer_stream(inputs, ["OUT"], parameters=parameters):
            items.append((None if outputs is None else int(outputs["OUT"][0]), final))
        return items

    result: list[tuple[Any, bool]] = served.run(collect())
    return result


@pytest.mark.parametrize(
    ("n", "parameters", "expected"),
    [
        (0, {}, [(None, True)]),
        (1, {}, [(0, True)]),
        (3, {}, [(0, False), (1, False), (2, True)]),
        (2, {"final_alone": True}, [(0, False), (1, False), (None, True)]),
    ],
)
def test_decoupled_streams_zero_one_or_many_responses(
    served: Served, n: int, parameters: dict[str, Any], expected: list[tuple[Any, bool]]
) -> None:
    assert stream(served, n, **parameters) == expected


def test_decoupled_responses_sent_after_execute_returned(served: Served) -> None:
    scheduler = served.server.repository.get("py_decoupled").scheduler  # type: ignore[union-attr]
    stats = served.server.repository.get("py_decoupled").stats  # type: ignore[union-attr]

    async def held_then_released() -> tuple[list[Any], int, list[Any]]:
        executions = stats.execution_count
        held: list[Any] = []

        async def first() -> None:
            inputs = {"N": np.array([2], dtype=np.int32)}
            async for outputs, final in scheduler.infer_stream(inputs, ["OUT"], parameters={"hold": True}):
                held.append((None if outputs is None else int(outputs["OUT"][0]), final))

        task = asyncio.ensure_future(first())
        await eventually(lambda: stats.execution_count > executions)  # the holding request's execute returned
        seen_before_release = list(held)
        released = []
        async for outputs, final in scheduler.infer_stream(
            {"N": np.array([1], dtype=np.int32)}, ["OUT"], parameters={"release": True}
        ):
            released.append((None if outputs is None else int(outputs["OUT"][0]), final))
        await asyncio.wait_for(task, 10)
        return seen_before_release, len(held), held + released

    before, _, everything = served.run(held_then_released())
    assert before == []
    assert everything == [(0, False), (1, False), (None, True), (0, True)]


def test_unary_infer_on_a_decoupled_model_is_refused(served: Served, http: httpclient.InferenceServerClient) -> None:
    scheduler = served.server.repository.get("py_decoupled").scheduler  # type: ignore[union-attr]
    with pytest.raises(ServerError, match="decoupled transaction policy"):
        served.run(scheduler.infer({"N": np.array([1], dtype=np.int32)}, ["OUT"]), 10)


def test_a_non_decoupled_model_streams_one_final_response(served: Served) -> None:
    scheduler = served.server.repository.get("py_identity").scheduler  # type: ignore[union-attr]

    async def collect() -> list[tuple[Any, bool]]:
        return [item async for item in scheduler.infer_stream({"INPUT0": fp32(4.0)}, ["OUTPUT0"])]

    ((outputs, final),) = served.run(collect())
    assert final is True and outputs["OUTPUT0"].tolist() == [[4.0]]


# --- failures -------------------------------------------------------------------------------------


def test_bad_model_files_leave_the_model_unavailable_with_the_reason(
    http: httpclient.InferenceServerClient,
) -> None:
    index = {entry["name"]: entry for entry in http.get_model_repository_index()}
    assert index["py_syntax"]["state"] == "UNAVAILABLE"
    reason = index["py_syntax"]["reason"]
    assert reason == "Internal: SyntaxError: invalid syntax (model.py, line 2)"  # Triton's words
    assert index["py_init_raises"]["state"] == "UNAVAILABLE"
    reason = index["py_init_raises"]["reason"]
    assert reason.startswith("Internal: ValueError: no weights in this folder\n\nAt:\n")
    assert "py_init_raises/1/model.py(3): initialize" in reason
    with pytest.raises(InferenceServerException) as refused:
        http.infer("py_syntax", [http_input(fp32(1.0))])
    assert refused.value.status() == "404"  # Triton's status and words for a model whose load failed
    assert refused.value.message() == "Request for unknown model: 'py_syntax' has no available versions"
    assert http.is_model_ready("py_identity")


def test_execute_raising_fails_those_requests_and_the_instance_keeps_serving(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as failed:
        http.infer("py_raises", [http_input(fp32(-1.0))])
    assert failed.value.status() == "500"
    message = failed.value.message()
    # Triton's words, frames included.
    assert message.startswith("Failed to process the request(s) for model 'py_raises_0_0', message: ")
    assert "RuntimeError: negative input\n\nAt:\n" in message and "model.py(" in message
    with pytest.raises(InferenceServerException) as failed:
        grpc.infer("py_raises", [grpc_input(fp32(-1.0))])
    assert failed.value.status() == "StatusCode.INTERNAL"
    first = http.infer("py_raises", [http_input(fp32(1.0))]).as_numpy("PID")
    second = http.infer("py_raises", [http_input(fp32(2.0))]).as_numpy("PID")
    assert first.tolist() == second.tolist()  # the same stub


def test_an_error_response_fails_that_request_with_its_code(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as failed:
        http.infer("py_error", [http_input(fp32(-1.0))])
    assert (failed.value.status(), failed.value.message()) == ("400", "the input must not be negative")
    with pytest.raises(InferenceServerException) as failed:
        grpc.infer("py_error", [grpc_input(fp32(-1.0))])
    assert failed.value.status() == "StatusCode.INVALID_ARGUMENT"
    np.testing.assert_array_equal(http.infer("py_error", [http_input(fp32(5.0))]).as_numpy("OUTPUT0"), fp32(5.0))


def test_a_stub_that_exits_or_is_killed_is_restarted(http: httpclient.InferenceServerClient) -> None:
    pid = int(http.infer("py_exit", [http_input(fp32(1.0))]).as_numpy("PID")[0, 0])
    with pytest.raises(InferenceServerException) as failed:
        http.infer("py_exit", [http_input(fp32(13.0))])
    assert failed.value.status() == "500"
    assert "Stub process 'py_exit_0_0' is not healthy." in failed.value.message()
    restarted = int(http.infer("py_exit", [http_input(fp32(2.0))]).as_numpy("PID")[0, 0])
    assert restarted != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not left a zombie
    os.kill(restarted, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:  # the kill lands asynchronously: a request may still reach the dying stub
        try:
            again = int(http.infer("py_exit", [http_input(fp32(3.0))]).as_numpy("PID")[0, 0])
        except InferenceServerException as error:
            assert "is not healthy" in error.message()
            assert time.monotonic() < deadline
            continue
        if again != restarted:
            break
        assert time.monotonic() < deadline
    assert http.is_model_ready("py_identity")


def test_a_hung_execute_fails_after_the_timeout_and_the_stub_restarts(
    http: httpclient.InferenceServerClient,
) -> None:
    pid = int(http.infer("py_hang", [http_input(fp32(1.0))]).as_numpy("PID")[0, 0])
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as failed:
        http.infer("py_hang", [http_input(fp32(7.0))])
    waited = time.monotonic() - started
    assert EXECUTE_TIMEOUT_S <= waited < EXECUTE_TIMEOUT_S + 20
    assert failed.value.status() == "500"
    assert f"did not return within {EXECUTE_TIMEOUT_S} s" in failed.value.message()
    assert "execute-timeout-seconds" in failed.value.message()
    # Meanwhile other models served; now the model itself does again, from a new stub.
    assert int(http.infer("py_hang", [http_input(fp32(1.0))]).as_numpy("PID")[0, 0]) != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_other_models_serve_while_one_hangs(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(grpc.infer, "py_hang", [grpc_input(fp32(7.0))])
        x = fp32(9.0)
        np.testing.assert_array_equal(http.infer("py_identity", [http_input(x)]).as_numpy("OUTPUT0"), x)
        assert not hung.done()
        with pytest.raises(InferenceServerException):
            hung.result(timeout=EXECUTE_TIMEOUT_S + 20)


def test_unload_calls_finalize_and_the_stub_exits(served: Served, http: httpclient.InferenceServerClient) -> None:
    pid = int(http.infer("py_finalize", [http_input(fp32(1.0))]).as_numpy("PID")[0, 0])
    repository = served.server.repository
    assert repository is not None
    served.run(repository.unload("py_finalize"))
    marker = served.repository / "py_finalize" / "finalized"
    deadline = time.monotonic() + 30
    while not marker.exists() or _alive(pid):
        assert time.monotonic() < deadline, "finalize was not called or the stub did not exit"
        time.sleep(0.01)
    assert marker.read_text() == "finalized"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
