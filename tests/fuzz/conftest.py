from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_server.server import ReferenceServer, running_server
from tests.fuzz.wire import build_fuzz_repository, crashes_logged
from tests.servers import loopback_config


@pytest.fixture(scope="session")
def fuzz_server(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    """The reference server both fuzzers hit: the demo models and a BYTES model, explicit model
    control (so the repository API is live), small enough limits that the fuzzers reach them."""
    repository = build_fuzz_repository(demo_repository, tmp_path_factory.mktemp("fuzz") / "models")
    config = loopback_config(repository, load=("*",), http_max_input_size=256 * 1024, max_tensor_elements=64 * 1024)
    with running_server(config) as server:
        yield server


@pytest.fixture(scope="module")
def crashes() -> Iterator[list[logging.LogRecord]]:
    """Tracebacks logged while a fuzz module runs; its last test asserts there are none."""
    with crashes_logged() as records:
        yield records
