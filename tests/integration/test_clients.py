"""perfkit.wire.client against the reference server (both front ends) and small stub servers, loopback only."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from perfkit.errors import PerfkitError, TargetError
from perfkit.load.inputs import build_requests
from perfkit.target import ServerProcess
from perfkit.wire.client import MESSAGES_PER_KIND, InferClient, Outcome, make_client
from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config, write_identity_model
from v2kit import codec as v2

pytestmark = pytest.mark.integration

PROTOCOLS = ["http", "grpc"]
SHAPES = {"identity": {"INPUT0": [16]}}


def url_for(server: Any, protocol: str) -> str:
    if protocol == "http":
        return str(server.http_url)
    port = server.grpc_port if isinstance(server, ReferenceServer) else server.ports.get("GRPCInferenceService")
    if port is None:
        pytest.skip("gRPC front end not available")
    return f"127.0.0.1:{port}"


@pytest.fixture(params=PROTOCOLS)
async def client(request: pytest.FixtureRequest, demo_server: ReferenceServer) -> AsyncIterator[InferClient]:
    c = make_client(url_for(demo_server, request.param), request.param)
    yield c
    await c.close()


async def requests_for(c: InferClient, model: str, **kwargs: Any) -> list[v2.InferRequest]:
    metadata, config = await c.model_metadata(model), await c.model_config(model)
    return build_requests(metadata, config, model=model, shapes=SHAPES.get(model, {}), **kwargs)


def bad_shape_request() -> v2.InferRequest:
    tensor = v2.InferTensor("INPUT0", "FP32", [1, 3], np.zeros((1, 3), np.float32))
    return v2.InferRequest("mlp", inputs=[tensor])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- inference -------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["mlp", "identity", "convnet"])
async def test_send_succeeds_for_each_model(client: InferClient, model: str) -> None:
    (request,) = await requests_for(client, model, batch_size=2)
    prepared = client.prepare(request)
    assert prepared.bytes_out > 0
    for _ in range(3):
        outcome = await client.send(prepared)
        assert outcome.error == "", outcome.message
        assert outcome.bytes_in > 0 and outcome.message == ""
        assert outcome.send_ns > 0 and outcome.recv_ns > 0


async def test_concurrent_sends_all_succeed(client: InferClient) -> None:
    prepared = [client.prepare(r) for r in await requests_for(client, "mlp", batch_size=4)]
    outcomes = await asyncio.gather(*(client.send(prepared[0]) for _ in range(200)))
    assert [o.error for o in outcomes] == [""] * 200
    assert len({o.bytes_in for o in outcomes}) == 1


async def test_http_json_tensors_and_json_outputs(demo_server: ReferenceServer) -> None:
    c = make_client(demo_server.http_url, "http", json_tensors=True, binary_outputs=False)
    try:
        (request,) = await requests_for(c, "mlp")
        prepared = c.prepare(request)
        assert prepared.payload.startswith(b"{") and prepared.headers is not None
        assert "Inference-Header-Content-Length" not in prepared.headers
        outcome = await c.send(prepared)
        assert outcome.error == "", outcome.message
        assert outcome.bytes_in > 100  # ten JSON numbers
    finally:
        await c.close()
    with pytest.raises(PerfkitError, match="--input-tensor-format json is for HTTP only"):
        make_client("127.0.0.1:1", "grpc", json_tensors=True)


async def test_server_errors_are_classified_with_the_server_message(client: InferClient) -> None:
    outcome = await client.send(client.prepare(bad_shape_request()))
    assert outcome.error == ("HTTP 400" if client.protocol == "http" else "grpc INVALID_ARGUMENT")
    assert "unexpected shape for input 'INPUT0'" in outcome.message
    unknown = client.prepare(v2.InferRequest("nope", inputs=bad_shape_request().inputs))
    outcomes = [await client.send(unknown) for _ in range(MESSAGES_PER_KIND + 2)]
    assert {o.error for o in outcomes} == {"HTTP 404" if client.protocol == "http" else "grpc NOT_FOUND"}
    assert all("nope" in o.message for o in outcomes[:MESSAGES_PER_KIND])
    assert [o.message for o in outcomes[MESSAGES_PER_KIND:]] == ["", ""]  # only the first ones carry it


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_closed_port_is_connection_refused(protocol: str) -> None:
    c = make_client(f"127.0.0.1:{closed_port()}", protocol, request_timeout_s=5)
    try:
        request = build_requests(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]}, {"max_batch_size": 8}, model="m"
        )[0]
        outcome = await c.send(c.prepare(request))
        assert outcome.error == "connection refused"
        assert outcome.bytes_in == 0 and outcome.message
        with pytest.raises(TargetError, match="cannot reach"):
            await c.live()
    finally:
        await c.close()


def test_request_timeout(repository_copy: Path) -> None:
    # A lone request waits for the preferred batch of 4 until the 2 s queue delay expires.
    write_identity_model(
        repository_copy,
        "slow",
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000000 }",
    )
    config = loopback_config(repository_copy, load=("slow",))

    async def one(url: str, protocol: str) -> Outcome:
        c = make_client(url, protocol, request_timeout_s=0.3)
        try:
            (request,) = build_requests(
                await c.model_metadata("slow"), await c.model_config("slow"), model="slow", shapes={"INPUT0": [4]}
            )
            start = time.monotonic()
            outcome = await c.send(c.prepare(request))
            assert time.monotonic() - start < 1.5
            return outcome
        finally:
            await c.close()

    with running_server(config) as server:
        protocols = ["http"] + (["grpc"] if server.grpc_port is not None else [])
        for protocol in protocols:
            outcome = asyncio.run(one(url_for(server, protocol), protocol))
            assert outcome.error == "timeout", outcome
            assert outcome.bytes_in == 0


# --- transport failures, against stub HTTP servers --------------------------------------------------


async def stub_server(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{runner.addresses[0][1]}"


async def test_http_stub_failures_are_classified() -> None:
    seen: dict[str, str] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        seen.update(request.headers)
        mode = request.match_info["model"]
        if mode == "busy":
            return web.Response(status=503, body=v2.error_body("try later"))
        if mode == "garbled":
            return web.Response(body=b"{not json", headers={"Inference-Header-Content-Length": "9"})
        if mode == "short":  # the header declares 8 binary bytes, the body has 4
            header = b'{"outputs":[{"name":"O","parameters":{"binary_data_size":8}}]}'
            return web.Response(body=header + b"abcd", headers={"Inference-Header-Content-Length": str(len(header))})
        assert request.transport is not None
        request.transport.close()  # "drop": hang up without answering
        return web.Response()

    runner, url = await stub_server(handler)
    c = make_client(url, "http", headers={"X-Perfkit-Test": "yes"})
    try:
        tensor = v2.InferTensor("INPUT0", "FP32", [1], np.zeros(1, np.float32))
        outcomes = {
            mode: await c.send(c.prepare(v2.InferRequest(mode, inputs=[tensor])))
            for mode in ("busy", "garbled", "short", "drop")
        }
    finally:
        await c.close()
        await runner.cleanup()
    assert (outcomes["busy"].error, outcomes["busy"].message) == ("HTTP 503", "try later")
    assert outcomes["garbled"].error == "bad response"
    assert outcomes["short"].error == "bad response"
    assert outcomes["drop"].error == "disconnected"
    assert seen["X-Perfkit-Test"] == "yes" and seen["Content-Type"] == "application/octet-stream"
    assert "Inference-Header-Content-Length" in seen and "Accept-Encoding" not in seen


def test_make_client_rejects_bad_arguments() -> None:
    with pytest.raises(PerfkitError, match="-i must be http or grpc, got 'tcp'"):
        make_client("127.0.0.1:8000", "tcp")
    with pytest.raises(PerfkitError, match="-u ftp://x: expected HOST:PORT"):
        make_client("ftp://x", "http")
    with pytest.raises(PerfkitError, match="request timeout must be > 0"):
        make_client("127.0.0.1:8000", "http", request_timeout_s=0)


# --- control plane ---------------------------------------------------------------------------------


def value_shape(doc: Any) -> Any:
    """The structure of a JSON document: keys and value types, not values."""
    if isinstance(doc, dict):
        return {k: value_shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [value_shape(v) for v in doc]
    return type(doc).__name__


async def test_control_plane_is_the_same_over_http_and_grpc(demo_server: ReferenceServer) -> None:
    http = make_client(url_for(demo_server, "http"), "http")
    grpc_ = make_client(url_for(demo_server, "grpc"), "grpc")
    try:
        for c in (http, grpc_):
            assert await c.live() and await c.ready()
            (request,) = await requests_for(c, "mlp")
            assert (await c.send(c.prepare(request))).error == ""
        assert await http.server_metadata() == await grpc_.server_metadata()
        assert await http.repository_index() == await grpc_.repository_index()
        for model, version in [("mlp", ""), ("identity", ""), ("convnet", "1")]:
            assert await http.model_metadata(model, version) == await grpc_.model_metadata(model, version)
            assert await http.model_config(model, version) == await grpc_.model_config(model, version)
        config = await grpc_.model_config("mlp")
        assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [256]
        assert (await grpc_.model_metadata("identity"))["inputs"][0]["shape"] == [-1, -1]
        for model in ("mlp", ""):
            via_http, via_grpc = await http.model_statistics(model), await grpc_.model_statistics(model)
            assert value_shape(via_http) == value_shape(via_grpc)
            assert via_http == via_grpc  # nothing ran in between
        stats = (await grpc_.model_statistics("mlp"))["model_stats"][0]
        assert isinstance(stats["inference_stats"]["success"]["count"], int) and stats["inference_count"] >= 2
        for c in (http, grpc_):
            with pytest.raises(TargetError, match="nope"):
                await c.model_config("nope")
    finally:
        await http.close()
        await grpc_.close()


# --- cost ------------------------------------------------------------------------------------------


async def client_cpu_us(c: InferClient, prepared: Any, total: int, concurrency: int) -> tuple[float, float]:
    """(client CPU µs per request, requests per second) for `total` requests from `concurrency` workers."""

    async def worker(n: int) -> None:
        for _ in range(n):
            outcome = await c.send(prepared)
            assert outcome.error == "", outcome.message

    await asyncio.gather(*(worker(10) for _ in range(concurrency)))  # warm the connections
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    cpu, wall = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
    return cpu / total / 1000, total / (wall / 1e9)


def test_client_cpu_per_request(demo_server_process: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    """Prints (asserts nothing about) the client's CPU per request; the server runs in its own process,
    so this process's CPU time is the client's."""

    async def measure(url: str, protocol: str) -> str:
        c = make_client(url, protocol)
        try:
            (request,) = await requests_for(c, "identity")
            us, rps = await client_cpu_us(c, c.prepare(request), total=2000, concurrency=8)
            return f"{protocol}: {us:.0f} µs client CPU per request ({rps:.0f} req/s, concurrency 8, identity [1,16])"
        finally:
            await c.close()

    lines = [asyncio.run(measure(url_for(demo_server_process, p), p)) for p in PROTOCOLS]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
