"""Where a server's Prometheus metrics are read when --collect-metrics names no URL, decided from the
server's identity (the name its metadata reports) rather than from a port guessed for every server.

perf_analyzer reads port 8002 on the host of -u: Triton's --metrics-port default. Against any other
server that port is not its metrics, and may be another server's (a Triton beside it, another test
server), whose GPU figures would then be reported as the measured server's. So:

| server (metadata `name`) | metrics URL | why |
| --- | --- | --- |
| `triton`, `perfkit-reference-server` | http://HOST:8002/metrics | their --metrics-port default |
| `mlserver` | http://HOST:8082/metrics | MLServer's `metrics_port` default (its own server) |
| `kserve` | /metrics on the HTTP endpoint of -u | KServe's ModelServer serves it on its HTTP port |
| `OpenAI-compatible` (generative) | /metrics on the endpoint of -u | vLLM, SGLang, Triton's OpenAI front end |
| anything else | none, said once | give --metrics-url |

A metrics port that is not the default (MLServer's `metrics_port`, Triton's --metrics-port) cannot be
seen through the protocol: --metrics-url says it. Metrics are served in the clear, also beside an
https:// front end (Triton, the reference server), except where they share the endpoint of -u.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from perfkit.target import Target, endpoints_of

__all__ = ["default_metrics_url", "server_label", "with_server_metrics"]

#: The metrics port of a server with a metrics server of its own, by its metadata's name (lower case).
METRICS_PORTS = {"triton": 8002, "perfkit-reference-server": 8002, "mlserver": 8082}
#: Servers that serve /metrics on the endpoint they are measured at (HTTP only for KServe).
SAME_ENDPOINT = {"kserve": ("http",), "openai-compatible": ("http", "grpc")}


def server_label(metadata: Mapping[str, Any]) -> str:
    """The server as its metadata names it, for a console line: "mlserver 1.7.1"; "the server"
    where it gives no name."""
    parts = [str(metadata[key]) for key in ("name", "version") if isinstance(metadata.get(key), (str, int))]
    return " ".join(p for p in parts if p) or "the server"


def _split(endpoint: str) -> tuple[str, str, str]:
    """(scheme or "", authority, path after it) of one endpoint of -u."""
    scheme, has_scheme, rest = endpoint.strip().partition("://")
    if not has_scheme:
        scheme, rest = "", endpoint.strip()
    authority, _, path = rest.partition("/")
    return scheme.lower(), authority, path.strip("/")


def _host(authority: str) -> str:
    if authority.startswith("["):  # [v6] or [v6]:port
        return authority[: authority.index("]") + 1]
    return authority.rsplit(":", 1)[0]


def default_metrics_url(endpoint: str, protocol: str, metadata: Mapping[str, Any]) -> str | None:
    """The metrics URL of the server at `endpoint` (one endpoint of -u, over `protocol`) by its
    metadata's name (module header); None where none is known."""
    name = str(metadata.get("name", "")).strip().lower()
    scheme, authority, path = _split(endpoint)
    if name in METRICS_PORTS:
        return f"http://{_host(authority)}:{METRICS_PORTS[name]}/metrics"
    if protocol in SAME_ENDPOINT.get(name, ()):
        base = f"{scheme if scheme in ('http', 'https') else 'http'}://{authority}"
        return f"{base}/{path}/metrics" if path else f"{base}/metrics"
    return None


def with_server_metrics(target: Target, metadata: Mapping[str, Any], collect: bool) -> tuple[Target, str]:
    """`target` with the metrics URLs that --collect-metrics reads from the server its `metadata`
    describes, and the console line to say once ("" when there is nothing to say). URLs given
    (--metrics-url) and the embedded server's own stay as they are."""
    if not collect or target.embedded or target.metrics_urls:
        return target, ""
    found = [default_metrics_url(e, target.protocol, metadata) for e in endpoints_of(target.url)]
    urls = tuple(dict.fromkeys(u for u in found if u))
    if urls:
        return dataclasses.replace(target, metrics_urls=urls), ""
    name = str(metadata.get("name", "")).strip().lower()
    where = (
        f" http://HOST:HTTP_PORT/metrics ({metadata.get('name')} serves its metrics on its HTTP port)"
        if name in SAME_ENDPOINT and target.protocol not in SAME_ENDPOINT[name]
        else ""
    )
    return target, (
        f"--collect-metrics: no metrics URL known for {server_label(metadata)} at {target.url}; "
        f"give --metrics-url{where}"
    )
