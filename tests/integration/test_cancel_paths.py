"""A client that goes away reaches `request.is_cancelled()` on the paths that carry a request some
other way than the front end's own call: a unary request a front-end worker (`--frontend-workers
2`) hands to the core, HTTP `generate` without streaming, a request a sequence batcher or the
response cache path queues from a task of its own, and an ensemble's steps (the running step is
cancelled and no later step starts).

The models here, given IN [1], write `<marker dir>/<model name>.started` when they start waiting and
`<marker dir>/<model name>` when they see the cancellation (within 10 s; else they answer); any
other IN is answered at once. `after`, an ensemble's second
step, writes `<marker dir>/after` whenever it runs. Real tritonserver 2.51 is asked the same
where it has the behaviour: a cancelled gRPC call reaches a sequence model's request there too
(its peers have no response cache library, and it does not tell a running ensemble step).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reference_server.server import running_server
from tests.integration.test_python_async_sender import Endpoints
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration]

_WATCH = """\
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MARKERS = {markers!r}


def mark(name, text):
    # Written whole, then renamed into place: the test reads a marker as soon as it exists.
    path = os.path.join(MARKERS, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if values[0] != 1:
                pass  # answered at once: only IN [1] waits for its cancellation
            elif self.name == "after":
                mark("after", "ran")
            else:
                mark(self.name + ".started", "started")
                for _ in range(1000):
                    if request.is_cancelled():
                        mark(self.name, "cancelled")
                        break
                    time.sleep(0.01)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values.copy())]))
        return responses
"""

_TENSORS = (
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
)

_CONFIGS = {
    "watch": "",
    "watch2": "",
    "after": "",
    "seq_watch": "sequence_batching { max_sequence_idle_microseconds: 60000000 }\n",
    "cache_watch": "response_cache { enable: true }\n",
}

_ENSEMBLE = (
    'name: "ens_watch"\nplatform: "ensemble"\nmax_batch_size: 0\n' + _TENSORS + "ensemble_scheduling { step [ "
    '{ model_name: "watch" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "mid" } }, '
    '{ model_name: "after" model_version: -1 input_map { key: "IN" value: "mid" } output_map { key: "OUT" value: "OUT" } } '
    "] }\n"
)


# Two steps side by side (not a chain: the request runs in a task of its own).
_FORK = (
    'name: "ens_fork"\nplatform: "ensemble"\nmax_batch_size: 0\n'
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    'output [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    "ensemble_scheduling { step [ "
    '{ model_name: "watch" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "A" } }, '
    '{ model_name: "watch2" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "B" } } '
    "] }\n"
)


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Path:
    root = tmp_path_factory.mktemp("cancel_paths") / "models"
    for name, extra in _CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_WATCH.format(markers=str(markers)))
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{_TENSORS}{extra}'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        )
    (root / "ens_watch" / "1").mkdir(parents=True)
    (root / "ens_watch" / "config.pbtxt").write_text(_ENSEMBLE)
    (root / "ens_fork" / "1").mkdir(parents=True)
    (root / "ens_fork" / "config.pbtxt").write_text(_FORK)
    return root


@pytest.fixture(scope="module")
def ours(repository: Path) -> Iterator[Endpoints]:
    with running_server(loopback_config(repository, response_cache_bytes=1 << 20)) as server:
        yield Endpoints("ours", server.http_url, f"127.0.0.1:{server.grpc_port}", server)


@pytest.fixture(scope="module")
def workers(repository: Path) -> Iterator[Endpoints]:
    config = loopback_config(repository, response_cache_bytes=1 << 20, frontend_workers=2)
    with running_server(config) as server:
        yield Endpoints("workers", server.http_url, f"127.0.0.1:{server.grpc_port}", server)


@pytest.fixture(scope="module")
def triton(peers: Path, repository: Path) -> Iterator[Endpoints]:
    # The peers have no cache library: not cached there.
    with running_triton(peers, repository, auto_complete=False) as server:
        yield Endpoints("triton", server.http_url, server.grpc_url)


def _server(request: pytest.FixtureRequest) -> Endpoints:
    endpoints: Endpoints = request.getfixturevalue(request.param)
    return endpoints


@pytest.fixture(params=["ours", "workers"])
def ours_and_workers(request: pytest.FixtureRequest) -> Endpoints:
    return _server(request)


@pytest.fixture(params=["ours", pytest.param("triton", marks=pytest.mark.peers)])
def server(request: pytest.FixtureRequest) -> Endpoints:
    return _server(request)


def _marker(markers: Path, name: str, missing: str, timeout_s: float) -> str:
    """The text of the marker `name` once a model has written it (whole: it is renamed into place),
    removed for the next one."""
    path = markers / name
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{missing} ({path} not written)"
        time.sleep(0.02)
    text = path.read_text()
    path.unlink()
    return text


def _seen(markers: Path, name: str, timeout_s: float = 5.0) -> str:
    return _marker(markers, name, f"{name} never saw the cancellation", timeout_s)


def _running(markers: Path, models: tuple[str, ...]) -> None:
    """Until each of `models` runs the request: then the client leaves (each waits 10 s for it)."""
    for model in models:
        _marker(markers, f"{model}.started", f"{model} never started on the request", 60.0)


def _cancel_grpc(
    server: Endpoints, markers: Path, model: str, values: list[int], running: tuple[str, ...], **options: Any
) -> None:
    """Start a unary gRPC call and reset it once the `running` models run it."""
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, np.int32))
        call = client.async_infer(model, [tensor], callback=lambda result, error: None, **options)
        _running(markers, running)
        call.cancel()
    finally:
        client.close()


def _close_http(server: Endpoints, markers: Path, path: str, body: dict[str, Any], running: tuple[str, ...]) -> None:
    """Send a request over HTTP and close the connection once the `running` models run it."""
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", path, json.dumps(body))
    _running(markers, running)
    connection.close()


def _serves_on(server: Endpoints, model: str = "watch") -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([5], np.int32))
        assert client.infer(model, [tensor], sequence_id=99 if model == "seq_watch" else 0,
                            sequence_start=model == "seq_watch", sequence_end=model == "seq_watch",
                            ).as_numpy("OUT").tolist() == [5]  # fmt: skip
    finally:
        client.close()


def test_a_worker_forwards_a_cancelled_grpc_call(workers: Endpoints, markers: Path) -> None:
    # Each call may land on either worker (SO_REUSEPORT): a few, each on a new connection.
    for _ in range(3):
        _cancel_grpc(workers, markers, "watch", [1], ("watch",))
        assert _seen(markers, "watch") == "cancelled"
    _serves_on(workers)


def test_a_worker_forwards_a_closed_http_connection(workers: Endpoints, markers: Path) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    for _ in range(3):
        _close_http(workers, markers, "/v2/models/watch/infer", body, ("watch",))
        assert _seen(markers, "watch") == "cancelled"
    _serves_on(workers)


def test_a_closed_connection_cancels_a_generate_request(ours_and_workers: Endpoints, markers: Path) -> None:
    _close_http(ours_and_workers, markers, "/v2/models/watch/generate", {"IN": [1]}, ("watch",))
    assert _seen(markers, "watch") == "cancelled"
    _serves_on(ours_and_workers)


def test_a_cancelled_call_reaches_a_sequence_model(server: Endpoints, markers: Path) -> None:
    _cancel_grpc(
        server, markers, "seq_watch", [1], ("seq_watch",), sequence_id=7, sequence_start=True, sequence_end=True
    )
    assert _seen(markers, "seq_watch") == "cancelled"
    _serves_on(server, "seq_watch")


def test_a_closed_connection_reaches_a_sequence_model(ours_and_workers: Endpoints, markers: Path) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"sequence_id": 8, "sequence_start": True, "sequence_end": True}}  # fmt: skip
    _close_http(ours_and_workers, markers, "/v2/models/seq_watch/infer", body, ("seq_watch",))
    assert _seen(markers, "seq_watch") == "cancelled"


def test_a_cancelled_call_reaches_a_cached_model(ours_and_workers: Endpoints, markers: Path) -> None:
    values = [1, time.monotonic_ns() % 1_000_000]  # not cached yet
    _cancel_grpc(ours_and_workers, markers, "cache_watch", values, ("cache_watch",))
    assert _seen(markers, "cache_watch") == "cancelled"


def test_a_cancelled_call_cancels_the_running_ensemble_step_and_no_later_one(
    ours_and_workers: Endpoints, markers: Path
) -> None:
    # Triton 2.51 does not tell the running step (server issue 6739: only the steps that start
    # after the cancellation see it), so this runs on ours only.
    _cancel_grpc(ours_and_workers, markers, "ens_watch", [1], ("watch",))
    assert _seen(markers, "watch") == "cancelled"
    # The second step would have run at once; it never does.
    _serves_on(ours_and_workers)
    assert not (markers / "after").exists()


def test_a_cancelled_call_cancels_the_running_steps_of_an_ensemble_graph(
    ours_and_workers: Endpoints, markers: Path
) -> None:
    _cancel_grpc(ours_and_workers, markers, "ens_fork", [1], ("watch", "watch2"))
    assert _seen(markers, "watch") == "cancelled"
    assert _seen(markers, "watch2") == "cancelled"
    _serves_on(ours_and_workers)
