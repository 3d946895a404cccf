"""Loading and unloading a python model over and over through the repository API (explicit model
control mode) leaks nothing: no stub process, no shared memory (/dev/shm files or the stubs' memfd
arenas mapped or open in the server), no custom metric family on /metrics, no open file descriptor.

The model is trivial but uses what a real one does: a custom metric family registered in
`initialize` and one request per cycle. The counts after the cycles must equal the counts after the
first one exactly, so a leak of one thing per cycle shows after a single cycle; the cycles are there
for leaks that happen in some cycles only (a race at unload): 20 cycles catch one that happens in
every tenth cycle 88% of the time, 100 cycles all but always. A cycle takes 0.11-0.17 s on the
2-core test machine (0.2 s and more when it is busy), so the suite runs 20 (about 3 s);
PERFKIT_LEAK_CYCLES=100 runs the 100 cycles of the python backend's acceptance (11-20 s).
"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from reference_server.server import running_server
from tests.servers import http_client, loopback_config

pytestmark = [pytest.mark.integration]

CYCLES = int(os.environ.get("PERFKIT_LEAK_CYCLES", "20"))

CYCLER = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="cycler_requests", description="Requests",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.requests = self.family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        self.requests.increment(len(requests))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy())]) for r in requests]
"""

CONFIG = """\
name: "cycler"
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _counts(metrics_port: int, others: frozenset[int]) -> dict[str, int]:
    server = psutil.Process()  # the server runs in this process (running_server), its stubs are children
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    return {
        "stub processes": _stubs(server, others),
        # Held by the server, mapped or open: the machine's whole /dev/shm listing also moves with
        # other programs' regions (other tests, real tritonservers), which are not ours to count.
        "/dev/shm files held": sum(1 for path in _held(server) if path.startswith("/dev/shm/")),
        "memfd arenas held": sum(1 for path in _held(server) if path.startswith(("/memfd:pb-", "memfd:pb-"))),
        "metric families": metrics.count("# TYPE "),
        "cycler families": metrics.count("# TYPE cycler_"),
        "open fds": server.num_fds(),
    }  # fmt: skip


def _stubs(server: psutil.Process, others: frozenset[int]) -> int:
    """This server's stubs: `others` are children that were there before it started (stubs of other
    servers a test session keeps running in this process)."""
    count = 0
    for child in server.children(recursive=True):
        if child.pid in others:
            continue
        try:
            count += "reference_server.backends.python" in " ".join(child.cmdline())
        except psutil.ZombieProcess:
            count += 1  # exited, not yet waited for: still the server's to reap
        except psutil.NoSuchProcess:
            pass
    return count


def _held(server: psutil.Process) -> list[str]:
    """The files `server` maps or has open."""
    paths = [m.path for m in server.memory_maps(grouped=False)]
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # the descriptor listing the folder, closed by now
    return paths


def _cycle(client: httpclient.InferenceServerClient) -> None:
    client.load_model("cycler")
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    assert client.infer("cycler", [tensor]).as_numpy("OUT").tolist() == [1.0]
    client.unload_model("cycler")


def test_load_unload_cycles_leak_nothing(tmp_path: Path) -> None:
    (tmp_path / "cycler" / "1").mkdir(parents=True)
    (tmp_path / "cycler" / "1" / "model.py").write_text(CYCLER)
    (tmp_path / "cycler" / "config.pbtxt").write_text(CONFIG)
    others = frozenset(child.pid for child in psutil.Process().children(recursive=True))
    with running_server(loopback_config(tmp_path, load=())) as server:
        assert server.metrics_port is not None
        client = http_client(server)
        try:
            _cycle(client)  # first-time costs (imports, pools) are not leaks
            before = _settled(server.metrics_port, others, None)
            assert before["stub processes"] == 0 and before["cycler families"] == 0, before
            for _ in range(CYCLES):
                _cycle(client)
            assert _settled(server.metrics_port, others, before) == before
        finally:
            client.close()


def _settled(metrics_port: int, others: frozenset[int], want: dict[str, int] | None) -> dict[str, int]:
    """The counts once the last unload is done: unloaded versions close in the background."""
    deadline = time.monotonic() + 15
    counts = _counts(metrics_port, others)
    while time.monotonic() < deadline and (
        counts["stub processes"] or counts["cycler families"] or (want is not None and counts != want)
    ):
        time.sleep(0.1)
        counts = _counts(metrics_port, others)
    return counts
