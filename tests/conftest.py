from __future__ import annotations

import base64
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfkit.target import ServerProcess, reference_server_process
from reference_server.config import ServerConfig
from reference_server.server import ReferenceServer, running_server
from v2kit.demo import build_demo_repository

# A shell starts background jobs (`cmd &`, nohup) with SIGINT ignored, and every process inherits
# that: the tests of what Ctrl-C does would then see nothing. Python's own handler again here, and
# so the default action in the processes the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def demo_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model repository, built once per test session."""
    return build_demo_repository(tmp_path_factory.mktemp("demo") / "models")


@pytest.fixture
def repository_copy(demo_repository: Path, tmp_path: Path) -> Path:
    """A private copy of the demo repository that a test may change."""
    target = tmp_path / "models"
    shutil.copytree(demo_repository, target)
    return target


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    """The reference server on the demo repository, on free loopback ports, one for the session: its
    start loads every demo model (a python stub among them, 1-3 s on two cores), and the modules
    that share it only read it (statistics are compared before and after, never from zero)."""
    repository = build_demo_repository(tmp_path_factory.mktemp("demo_server") / "models")
    config = ServerConfig(model_repository=repository, http_port=0, grpc_port=0, metrics_port=0)
    with running_server(config) as server:
        yield server


@pytest.fixture(scope="session")
def demo_server_process(demo_repository: Path) -> Iterator[ServerProcess]:
    """The reference server on the demo repository in a process of its own (so that it never competes
    with the test's process for the GIL, and the test's CPU time is the client's), one for the
    session: its start imports the server and loads every demo model, 2-5 s on two cores. The
    modules that share it fault the connections to it (through a proxy) or print the client's cost,
    never the server itself; test_distributed, whose rates are held to 10 %, keeps a server of its own."""
    with reference_server_process(demo_repository) as running:
        yield running


#: A 1×1 white PNG, in place of a rendered figure.
TINY_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC"
)


@pytest.fixture
def quick_png(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reports' figures are built but not rasterized (a tenth of a second or more each): for
    tests of what writes a report rather than of its pictures, which the report's own tests and the
    browser test draw."""
    from perfkit.report.figures import canvas

    monkeypatch.setattr(canvas, "png", lambda fig: TINY_PNG)


@pytest.fixture(scope="session")
def peers() -> Path:
    """NVIDIA's perf_analyzer and tritonserver, from $PERFKIT_PEERS."""
    value = os.environ.get("PERFKIT_PEERS")
    if not value:
        pytest.skip(
            "PERFKIT_PEERS is not set: install the peers with `bash peers/install.sh DIR` "
            "and set PERFKIT_PEERS=DIR to run the tests against NVIDIA's perf_analyzer and tritonserver"
        )
    root = Path(value)
    for tool in ("perf_analyzer", "tritonserver"):
        if not (root / "bin" / tool).exists():
            pytest.fail(f"PERFKIT_PEERS={root} has no bin/{tool}; rerun peers/install.sh {root}")
    return root
