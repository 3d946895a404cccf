"""NVIDIA's real tritonserver serves perfkit.testing's python-backend models: the demo MLP gives the
same outputs as onnxruntime on the ONNX file and its dynamic batcher forms batches; the sleeper
and the staller take the time they promise; and `triton_server` never leaves a process behind."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest
import tritonclient.http as httpclient

from perfkit.testing import (
    TritonProcess,
    TritonStartError,
    read_ort_times,
    triton_server,
    write_onnx_wrapper,
    write_sleeper,
    write_staller,
)
from perfkit.testing import triton as triton_module
from tests.servers import running_triton
from v2kit.demo import build_demo_repository

pytestmark = [pytest.mark.integration, pytest.mark.peers]

SLEEPER_MS = 20.0
STALLER_MS = 5.0
STALL_MS = 300.0
STALL_EVERY_S = 1.0
# The sleepers' configs are complete: their starts skip the python backend's auto-complete stub (tests/servers.py).
NO_AUTO_COMPLETE = ["--disable-auto-complete-config"]


@pytest.fixture(scope="module")
def onnx_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_repository(tmp_path_factory.mktemp("demo") / "models") / "mlp" / "1" / "model.onnx"


@pytest.fixture(scope="module")
def ort_times(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ort_times")


@pytest.fixture(scope="module")
def triton(
    peers: Path, onnx_mlp: Path, ort_times: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonProcess]:
    """One tritonserver per module serving the MLP wrapper (plain and timed), the sleeper and the staller."""
    repo = tmp_path_factory.mktemp("triton") / "models"
    # A 5 ms queue delay: concurrent requests reliably share a batch even on a slow machine.
    write_onnx_wrapper(repo, "mlp", onnx_mlp, max_batch_size=64, dynamic_batching=True, max_queue_delay_us=5000)
    write_onnx_wrapper(repo, "mlp_timed", onnx_mlp, max_batch_size=64, allow_spinning=False, ort_time_dir=ort_times)
    write_sleeper(repo, "sleeper", service_ms=SLEEPER_MS)
    write_staller(repo, "staller", service_ms=STALLER_MS, stall_ms=STALL_MS, stall_every_s=STALL_EVERY_S)
    with running_triton(peers, repo, auto_complete=False) as server:
        yield server


def infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    return out


def model_stats(client: httpclient.InferenceServerClient, model: str) -> dict:  # type: ignore[type-arg]
    return client.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]


def processes_mentioning(path: Path) -> list[psutil.Process]:
    """Live processes whose command line names `path`: tritonserver (the repository) and its stubs (model.py)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(str(path) in arg for arg in cmdline):
            found.append(proc)
    return found


@pytest.mark.parametrize("batch", [1, 4])
def test_mlp_matches_onnxruntime(triton: TritonProcess, onnx_mlp: Path, batch: int) -> None:
    data = np.random.default_rng(batch).standard_normal((batch, 256), dtype=np.float32)
    client = httpclient.InferenceServerClient(triton.http_url)
    got = infer(client, "mlp", data)
    client.close()
    (expected,) = ort.InferenceSession(str(onnx_mlp), providers=["CPUExecutionProvider"]).run(
        ["OUTPUT0"], {"INPUT0": data}
    )
    assert got.shape == (batch, 10)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_mlp_dynamic_batching_forms_batches(triton: TritonProcess, onnx_mlp: Path) -> None:
    session = ort.InferenceSession(str(onnx_mlp), providers=["CPUExecutionProvider"])
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            # One client per thread: tritonclient.http's client is not shared across threads.
            client = httpclient.InferenceServerClient(triton.http_url)
            rng = np.random.default_rng(100 + seed)
            start.wait(timeout=30)
            for _ in range(5):
                data = rng.standard_normal((1, 256), dtype=np.float32)
                (expected,) = session.run(["OUTPUT0"], {"INPUT0": data})
                np.testing.assert_allclose(infer(client, "mlp", data), expected, atol=1e-5, rtol=0)
            client.close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    with httpclient.InferenceServerClient(triton.http_url) as client:
        stats = model_stats(client, "mlp")
    sizes = [int(b["batch_size"]) for b in stats["batch_stats"]]
    assert max(sizes) > 1, sizes


def test_wrapper_publishes_its_session_run_time(triton: TritonProcess, onnx_mlp: Path, ort_times: Path) -> None:
    data = np.ones((2, 256), dtype=np.float32)
    with httpclient.InferenceServerClient(triton.http_url) as client:
        for _ in range(3):
            infer(client, "mlp_timed", data)
        stats = model_stats(client, "mlp_timed")["inference_stats"]
    requests, run_ns_per_request, executions, run_ns = read_ort_times(ort_times, "mlp_timed")
    assert (requests, executions) == (3, 3)
    assert run_ns_per_request == run_ns > 0  # one request per execution without dynamic batching
    # The run is part of what Triton's python backend books as compute_infer (the whole execute).
    assert run_ns <= int(stats["compute_infer"]["ns"])


def test_sleeper_takes_its_service_time(triton: TritonProcess) -> None:
    client = httpclient.InferenceServerClient(triton.http_url)
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    before = model_stats(client, "sleeper")["inference_stats"]["compute_infer"]
    latencies_ms = []
    for _ in range(20):
        t0 = time.perf_counter()
        out = infer(client, "sleeper", data)
        latencies_ms.append((time.perf_counter() - t0) * 1000)
        np.testing.assert_array_equal(out, data)
    # Triton books a request's statistics when its backend releases it, which may be just after the
    # client has the response: read until the last one is in (bounded).
    deadline = time.monotonic() + 10.0
    while True:
        after = model_stats(client, "sleeper")["inference_stats"]["compute_infer"]
        if int(after["count"]) - int(before["count"]) >= 20 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    client.close()
    count = int(after["count"]) - int(before["count"])
    compute_ms = (int(after["ns"]) - int(before["ns"])) / count / 1e6
    assert count == 20
    assert compute_ms >= 0.9 * SLEEPER_MS, compute_ms
    assert min(latencies_ms) >= SLEEPER_MS, latencies_ms
    # Wide: this is about the sleep being there, not about Triton's overhead on a busy machine.
    assert statistics.median(latencies_ms) < SLEEPER_MS + 200, latencies_ms


def test_staller_stalls_periodically(triton: TritonProcess) -> None:
    client = httpclient.InferenceServerClient(triton.http_url)
    data = np.zeros((1, 4), dtype=np.float32)
    latencies_ms = []
    t_start = time.monotonic()
    # Two periods: stalls are aligned to the wall clock, so at least one whole stall falls in them.
    while time.monotonic() - t_start < 2.0 * STALL_EVERY_S:
        t0 = time.perf_counter()
        infer(client, "staller", data)
        latencies_ms.append((time.perf_counter() - t0) * 1000)
    elapsed_s = time.monotonic() - t_start
    client.close()
    stalls = [ms for ms in latencies_ms if ms >= 0.8 * STALL_MS]
    assert len(stalls) >= 1, max(latencies_ms)
    # At most one stall per started period (one instance).
    assert len(stalls) <= elapsed_s / STALL_EVERY_S + 1, stalls
    assert statistics.median(latencies_ms) < 0.25 * STALL_MS, statistics.median(latencies_ms)
    assert min(latencies_ms) >= STALLER_MS


def test_no_process_left_when_body_raises(peers: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_sleeper(repo, "sleeper", service_ms=1, instances=2)
    with (
        pytest.raises(RuntimeError, match="body failed"),
        triton_server(peers, repo, extra_args=NO_AUTO_COMPLETE, exit_timeout_s=2) as server,
    ):
        pid = server.process.pid
        stubs = psutil.Process(pid).children(recursive=True)
        assert len(stubs) == 2, stubs  # one stub process per instance
        # Each stub's shared-memory region, named on its command line (MODEL.py REGION ...).
        regions = [Path("/dev/shm") / stub.cmdline()[2] for stub in stubs]
        assert all(region.exists() for region in regions), regions
        # An idle keep-alive connection holds tritonserver's shutdown for the whole exit timeout,
        # after which it exits without unloading its models: the stubs are left to our SIGKILL.
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_ready()
        t_raise = time.monotonic()
        raise RuntimeError("body failed")
    stop_s = time.monotonic() - t_raise
    client.close()
    assert stop_s < 20, stop_s
    assert server.process.returncode is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert processes_mentioning(repo) == []
    assert [region for region in regions if region.exists()] == []  # killed stubs leave none behind


def test_start_failure_raises_with_log_tail(peers: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    folder = write_sleeper(repo, "broken", service_ms=1)
    (folder / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('perfkit-broken-model')\n"
    )
    with (
        pytest.raises(TritonStartError, match="perfkit-broken-model"),
        triton_server(peers, repo, extra_args=NO_AUTO_COMPLETE, start_timeout_s=60),
    ):
        pytest.fail("tritonserver became ready with a broken model")
    assert processes_mentioning(repo) == []


def test_port_race_is_retried(peers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "models"
    write_sleeper(repo, "sleeper", service_ms=1)
    real_free_ports = triton_module.free_ports
    picks: list[list[int]] = []
    with triton_module.socket.create_server(("127.0.0.1", 0)) as taken:

        def racy_free_ports(count: int) -> list[int]:
            ports = real_free_ports(count)
            if not picks:
                ports[0] = taken.getsockname()[1]  # someone else bound our HTTP port first
            picks.append(ports)
            return ports

        monkeypatch.setattr(triton_module, "free_ports", racy_free_ports)
        with triton_server(
            peers, repo, extra_args=NO_AUTO_COMPLETE, stop_timeout_s=0, log_path=tmp_path / "triton.log"
        ) as server:
            assert server.http_port == picks[1][0]
            with httpclient.InferenceServerClient(server.http_url) as client:
                assert client.is_server_ready()
    assert len(picks) == 2
    assert "already in use" in (tmp_path / "triton.log").read_text()
    assert processes_mentioning(repo) == []
