"""CUDA shared memory on a real GPU: tritonclient's own `cuda_shared_memory` utilities with its HTTP
and gRPC clients against the reference server (register, infer with inputs and outputs in device
memory, read the outputs back, status, unregister, and the refusals), and `perfkit sweep
--shared-memory cuda` against the embedded default. CUDA opens no IPC handle in the process that
made it, so the server runs as a process of its own. Skipped, with the reason, where NVML sees no
GPU or cuda-python is missing."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from perfkit.target import ServerProcess, reference_server_process
from v2kit.runtime import cuda

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(cuda.unavailable_reason() is not None, reason=f"CUDA IPC: {cuda.unavailable_reason()}"),
]

X = np.arange(16, dtype=np.float32).reshape(1, 16)


def _http_client_module() -> Any:
    """tritonclient.http, or None where its gevent dependencies are not installed (the raw HTTP test
    below covers the route then)."""
    try:
        return importlib.import_module("tritonclient.http")
    except (ImportError, RuntimeError):  # tritonclient raises RuntimeError when its http extra is missing
        return None


httpclient = _http_client_module()


@pytest.fixture(scope="module")
def cudashm() -> Any:
    return pytest.importorskip("tritonclient.utils.cuda_shared_memory")


@pytest.fixture(scope="module")
def server(demo_repository: Path) -> Iterator[ServerProcess]:
    with reference_server_process(
        demo_repository, ["--model-control-mode", "explicit", "--load-model", "identity"]
    ) as s:
        yield s


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    if request.param == "http" and httpclient is None:
        pytest.skip("tritonclient.http needs geventhttpclient, not installed here")
    module: Any = httpclient if request.param == "http" else grpcclient
    made = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    yield module, made
    made.unregister_cuda_shared_memory()
    made.close()


@pytest.fixture
def regions(cudashm: Any) -> Iterator[Callable[[str, int], Any]]:
    made: list[Any] = []

    def create(name: str, byte_size: int) -> Any:
        made.append(cudashm.create_shared_memory_region(name, byte_size, 0))
        return made[-1]

    yield create
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


def _names(module: Any, status: Any) -> list[str]:
    return sorted(r["name"] for r in status) if module is httpclient else sorted(status.regions)


def _refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.message() or ""


def test_tritonclients_cuda_shared_memory_flow(client: tuple[Any, Any], cudashm: Any, regions: Any) -> None:
    module, c = client
    metadata = c.get_server_metadata()
    assert "cuda_shared_memory" in (metadata["extensions"] if module is httpclient else metadata.extensions)
    inputs, outputs = regions("in", X.nbytes), regions("out", X.nbytes)
    cudashm.set_shared_memory_region(inputs, [X])
    c.register_cuda_shared_memory("in", cudashm.get_raw_handle(inputs), 0, X.nbytes)
    c.register_cuda_shared_memory("out", cudashm.get_raw_handle(outputs), 0, X.nbytes)
    assert _names(module, c.get_cuda_shared_memory_status()) == ["in", "out"]
    status = c.get_cuda_shared_memory_status("out")
    (out_status,) = status if module is httpclient else status.regions.values()
    region = (
        out_status if module is httpclient else {"device_id": out_status.device_id, "byte_size": out_status.byte_size}
    )
    assert (region["device_id"], region["byte_size"]) == (0, X.nbytes)

    tensor = module.InferInput("INPUT0", list(X.shape), "FP32")
    tensor.set_shared_memory("in", X.nbytes)
    wanted = module.InferRequestedOutput("OUTPUT0")
    wanted.set_shared_memory("out", X.nbytes)
    result = c.infer("identity", [tensor], outputs=[wanted])
    # The output went to the region, not the response.
    if module is httpclient:
        assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32", "shape": list(X.shape)}
    else:
        assert list(result.get_response().raw_output_contents) == [b""]
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(outputs, np.float32, list(X.shape)), X)

    # Refusals: a registration past the allocation, an output region too small, an unknown region.
    message = _refusal(lambda: c.register_cuda_shared_memory("big", cudashm.get_raw_handle(inputs), 0, 1 << 30))
    assert "failed to register shared memory region 'big': invalid args" in message
    wanted.set_shared_memory("out", 16)
    message = _refusal(lambda: c.infer("identity", [tensor], outputs=[wanted]))
    assert f"should be at least {X.nbytes} bytes to hold the results" in message
    tensor.set_shared_memory("nowhere", X.nbytes)
    assert "Unable to find shared memory region: 'nowhere'" in _refusal(lambda: c.infer("identity", [tensor]))

    c.unregister_cuda_shared_memory("in")
    assert _names(module, c.get_cuda_shared_memory_status()) == ["out"]
    assert "Unable to find cuda shared memory region: 'in'" in _refusal(lambda: c.get_cuda_shared_memory_status("in"))
    c.unregister_cuda_shared_memory()
    assert _names(module, c.get_cuda_shared_memory_status()) == []


def _sweep(tmp_path: Path, *extra: str) -> pd.DataFrame:
    tmp_path.mkdir()
    out = tmp_path / "out.csv"
    result = subprocess.run(
        [sys.executable, "-m", "perfkit", "sweep", "--concurrency-range", "1:2", "-p", "500", "-s", "50",
         "--report-dir", str(tmp_path), "-f", str(out), "--quiet", *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode in (0, 3), result.stderr
    return pd.read_csv(tmp_path / "out_long.csv")


@pytest.mark.usefixtures("cudashm")
def test_a_sweep_with_cuda_shared_memory_runs_clean_at_the_same_order_of_throughput(tmp_path: Path) -> None:
    cuda_run = _sweep(tmp_path / "cuda", "--shared-memory", "cuda")
    plain = _sweep(tmp_path / "none")
    assert (cuda_run["error_count"] == 0).all(), cuda_run.to_string()
    assert (cuda_run["throughput_infer_per_s"] > 0).all()
    ratio = cuda_run["throughput_infer_per_s"].mean() / plain["throughput_infer_per_s"].mean()
    assert 0.2 < ratio < 5, f"CUDA shared memory {ratio:.2f}x the throughput without"


def _http(server: ServerProcess, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http_url}{path}", data, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    return status, json.loads(text) if text else None


def test_the_http_routes_with_a_region_tritonclient_made(server: ServerProcess, cudashm: Any, regions: Any) -> None:
    region = regions("raw", 2 * X.nbytes)
    cudashm.set_shared_memory_region(region, [X])
    handle = {"b64": cudashm.get_raw_handle(region).decode()}
    body = {"raw_handle": handle, "device_id": 0, "byte_size": 2 * X.nbytes}
    assert _http(server, "/v2/cudasharedmemory/region/raw/register", body) == (200, None)
    try:
        assert _http(server, "/v2/cudasharedmemory/region/raw/status") == (
            200, [{"name": "raw", "device_id": 0, "byte_size": 2 * X.nbytes}]
        )  # fmt: skip
        at = {"shared_memory_region": "raw", "shared_memory_byte_size": X.nbytes}
        infer: dict[str, Any] = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(X.shape), "parameters": at}],
            "outputs": [{"name": "OUTPUT0", "parameters": {**at, "shared_memory_offset": X.nbytes}}],
        }
        status, reply = _http(server, "/v2/models/identity/infer", infer)
        assert status == 200 and "data" not in reply["outputs"][0], reply
        both = cudashm.get_contents_as_numpy(region, np.float32, [2, *X.shape[1:]])
        np.testing.assert_array_equal(both, np.concatenate([X, X]))
        infer["inputs"][0]["parameters"] = {**at, "shared_memory_byte_size": 8}
        status, reply = _http(server, "/v2/models/identity/infer", infer)
        assert status == 400 and "input byte size mismatch for input 'INPUT0'" in reply["error"]
        status, reply = _http(server, "/v2/cudasharedmemory/region/raw2/register", {**body, "byte_size": 1 << 30})
        assert status == 400 and "invalid args" in reply["error"]
    finally:
        assert _http(server, "/v2/cudasharedmemory/region/raw/unregister", {}) == (200, None)
    assert _http(server, "/v2/cudasharedmemory/status") == (200, [])
