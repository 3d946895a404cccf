"""perfkit against Open Inference Protocol servers that answer only what the protocol promises, as
MLServer and KServe do: no model configuration (HTTP 404, gRPC UNIMPLEMENTED), no repository index
(KServe lists its models at GET /v2/models; MLServer's gRPC index says "State.READY"), `null` where
Triton has a list. Small fakes on loopback, one thread each, answering as those servers were seen to."""

from __future__ import annotations

import json
import pickle
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from perfkit.cli import build_parser, main
from perfkit.cli.sweep import spec_from_args
from perfkit.errors import MODEL_CONFIGURATION, ExitCode, MissingExtension, PerfkitError, TargetError
from perfkit.load.fleet import FleetClient
from perfkit.load.inputs import build_requests
from perfkit.measure.probe import probe
from perfkit.results.model import read_sweep
from perfkit.sweep.run import resolve_model
from perfkit.wire.client import make_client
from perfkit.wire.replies import Outcome, ReplyFraming, body_framing_ok

NOTE = "has no model configuration extension"
SHAPE = [-1, 16]


def metadata(name: str, shape: list[int] = SHAPE) -> dict[str, Any]:
    """A model's metadata as KServe 0.21 writes it: `versions` null."""
    tensor = {"datatype": "FP32", "shape": shape}
    return {"name": name, "versions": None, "platform": "", "inputs": [{"name": "INPUT0", **tensor}],
            "outputs": [{"name": "OUTPUT0", **tensor}]}  # fmt: skip


class FakeOip(ThreadingHTTPServer):
    """KServe's python ModelServer over HTTP as seen: no /config, no repository index (GET /v2/models
    instead, unless `listed` is False), `versions` null. `models` maps names to (metadata, ready)."""

    daemon_threads = True

    def __init__(self, models: dict[str, tuple[dict[str, Any], bool]], listed: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.models, self.listed = models, listed
        self.extensions = ["model_repository_extension"]
        self.inferred: list[list[list[int]]] = []  # each request's input shapes

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeOip

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        models, path = self.server.models, self.path
        found = re.fullmatch(r"/v2/models/([^/]+)(/ready)?", path)
        if path in ("/v2/health/live", "/v2/health/ready"):
            self._reply(200, {})
        elif path == "/v2":
            self._reply(200, {"name": "fake", "version": "0", "extensions": self.server.extensions})
        elif path == "/v2/models" and self.server.listed:
            self._reply(200, {"models": list(models)})
        elif found and found[1] in models:
            meta, ready = models[found[1]]
            self._reply(200 if ready or not found[2] else 503, {"ready": ready} if found[2] else meta)
        elif found:
            self._reply(404, {"error": f"Model with name {found[1]} does not exist."})
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        found = re.fullmatch(r"/v2/models/([^/]+)/infer", self.path)
        if not found or found[1] not in self.server.models:
            self._reply(404, {"detail": "Not Found"})
            return
        header = int(self.headers.get("Inference-Header-Content-Length") or len(body))
        request = json.loads(body[:header])
        self.server.inferred.append([tensor["shape"] for tensor in request["inputs"]])
        shape = request["inputs"][0]["shape"]
        output = {"name": "OUTPUT0", "datatype": "FP32", "shape": shape, "data": [1.0] * int(np.prod(shape))}
        self._reply(200, {"model_name": found[1], "outputs": [output]})


@pytest.fixture
def serve() -> Iterator[Any]:
    """Starts FakeOip servers for the test, each in a thread; stops them after."""
    started: list[FakeOip] = []

    def start(models: dict[str, tuple[dict[str, Any], bool]], listed: bool = True) -> FakeOip:
        server = FakeOip(models, listed)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


class MlserverGrpc(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """MLServer 1.7.1's gRPC as seen: an index whose states read "State.READY", no ModelConfig."""

    def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="mlserver", version="1.7.1")

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        if request.name != "addone":
            context.abort(grpc.StatusCode.NOT_FOUND, f"Model {request.name} with version  not found")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name="addone",
            inputs=[tensor(name="INPUT0", datatype="FP32", shape=SHAPE)],
            outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=SHAPE)],
        )

    def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return pb.RepositoryIndexResponse(models=[{"name": "addone", "state": "State.READY"}])

    def ModelInfer(self, request: Any, context: Any) -> Any:
        shape = list(request.inputs[0].shape)
        out = pb.ModelInferResponse.InferOutputTensor(name="OUTPUT0", datatype="FP32", shape=shape)
        return pb.ModelInferResponse(model_name="addone", outputs=[out], raw_output_contents=[bytes(4 * 16)])


@pytest.fixture(scope="module")
def mlserver_grpc() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(MlserverGrpc(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


# --- the clients --------------------------------------------------------------------------------------------


async def test_http_a_config_404_is_a_missing_extension_and_kserves_model_list_stands_for_the_index(
    serve: Any,
) -> None:
    server = serve({"addone": (metadata("addone"), True), "loading": (metadata("loading"), False)})
    client = make_client(server.url, "http")
    try:
        with pytest.raises(MissingExtension, match="config: HTTP 404") as missing:
            await client.model_config("addone")
        assert missing.value.extension == MODEL_CONFIGURATION
        assert await client.repository_index() == [
            {"name": "addone", "state": "READY"}, {"name": "loading", "state": "UNAVAILABLE"}
        ]  # fmt: skip
    finally:
        await client.close()


async def test_a_config_404_from_a_server_that_lists_model_configuration_is_the_models_error(serve: Any) -> None:
    # Triton answers 404 for a model it has not loaded (explicit model control), on a route it has.
    server = serve({"addone": (metadata("addone"), True)})
    server.extensions = ["model_repository_extension", MODEL_CONFIGURATION]
    client = make_client(server.url, "http")
    try:
        with pytest.raises(TargetError, match="config: HTTP 404") as refused:
            await client.model_config("addone")
        assert not isinstance(refused.value, MissingExtension)
    finally:
        await client.close()


async def test_grpc_modelconfig_unimplemented_is_a_missing_extension_and_state_ready_reads_as_ready(
    mlserver_grpc: str,
) -> None:
    client = make_client(mlserver_grpc, "grpc")
    try:
        with pytest.raises(MissingExtension, match="ModelConfig .*UNIMPLEMENTED") as missing:
            await client.model_config("addone")
        assert missing.value.extension == MODEL_CONFIGURATION
        assert await client.repository_index() == [{"name": "addone", "state": "READY"}]
    finally:
        await client.close()


async def test_a_fleet_without_model_configuration_says_so_as_one_endpoint_does(serve: Any) -> None:
    urls = [serve({"addone": (metadata("addone"), True)}).url for _ in range(2)]
    fleet = FleetClient([make_client(url, "http") for url in urls])
    try:
        with pytest.raises(MissingExtension) as missing:
            await fleet.model_config("addone")
        assert missing.value.extension == MODEL_CONFIGURATION and all(url in str(missing.value) for url in urls)
    finally:
        await fleet.close()


# --- requests from the metadata alone ----------------------------------------------------------------------


def test_without_a_config_a_leading_minus_one_is_the_batch_dimension() -> None:
    (request,) = build_requests(metadata("m"), None, model="m", batch_size=4)
    assert request.inputs[0].shape == [4, 16]
    (request,) = build_requests(metadata("m", [3, 16]), None, model="m")  # no leading -1: as given
    assert request.inputs[0].shape == [3, 16]
    with pytest.raises(PerfkitError, match="no batch dimension .* -b must be 1"):
        build_requests(metadata("m", [3, 16]), None, model="m", batch_size=2)
    with pytest.raises(PerfkitError, match="--shape INPUT0:D1"):  # a -1 past the batch: --shape, as before
        build_requests(metadata("m", [-1, -1]), None, model="m")
    (request,) = build_requests(metadata("m", [-1, -1]), None, model="m", batch_size=2, shapes={"INPUT0": [5]})
    assert request.inputs[0].shape == [2, 5]


# --- probe -------------------------------------------------------------------------------------------------


def test_probe_of_kserve_over_http_notes_the_missing_config_once(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve({"addone": (metadata("addone"), True), "addtwo": (metadata("addtwo"), True)})
    assert main(["probe", "-u", server.url, "-n", "2"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.count(NOTE) == 1, out  # once for the server, not once a model
    assert "batching, sequence batching and ensemble steps are unknown" in out
    assert "addone" in out and "addtwo" in out and "INPUT0[1, 16]" in out
    assert server.inferred == [[[1, 16]]] * 4


async def test_probe_of_mlserver_over_grpc_reads_state_ready(mlserver_grpc: str) -> None:
    result = await probe(mlserver_grpc, [], count=2, protocol="grpc")
    assert result.ok and [m.model for m in result.models] == ["addone"]
    (note,) = result.notes
    assert NOTE in note and "UNIMPLEMENTED" in note


def test_probe_says_what_it_found_when_no_model_is_ready(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = serve({"addone": (metadata("addone"), False)})
    assert main(["probe", "-u", server.url]) == ExitCode.FAILED
    assert "has no ready model to probe: it lists addone (UNAVAILABLE)" in capsys.readouterr().err


@pytest.mark.parametrize("listed", [True, False], ids=["index", "no index"])
def test_probe_and_sweep_of_a_model_the_server_lacks_is_a_usage_error(
    serve: Any, listed: bool, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = serve({"addone": (metadata("addone"), True)}, listed=listed)
    assert main(["probe", "-u", server.url, "-m", "nosuch"]) == ExitCode.USAGE
    assert "-m nosuch: the server at" in capsys.readouterr().err
    assert main(["sweep", "-u", server.url, "-m", "nosuch", "--report-dir", str(tmp_path)]) == ExitCode.USAGE
    assert "has no model 'nosuch'" in capsys.readouterr().err


# --- sweep and tune ----------------------------------------------------------------------------------------


def test_sweep_builds_from_the_metadata_notes_it_once_and_keeps_it_in_the_result(
    serve: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = serve({"addone": (metadata("addone"), True)})
    flags = ["-p", "100", "-r", "3", "-s", "100", "--concurrency-range", "1", "--no-report"]
    code = main(["sweep", "-u", server.url, "-m", "addone", "-b", "2", *flags, "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code in (ExitCode.OK, ExitCode.UNSTABLE), err  # measured; stability is the machine's business
    assert err.count(NOTE) == 1, err
    assert {tuple(map(tuple, shapes)) for shapes in server.inferred} == {((2, 16),)}
    (path,) = tmp_path.glob("sweep-*.json")
    assert read_sweep(path).provenance["server"]["model_config"] is False


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["--sequence-length", "4"],
            "--sequence-length, --sequence-id-range, --num-of-sequences, ...) and sequence streams in --input-data",
        ),
        (["--bls-composing-models", "a"], "--bls-composing-models"),
    ],
)
def test_sweep_flags_that_need_the_config_are_refused_naming_the_extension(
    serve: Any, flags: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = serve({"addone": (metadata("addone"), True)})
    assert main(["sweep", "-u", server.url, "-m", "addone", *flags, "--report-dir", str(tmp_path)]) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert f"{named}: the model configuration is needed, and {server.url} has no {MODEL_CONFIGURATION}" in err, err
    assert not list(tmp_path.iterdir())  # nothing measured


def test_tune_refuses_a_server_without_model_configuration(
    serve: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = serve({"addone": (metadata("addone"), True)})
    folder = tmp_path / "addone"
    folder.mkdir()
    (folder / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n')
    code = main(["tune", "-u", server.url, str(folder / "config.pbtxt"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED, err
    assert f"perfkit tune: the model configuration is needed, and {server.url} has no {MODEL_CONFIGURATION}" in err
    assert "measure this server with perfkit sweep" in err, err


def test_missing_extension_survives_pickling() -> None:
    copy = pickle.loads(pickle.dumps(MissingExtension("GET x: HTTP 404", MODEL_CONFIGURATION)))
    assert (
        isinstance(copy, MissingExtension) and copy.extension == MODEL_CONFIGURATION and str(copy) == "GET x: HTTP 404"
    )


def test_a_reply_whose_outputs_have_null_parameters_is_well_framed() -> None:
    outputs = [{"name": "A", "datatype": "FP32", "shape": [1], "parameters": None},
               {"name": "B", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]  # fmt: skip
    header = json.dumps({"outputs": outputs}).encode()
    assert body_framing_ok(header + bytes(4), str(len(header)))
    assert not body_framing_ok(header + bytes(3), str(len(header)))


def test_an_outcome_pickles_compiled_or_not() -> None:
    outcome = Outcome("HTTP 503", 10, 1, 2, "busy", (5, 6), (1, 2, 3, 4, 5), "text")
    assert pickle.loads(pickle.dumps(outcome)) == outcome


def test_a_repeated_reply_head_is_parsed_once_and_a_changed_one_again() -> None:
    framing = ReplyFraming()
    header = json.dumps({"outputs": [{"name": "A", "parameters": {"binary_data_size": 4}}]}).encode()
    length = str(len(header)).encode()
    assert framing.ok(header + bytes(4), length) and framing.ok(header + b"\x01" * 4, length)
    assert framing.parses == 1  # the second reply: same head and length, no JSON parse
    assert not framing.ok(header + bytes(5), length)  # same head, a byte too many
    assert not framing.ok(header.replace(b"4", b"5") + bytes(4), length)  # its head says 5
    assert framing.ok(b'{"outputs": []}', None) and framing.ok(b'{"outputs": []}', None)
    assert framing.parses == 5  # JSON replies are parsed every time


async def test_sweep_without_m_says_what_the_server_lists_when_no_model_is_ready() -> None:
    class Index:
        async def repository_index(self) -> list[dict[str, str]]:
            return [{"name": "a", "state": "UNAVAILABLE", "reason": "load failed"}, {"name": "b", "state": "LOADING"}]

    spec = spec_from_args(build_parser().parse_args(["sweep", "-u", "h:1"]))
    with pytest.raises(TargetError, match=r"no ready model: it lists a \(UNAVAILABLE: load failed\), b \(LOADING\)"):
        await resolve_model(Index(), spec, embedded=False)  # type: ignore[arg-type]
