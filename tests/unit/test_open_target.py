"""Where a sweep of a running server reads its metrics when --collect-metrics names no URL: where the
server's identity (its metadata's name) says, never port 8002 of whatever server -u names."""

from __future__ import annotations

from typing import Any

import pytest

from perfkit.cli import build_parser
from perfkit.cli.sweep import spec_from_args
from perfkit.measure.metrics_source import default_metrics_url, server_label, with_server_metrics
from perfkit.target import Target, lists_extension, open_target

TRITON = {"name": "triton", "version": "2.51.0", "extensions": ["statistics", "binary_tensor_data"]}
MLSERVER = {"name": "mlserver", "version": "1.7.1", "extensions": []}
KSERVE = {"name": "kserve", "version": "0.21.0", "extensions": ["model_repository_extension"]}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("10.0.0.5:8000", "http://10.0.0.5:8002/metrics"),
        ("http://10.0.0.5:8000", "http://10.0.0.5:8002/metrics"),
        # Triton and the reference server serve metrics in the clear beside an HTTPS front end.
        ("https://infer.example:8443", "http://infer.example:8002/metrics"),
        ("[::1]:9000", "http://[::1]:8002/metrics"),
    ],
)
def test_tritons_metrics_are_port_8002_on_the_host_of_u(url: str, expected: str) -> None:
    args = build_parser().parse_args(["sweep", "-u", url, "-m", "mlp", "--collect-metrics"])
    metrics = spec_from_args(args).metrics
    with open_target(url, "http", metrics_urls=metrics.metrics_urls) as target:
        assert target.metrics_urls == ()  # nothing guessed before the server says what it is
        settled, note = with_server_metrics(target, TRITON, metrics.collect)
    assert (settled.metrics_url, note) == (expected, "")


@pytest.mark.parametrize(
    ("endpoint", "protocol", "metadata", "expected"),
    [
        ("127.0.0.1:8001", "grpc", TRITON, "http://127.0.0.1:8002/metrics"),
        ("h:9000", "http", {"name": "perfkit-reference-server"}, "http://h:8002/metrics"),
        # MLServer's metrics server, on its metrics_port (default 8082), over HTTP and gRPC alike
        ("127.0.0.1:8080", "http", MLSERVER, "http://127.0.0.1:8082/metrics"),
        ("127.0.0.1:8081", "grpc", MLSERVER, "http://127.0.0.1:8082/metrics"),
        # KServe serves /metrics on its HTTP port, in the scheme and under the prefix of -u
        ("127.0.0.1:18090", "http", KSERVE, "http://127.0.0.1:18090/metrics"),
        ("https://ks.example/v1/route", "http", KSERVE, "https://ks.example/v1/route/metrics"),
        ("127.0.0.1:18091", "grpc", KSERVE, None),  # its HTTP port is not known from the gRPC one
        ("h:9000", "http", {"name": "OpenAI-compatible"}, "http://h:9000/metrics"),
        ("127.0.0.1:8000", "http", {"name": "torchserve", "version": "0.12"}, None),
        ("127.0.0.1:8000", "http", {}, None),
    ],
)
def test_the_metrics_url_follows_the_servers_identity(
    endpoint: str, protocol: str, metadata: dict[str, Any], expected: str | None
) -> None:
    assert default_metrics_url(endpoint, protocol, metadata) == expected


def target(url: str, protocol: str = "http", metrics_urls: tuple[str, ...] = (), embedded: bool = False) -> Target:
    return Target(url, protocol, metrics_urls, None, embedded=embedded)


def test_an_unknown_server_is_not_scraped_at_8002_and_says_what_to_give() -> None:
    settled, note = with_server_metrics(target("127.0.0.1:8000"), {"name": "canned", "version": "0"}, True)
    assert settled.metrics_urls == ()
    assert note == "--collect-metrics: no metrics URL known for canned 0 at 127.0.0.1:8000; give --metrics-url"
    _, grpc_note = with_server_metrics(target("127.0.0.1:18091", "grpc"), KSERVE, True)
    assert grpc_note.startswith("--collect-metrics: no metrics URL known for kserve 0.21.0 at 127.0.0.1:18091; ")
    assert "http://HOST:HTTP_PORT/metrics" in grpc_note


def test_given_urls_the_embedded_server_and_no_collect_metrics_stay_as_they_are() -> None:
    given = target("127.0.0.1:8000", metrics_urls=("http://dcgm:9400/metrics",))
    assert with_server_metrics(given, TRITON, True) == (given, "")
    embedded = target("127.0.0.1:5000", metrics_urls=("http://127.0.0.1:5002/metrics",), embedded=True)
    assert with_server_metrics(embedded, {"name": "canned"}, True) == (embedded, "")
    plain = target("127.0.0.1:8000")
    assert with_server_metrics(plain, {"name": "canned"}, False) == (plain, "")


def test_a_fleet_reads_each_hosts_metrics_once() -> None:
    settled, _ = with_server_metrics(target("a:8000,a:9000,b:8000"), TRITON, True)
    assert settled.metrics_urls == ("http://a:8002/metrics", "http://b:8002/metrics")


def test_the_server_label_and_its_extensions() -> None:
    assert server_label(MLSERVER) == "mlserver 1.7.1"
    assert server_label({}) == "the server"
    assert lists_extension(TRITON, "statistics") is True
    assert lists_extension(MLSERVER, "statistics") is False
    assert lists_extension({"name": "x"}, "statistics") is None
