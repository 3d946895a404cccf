"""Fixtures for the tests that run each case on the reference server and on real tritonserver
2.51 alike: a test module defines its `repository` fixture and asks for `server` (parametrized over
both, Triton's case marked peers), or for `ours` or `triton` alone. The repository's configs must be
complete: Triton runs without auto-completion, which would start a stub per python model
(tests/servers.py, `running_triton`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_server.server import running_server
from tests.servers import Endpoints, loopback_config, running_triton


@pytest.fixture(scope="module")
def ours(repository: Path) -> Iterator[Endpoints]:
    with running_server(loopback_config(repository)) as server:
        yield Endpoints("ours", server.http_url, f"127.0.0.1:{server.grpc_port}", server)


@pytest.fixture(scope="module")
def triton(peers: Path, repository: Path) -> Iterator[Endpoints]:
    with running_triton(peers, repository, auto_complete=False) as server:
        yield Endpoints("triton", server.http_url, server.grpc_url)


@pytest.fixture(params=["ours", pytest.param("triton", marks=pytest.mark.peers)])
def server(request: pytest.FixtureRequest) -> Endpoints:
    endpoints: Endpoints = request.getfixturevalue(request.param)
    return endpoints
