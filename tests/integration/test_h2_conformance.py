"""h2spec's server cases (github.com/summerwind/h2spec: generic, http2 §3.5-§8.2, hpack), ported:
each is a raw-socket exchange on loopback with a server's gRPC port asserting what h2spec asserts
(a connection error: GOAWAY with its code; a stream error: RST_STREAM with its code, or GOAWAY with
it; or the frame expected). h2spec's requests are GETs of "/"; ours are gRPC calls (ServerLive), as
a gRPC server answers those with DATA. Bounded: every read times out, a connection reads at most
`tests.h2peer.MAX_READ` bytes.

The same cases run against our server and, for reference, real tritonserver (PERFKIT_PEERS, marked
`peers`). The cases are in tests/h2spec/, one module per part of h2spec's list. Our server must pass every one, and strictly: a connection error is a GOAWAY with the
code, where h2spec also takes a closed connection. Where Triton (grpc core) fails a case, the case
is xfail for Triton only, with the reason (`TRITON_FAILS`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reference_server.server import running_server
from tests.h2peer import Peer
from tests.h2spec import generic, hpack, http2_frames, http2_streams  # noqa: F401  (they register the cases)
from tests.h2spec.verify import CASES, connection_error
from tests.servers import loopback_config, running_triton
from v2kit.h2 import frames as h2

pytestmark = pytest.mark.integration

_SILENT = "grpc core neither sends the error RFC 9113 names nor closes the connection within the case's wait"
#: How long a case waits on Triton where it is known to fail: the run stays short, and a silence of
#: a second already breaks the case (every server that passes answers within milliseconds).
SILENT_WAIT_S = 1.0
_MALFORMED = (
    "grpc core does not answer this malformed request with PROTOCOL_ERROR (it ignores it or resets INTERNAL_ERROR)"
)
#: Cases real Triton (grpc core) fails, and how; xfail for Triton only.
TRITON_FAILS: dict[str, str] = {
    "generic/3.1/3": "grpc core resets a stream whose DATA is padded (RST_STREAM PROTOCOL_ERROR)",
    "generic/4/2": "grpc core resets a HEAD request (RST_STREAM INTERNAL_ERROR) rather than answering it",
    "http2/4.1/2": "grpc core closes the connection on a PING with undefined flags, which must be ignored",
    "http2/4.2/2": _SILENT,
    "http2/4.2/3": _SILENT,
    "http2/5.1/1": _SILENT,
    "http2/5.1/2": _SILENT,
    "http2/5.1/3": _SILENT,
    "http2/5.1/5": _SILENT,
    "http2/5.1/6": _SILENT,
    "http2/5.1/8": _SILENT,
    "http2/5.1/9": _SILENT,
    "http2/5.1/11": _SILENT,
    "http2/5.1/12": _SILENT,
    "http2/5.1.1/1": _SILENT,
    "http2/5.1.1/2": _SILENT,
    "http2/5.3.1/1": _SILENT,
    "http2/5.3.1/2": _SILENT,
    "http2/5.4.1/1": _SILENT,
    "http2/5.4.1/2": _SILENT,
    "http2/6.1/1": _SILENT,
    "http2/6.1/2": _SILENT,
    "http2/6.1/3": _SILENT,
    "http2/6.2/3": _SILENT,
    "http2/6.3/1": _SILENT,
    "http2/6.3/2": _SILENT,
    "http2/6.4/1": _SILENT,
    "http2/6.4/2": _SILENT,
    "http2/6.7/3": _SILENT,
    "http2/6.8/1": _SILENT,
    "http2/6.9.1/2": _SILENT,
    "http2/6.9.1/3": _SILENT,
    "http2/8.1.2/1": _MALFORMED,
    "http2/8.1.2.1/1": _MALFORMED,
    "http2/8.1.2.1/2": _MALFORMED,
    "http2/8.1.2.1/3": _MALFORMED,
    "http2/8.1.2.1/4": _MALFORMED,
    "http2/8.1.2.2/1": _MALFORMED,
    "http2/8.1.2.2/2": _MALFORMED,
    "http2/8.1.2.3/1": _MALFORMED,
    "http2/8.1.2.3/2": _MALFORMED,
    "http2/8.1.2.3/3": _MALFORMED,
    "http2/8.1.2.3/4": _MALFORMED,
    "http2/8.1.2.3/5": _MALFORMED,
    "http2/8.1.2.3/6": _MALFORMED,
    "http2/8.1.2.3/7": _MALFORMED,
    "http2/8.1.2.6/1": _MALFORMED,
    "http2/8.1.2.6/2": _MALFORMED,
    "http2/8.2/1": _SILENT,
}


@pytest.fixture(scope="module")
def our_port(demo_repository: Path) -> Iterator[int]:
    with running_server(loopback_config(demo_repository)) as server:
        assert server.grpc_port is not None
        yield server.grpc_port


@pytest.fixture(scope="module")
def triton_port(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    repository = tmp_path_factory.mktemp("h2spec-triton") / "models"
    repository.mkdir()
    with running_triton(peers, repository, auto_complete=False) as server:
        yield server.grpc_port


def run_case(port: int, key: str, strict: bool, timeout_s: float = 5.0) -> None:
    _, run = CASES[key]
    with Peer(port, timeout_s=timeout_s) as p:
        p.strict = strict
        p.handshake()
        run(p)


def _outcome(port: int, key: str) -> BaseException | None:
    """What Triton's run of the case raised (a failure, or pytest's skip), or None where it passed."""
    try:
        run_case(port, key, strict=False, timeout_s=SILENT_WAIT_S if key in TRITON_FAILS else 5.0)
    except (Exception, pytest.skip.Exception, pytest.fail.Exception) as error:  # re-raised by the case's test
        return error
    return None


@pytest.fixture(scope="module")
def triton_outcomes(triton_port: int) -> dict[str, BaseException | None]:
    """Every case against Triton, each on its own connection, all at once: most cases Triton fails
    wait `SILENT_WAIT_S` for an answer that never comes, and one after another those waits add up
    to most of a minute. Each case's test raises what its run raised."""
    keys = [k for k in CASES if k != "http2/3.5/2"]
    with ThreadPoolExecutor(max_workers=len(keys)) as pool:
        return dict(zip(keys, pool.map(lambda key: _outcome(triton_port, key), keys), strict=True))


@pytest.mark.parametrize("key", [k for k in CASES if k != "http2/3.5/2"])
def test_our_server_passes(our_port: int, key: str) -> None:
    run_case(our_port, key, strict=True)


@pytest.mark.peers
@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.xfail(reason=TRITON_FAILS[k], strict=True)) if k in TRITON_FAILS else k
     for k in CASES if k != "http2/3.5/2"],
)  # fmt: skip
def test_triton_for_reference(triton_outcomes: dict[str, BaseException | None], key: str) -> None:
    error = triton_outcomes[key]
    if error is not None:
        raise error


def _invalid_preface(port: int, strict: bool) -> None:
    with Peer(port) as p:
        p.strict = strict
        p.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
        connection_error(p, h2.PROTOCOL_ERROR)


def test_our_server_refuses_an_invalid_preface(our_port: int) -> None:
    _invalid_preface(our_port, strict=True)


@pytest.mark.peers
def test_triton_refuses_an_invalid_preface(triton_port: int) -> None:
    _invalid_preface(triton_port, strict=False)
