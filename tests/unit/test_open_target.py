"""Where a sweep of a running server reads its metrics when --collect-metrics names no URL."""

from __future__ import annotations

import pytest

from perfkit.cli import build_parser
from perfkit.cli.sweep import spec_from_args
from perfkit.target import open_target


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("10.0.0.5:8000", "http://10.0.0.5:8002/metrics"),
        ("http://10.0.0.5:8000", "http://10.0.0.5:8002/metrics"),
        # Triton and the reference server serve metrics in the clear beside an HTTPS front end.
        ("https://infer.example:8443", "http://infer.example:8002/metrics"),
    ],
)
def test_the_default_metrics_url_is_port_8002_on_the_host_of_u(url: str, expected: str) -> None:
    args = build_parser().parse_args(["sweep", "-u", url, "-m", "mlp", "--collect-metrics"])
    metrics = spec_from_args(args).metrics
    with open_target(url, "http", metrics_urls=metrics.metrics_urls, collect_metrics=metrics.collect) as target:
        assert target.metrics_url == expected
