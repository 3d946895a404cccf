"""Security: loopback by default, bearer-token authentication on every HTTP and gRPC endpoint but the
health probes, TLS on both front ends, and no secret in logs or reports.

Certificates come from `trustme` (a throwaway CA per test session, nothing on disk outside tmp).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import trustme
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from perfkit.cli import COMMANDS, build_parser, main
from perfkit.cli.tune import spec_from_args
from perfkit.errors import TargetError
from perfkit.results.provenance import provenance
from perfkit.sweep.spec import LoadSpec, SweepSpec
from perfkit.target import ServerProcess, TargetSpec, TlsSpec, reference_server_process
from perfkit.tune.distributed import EndpointActor
from perfkit.tune.state import read_model
from reference_server.config import ServerConfig, config_from_args
from reference_server.errors import ServerError
from reference_server.frontends.auth import Token, Unauthenticated
from reference_server.server import ReferenceServer, running_server
from tests.fuzz.wire import RawHttp
from tests.servers import loopback_config

pytestmark = pytest.mark.integration

TOKEN = "pk-test-7f3a9c1e5b2d4f60-secret"
BEARER = {"Authorization": f"Bearer {TOKEN}".encode()}
INFER = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
SWEEP = ["-m", "identity", "--shape", "INPUT0:8", "--concurrency-range", "1", "-p", "100", "-r", "3"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    leaf.private_key_pem.write_to_path(str(paths["key"]))
    with paths["cert"].open("wb") as chain:
        for blob in leaf.cert_chain_pems:
            chain.write(blob.bytes())
    other = trustme.CA()  # a CA the server's certificate does not come from
    paths["other_ca"] = folder / "other_ca.pem"
    other.cert_pem.write_to_path(str(paths["other_ca"]))
    return paths


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def auth_server(demo_repository: Path) -> Iterator[ReferenceServer]:
    config = loopback_config(demo_repository, auth_token=TOKEN)
    with running_server(config) as server:
        yield server


# --- binding -----------------------------------------------------------------------------------------


def test_the_server_listens_on_loopback_only_by_default(demo_repository: Path) -> None:
    assert ServerConfig(model_repository=demo_repository).host == "127.0.0.1"
    assert config_from_args(["--model-repository", str(demo_repository)]).host == "127.0.0.1"
    config = ServerConfig(model_repository=demo_repository, http_port=0, grpc_port=0, metrics_port=0)
    with running_server(config) as server:
        ports = {server.http_port, server.grpc_port, server.metrics_port}
        listening = [
            c
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports
        ]
        assert {c.laddr.port for c in listening} == ports
        # gRPC listens on an IPv6 socket for the v4-mapped ::ffff:127.0.0.1: loopback all the same.
        assert all(_loopback(c.laddr.ip) for c in listening), listening


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


# --- authentication ----------------------------------------------------------------------------------

PROTECTED_HTTP = [
    ("GET", b"/v2"),
    ("GET", b"/v2/models/identity"),
    ("GET", b"/v2/models/identity/ready"),
    ("GET", b"/v2/models/identity/config"),
    ("GET", b"/v2/models/identity/versions/1/stats"),
    ("GET", b"/v2/models/stats"),
    ("POST", b"/v2/models/identity/infer"),
    ("POST", b"/v2/repository/index"),
    ("POST", b"/v2/repository/models/identity/load"),
    ("POST", b"/v2/repository/models/identity/unload"),
    ("GET", b"/v2/health/live/../../models/identity/config"),
    ("GET", b"/v2/health%2flive"),
    ("GET", b"/no/such/route"),
]


def test_every_http_route_but_health_wants_the_token(auth_server: ReferenceServer) -> None:
    assert auth_server.http_port is not None
    http = RawHttp(auth_server.http_port)
    for path in (b"/v2/health/live", b"/v2/health/ready"):
        assert http.request("GET", path)[0] == 200, path
    wrong = [
        {},
        {"Authorization": b"Bearer wrong"},
        {"Authorization": b"Basic " + TOKEN.encode()},
        {"Authorization": b"Bearer " + TOKEN.encode() + b"x"},
        {"Authorization": b"Bearer " + TOKEN[:-1].encode()},
        {"Authorization": b"Bearer"},
        {"Authorization": b"Bearer \xff\xfe"},
    ]
    for method, path in PROTECTED_HTTP:
        for headers in wrong:
            status, response_headers, body = http.request(method, path, INFER.encode(), headers)
            assert status == 401, (method, path, headers, status, body)
            assert response_headers["www-authenticate"].startswith("Bearer")
            message = json.loads(body)["error"]
            assert "authentic" in message and TOKEN not in message
    status, _, body = http.request("POST", b"/v2/models/identity/infer", INFER.encode(), BEARER)
    assert status == 200, body
    lower = {"authorization": f"bearer   {TOKEN}".encode()}  # scheme case and spacing as RFC 6750 allows
    assert http.request("GET", b"/v2/models/identity/config", b"", lower)[0] == 200
    http.close()


def test_the_openai_routes_want_the_token_and_say_so_in_openai_s_shape(auth_server: ReferenceServer) -> None:
    assert auth_server.http_port is not None
    http = RawHttp(auth_server.http_port)
    for method, path in (("GET", b"/v1/models"), ("POST", b"/v1/completions"), ("GET", b"/v1/unknown")):
        status, headers, body = http.request(method, path, b"{}", {"Authorization": b"Bearer wrong"})
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        error = json.loads(body)["error"]
        assert error["code"] == "invalid_api_key" and "authentic" in error["message"] and TOKEN not in body.decode()
    assert http.request("GET", b"/v1/models", b"", BEARER)[0] == 200
    http.close()


def _grpc_calls() -> list[tuple[str, Any]]:
    infer = pb.ModelInferRequest(model_name="identity")
    infer.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    infer.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    return [
        ("ServerMetadata", pb.ServerMetadataRequest()),
        ("ModelReady", pb.ModelReadyRequest(name="identity")),
        ("ModelMetadata", pb.ModelMetadataRequest(name="identity")),
        ("ModelConfig", pb.ModelConfigRequest(name="identity")),
        ("ModelStatistics", pb.ModelStatisticsRequest()),
        ("ModelInfer", infer),
        ("RepositoryIndex", pb.RepositoryIndexRequest()),
        ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="identity")),
        ("TraceSetting", pb.TraceSettingRequest()),
    ]


def test_every_grpc_method_but_health_wants_the_token(auth_server: ReferenceServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{auth_server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        for metadata in [None, (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)]:
            for method, request in _grpc_calls():
                with pytest.raises(grpc.RpcError) as caught:
                    getattr(stub, method)(request, timeout=10, metadata=metadata)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, caught.value)
                assert TOKEN not in (caught.value.details() or "")
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.ModelStreamInfer(iter([_grpc_calls()[5][1]]), timeout=10, metadata=metadata))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", f"Bearer {TOKEN}"),)
        reply = stub.ModelInfer(_grpc_calls()[5][1], timeout=10, metadata=good)
        assert list(reply.outputs[0].shape) == [1, 4]
        (answer,) = stub.ModelStreamInfer(iter([_grpc_calls()[5][1]]), timeout=10, metadata=good)
        assert not answer.error_message


def test_the_token_is_compared_in_constant_time_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr("reference_server.frontends.auth.hmac.compare_digest", spy)
    token = Token(TOKEN)
    token.check(f"Bearer {TOKEN}")
    with pytest.raises(Unauthenticated):
        token.check("Bearer nope")
    assert len(calls) == 2
    assert TOKEN not in repr(token)
    config = ServerConfig(model_repository=Path("."), auth_token=TOKEN)
    assert TOKEN not in repr(config) and TOKEN not in str(config)
    for bad in ("", " padded", "line\nbreak"):
        with pytest.raises(ServerError):
            Token(bad)


def test_the_token_file_and_its_errors(
    demo_repository: Path, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_from_args(["--model-repository", str(demo_repository), "--auth-token-file", str(token_file)])
    assert config.auth_token == TOKEN
    for args in (
        ["--auth-token-file", str(token_file.parent / "missing")],
        ["--auth-token", "x", "--auth-token-file", str(token_file)],
    ):
        with pytest.raises(SystemExit):
            config_from_args(["--model-repository", str(demo_repository), *args])
    assert TOKEN not in capsys.readouterr().err


# --- TLS ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(demo_repository: Path, pki: dict[str, Path]) -> Iterator[ReferenceServer]:
    config = loopback_config(demo_repository, ssl_certfile=pki["cert"], ssl_keyfile=pki["key"])
    with running_server(config) as server:
        yield server


def test_https_and_grpc_tls_serve_clients_that_trust_the_ca(tls_server: ReferenceServer, pki: dict[str, Path]) -> None:
    import http.client

    context = ssl.create_default_context(cafile=str(pki["ca"]))
    conn = http.client.HTTPSConnection("127.0.0.1", tls_server.http_port, context=context, timeout=10)
    conn.request("POST", "/v2/models/identity/infer", body=INFER)
    assert conn.getresponse().status == 200
    conn.close()
    # A client that does not trust the CA, and one that speaks plain HTTP, get nowhere.
    with pytest.raises(ssl.SSLCertVerificationError):
        conn = http.client.HTTPSConnection(
            "127.0.0.1", tls_server.http_port, context=ssl.create_default_context(), timeout=10
        )
        conn.request("GET", "/v2/health/live")
    conn.close()
    plain = RawHttp(int(tls_server.http_port or 0), timeout_s=10)
    with pytest.raises((EOFError, ConnectionError)):
        plain.request("GET", b"/v2/health/live")
    plain.close()
    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{tls_server.grpc_port}", credentials) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    with grpc.insecure_channel(f"127.0.0.1:{tls_server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_bad_certificate_or_key_stops_the_start_naming_the_flags(demo_repository: Path, pki: dict[str, Path]) -> None:
    with pytest.raises(ServerError, match="--ssl-certfile"):
        ServerConfig(model_repository=demo_repository, ssl_certfile=pki["cert"]).validate()
    with pytest.raises(ServerError, match="--ssl-certfile .* cannot use them"):
        with running_server(
            ServerConfig(model_repository=demo_repository, ssl_certfile=pki["ca"], ssl_keyfile=pki["key"], http_port=0)
        ):
            pass


def test_make_client_tls_options(tls_server: ReferenceServer, pki: dict[str, Path]) -> None:
    import asyncio

    from perfkit.wire.client import make_client

    async def live(url: str, protocol: str, tls: TlsSpec) -> bool:
        client = make_client(url, protocol, tls=tls, request_timeout_s=10)
        try:
            return await client.live()
        finally:
            await client.close()

    https = f"https://127.0.0.1:{tls_server.http_port}"
    grpcs = f"127.0.0.1:{tls_server.grpc_port}"
    assert asyncio.run(live(https, "http", TlsSpec(https_ca_certs=pki["ca"])))
    assert asyncio.run(live(https, "http", TlsSpec(https_verify_peer=False)))
    assert asyncio.run(live(grpcs, "grpc", TlsSpec(grpc_use_ssl=True, grpc_root_certs=pki["ca"])))
    for url, protocol, tls in (
        (https, "http", TlsSpec(https_ca_certs=pki["other_ca"])),
        (grpcs, "grpc", TlsSpec(grpc_use_ssl=True, grpc_root_certs=pki["other_ca"])),
    ):
        with pytest.raises(Exception, match="cannot reach|UNAVAILABLE|certificate"):
            asyncio.run(live(url, protocol, tls))


# --- end to end: a TLS + token server in its own process, perfkit sweep against it -------------------


@pytest.fixture(scope="module")
def locked_server(demo_repository: Path, pki: dict[str, Path], token_file: Path) -> Iterator[ServerProcess]:
    args = ["--ssl-certfile", str(pki["cert"]), "--ssl-keyfile", str(pki["key"])]
    args += ["--auth-token-file", str(token_file), "--log-verbose", "2"]
    with reference_server_process(demo_repository, args) as server:
        yield server


def _sweep(report_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "perfkit", "sweep", *SWEEP, "--report-dir", str(report_dir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_perfkit_sweeps_a_tls_token_server_and_no_secret_is_logged_or_written(
    locked_server: ServerProcess, pki: dict[str, Path], tmp_path: Path
) -> None:
    header = ["-H", f"Authorization: Bearer {TOKEN}"]
    https = _sweep(
        tmp_path / "https",
        "-u",
        f"https://{locked_server.http_url}",
        "--ssl-https-ca-certificates-file",
        str(pki["ca"]),
        *header,
    )
    assert https.returncode in (0, 3), https.stderr  # 3: a level did not stabilise in 3 short windows
    grpcs = _sweep(
        tmp_path / "grpcs", "-u", locked_server.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl",
        "--ssl-grpc-root-certifications-file", str(pki["ca"]), f"-HAuthorization: Bearer {TOKEN}",
    )  # fmt: skip
    assert grpcs.returncode in (0, 3), grpcs.stderr
    for run in (https, grpcs):
        assert TOKEN not in run.stdout + run.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) >= 6
    for path in written:
        assert TOKEN not in path.read_text(errors="replace"), path
    result = json.loads(next((tmp_path / "https").glob("*.json")).read_text())
    assert "Authorization: ***" in result["provenance"]["argv"]
    assert result["levels"][0]["ok_count"] > 0 and not result["levels"][0]["errors"]
    # Without the token the sweep fails, says why, and exits non-zero.
    refused = _sweep(
        tmp_path / "refused",
        "-u",
        f"https://{locked_server.http_url}",
        "--ssl-https-ca-certificates-file",
        str(pki["ca"]),
    )
    assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr
    # At --log-verbose 2 the server logged every request, and never the token.
    time.sleep(0.2)
    log = locked_server.log_path.read_text(errors="replace")
    assert "POST /v2/models/identity/infer" in log  # the access log of the HTTPS sweep
    assert TOKEN not in log
    assert TOKEN not in " ".join(psutil.Process(locked_server.process.pid).cmdline())  # the file, not the flag


def test_provenance_redacts_credential_headers() -> None:
    spec = SweepSpec(
        target=TargetSpec(url="h:1", headers=(("Authorization", f"Bearer {TOKEN}"), ("X-Trace", "visible"))),
        load=LoadSpec("concurrency"),
    )
    argv = ["sweep", "-H", f"Authorization: Bearer {TOKEN}", f"-HX-Api-Key: {TOKEN}", f"--header=Cookie: s={TOKEN}"]
    argv += ["-H", "X-Trace: visible"]
    record = provenance(spec, seed=spec.inputs.seed, server={"url": "h:1", "embedded": False}, argv=argv)
    text = json.dumps(record)
    assert TOKEN not in text
    assert "X-Trace: visible" in record["argv"] and ["X-Trace", "visible"] in record["spec"]["target"]["headers"]


# --- perfkit probe and tune: the sweep's -H and TLS flags --------------------------------------------

CONNECTION_FLAGS = ("--header", "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file",
                    "--ssl-grpc-private-key-file", "--ssl-grpc-certificate-chain-file",
                    "--ssl-https-ca-certificates-file", "--ssl-https-verify-peer", "--ssl-https-verify-host",
                    "--ssl-https-client-certificate-file", "--ssl-https-private-key-file",
                    "--ssl-https-client-certificate-type", "--ssl-https-private-key-type")  # fmt: skip


def test_probe_and_tune_take_the_sweeps_connection_flags() -> None:
    def flags(command: str) -> dict[str, tuple[Any, ...]]:
        parser = COMMANDS[command].parser()
        assert parser is not None
        return {  # sweep's --ssl-grpc-use-ssl also takes the 'true' perf_analyzer scripts write after it
            a.option_strings[-1]: (tuple(a.option_strings), a.help, a.type, a.choices, a.default, a.metavar)
            if a.option_strings[-1] != "--ssl-grpc-use-ssl" else tuple(a.option_strings)
            for a in parser._actions
            if a.option_strings and a.option_strings[-1] in CONNECTION_FLAGS
        }  # fmt: skip

    sweep = flags("sweep")
    assert set(sweep) == set(CONNECTION_FLAGS)
    assert flags("probe") == sweep and flags("tune") == sweep
    assert build_parser().parse_args(["probe", "-H", "A: b", "-H", "C: d"]).header == ["A: b", "C: d"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-H", "Authorization"], "-H 'Authorization' must look like 'Name: value'"),
        (["--ssl-grpc-use-ssl"], "--ssl-grpc-use-ssl needs -u"),
        (["-u", "127.0.0.1:9", "--ssl-https-verify-peer", "0"], "--ssl-https-* options apply to an HTTPS server"),
        (["-u", "127.0.0.1:9", "-i", "grpc", "--ssl-grpc-root-certifications-file", "ca.pem"],
         "--ssl-grpc-root-certifications-file needs --ssl-grpc-use-ssl"),
        (["-u", "https://127.0.0.1:9", "--ssl-https-ca-certificates-file", "missing.pem"],
         "--ssl-https-ca-certificates-file missing.pem: no such file"),
    ],
)  # fmt: skip
def test_probe_and_tune_check_the_connection_flags_as_sweep_does(
    args: list[str], message: str, demo_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", *args]) == 2
    assert message in capsys.readouterr().err
    assert main(["tune", str(demo_repository / "identity" / "config.pbtxt"), *args]) == 2
    assert message in capsys.readouterr().err


def test_perfkit_probe_sends_the_token(auth_server: ReferenceServer, capsys: pytest.CaptureFixture[str]) -> None:
    probe = ["probe", "-u", auth_server.http_url, "-m", "identity", "-n", "3"]
    assert main([*probe, "-H", f"Authorization: Bearer {TOKEN}"]) == 0
    out, err = capsys.readouterr()
    assert any(line.startswith("identity") and "3/3" in line for line in out.splitlines()), out + err
    assert main(["probe", "-u", f"127.0.0.1:{auth_server.grpc_port}", "-i", "grpc", "-m", "identity", "-n", "3",
                 f"-HAuthorization: Bearer {TOKEN}"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert "3/3" in out, out + err
    # Without it: exit 1, the server's reason, and the flag to add; the token is never shown.
    assert main(probe) == 1
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and "HTTP 401" in err and "-H 'Authorization: Bearer TOKEN'" in err, err
    assert TOKEN not in out + err


def test_perfkit_probe_over_tls(
    tls_server: ReferenceServer, pki: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    https = ["probe", "-u", f"https://{tls_server.http_url}", "-m", "identity", "-n", "3"]
    assert main([*https, "--ssl-https-ca-certificates-file", str(pki["ca"])]) == 0
    assert "3/3" in capsys.readouterr().out
    assert main(["probe", "-u", f"127.0.0.1:{tls_server.grpc_port}", "-i", "grpc", "-m", "identity", "-n", "3",
                 "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(pki["ca"])]) == 0  # fmt: skip
    assert "3/3" in capsys.readouterr().out
    assert main([*https, "--ssl-https-ca-certificates-file", str(pki["other_ca"])]) == 1
    assert "certificate" in capsys.readouterr().err


@pytest.fixture(scope="module")
def locked_explicit_server(demo_repository: Path, pki: dict[str, Path]) -> Iterator[ReferenceServer]:
    """TLS and a token, in explicit model control: a server perfkit tune can load variants on."""
    config = loopback_config(demo_repository, load=("identity",), auth_token=TOKEN, ssl_certfile=pki["cert"],
                             ssl_keyfile=pki["key"])  # fmt: skip
    with running_server(config) as server:
        yield server


# As small as the tunes of tests/integration/test_tune.py: the identity model's default and one variant, at
# concurrency 1, not re-measured.
TUNE = ["--shape", "INPUT0:8", "--max-instance-count", "1", "--min-batch-size", "8", "--max-batch-size", "8",
        "--concurrency-range", "1:1", "--remeasure", "0", "-p", "100", "-s", "50", "-r", "3",
        "--warmup-request-count", "10", "--quiet"]  # fmt: skip


def test_perfkit_tune_over_tls_with_the_token_writes_no_secret(
    locked_explicit_server: ReferenceServer,
    demo_repository: Path,
    pki: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(demo_repository / "identity" / "config.pbtxt")
    https = ["-u", f"https://{locked_explicit_server.http_url}", "--ssl-https-ca-certificates-file", str(pki["ca"])]
    out = tmp_path / "out"
    code = main(["tune", config, *https, "-H", f"Authorization: Bearer {TOKEN}", *TUNE, "-o", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    doc = json.loads((out / "tune.json").read_text())
    assert doc["best"] is not None and all(v["status"] == "ok" for v in doc["variants"]), doc["variants"]
    assert "Authorization: ***" in doc["argv"]
    written = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"tune.json", "results.csv", "summary.txt", "report.html", "checkpoint.json"}
    for path in written:
        assert TOKEN not in path.read_text(errors="replace"), path
    assert TOKEN not in printed.out + printed.err
    # Without the token: refused before anything is measured or written, naming -H.
    refused = tmp_path / "refused"
    assert main(["tune", config, *https, *TUNE, "-o", str(refused)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "HTTP 401" in err and "-H 'Authorization: Bearer TOKEN'" in err, err
    assert not refused.exists()


def test_tune_ray_actors_open_their_endpoint_with_the_credentials(
    locked_explicit_server: ReferenceServer, demo_repository: Path, pki: dict[str, Path]
) -> None:
    """The class each Ray actor runs, here in-process: its client gets -u's TLS and -H."""
    url = f"https://{locked_explicit_server.http_url}"
    config = demo_repository / "identity" / "config.pbtxt"
    tls = ["--ssl-https-ca-certificates-file", str(pki["ca"])]

    async def open_close(*flags: str) -> dict[str, Any] | None:
        spec = spec_from_args(build_parser().parse_args(["tune", str(config), "-u", url, *tls, *TUNE, *flags]))
        actor = EndpointActor(spec, read_model(config), url)
        try:
            return (await actor.open()).config
        finally:
            await actor.close(restore=False, config=None)

    served = asyncio.run(open_close("-H", f"Authorization: Bearer {TOKEN}"))
    assert served is not None and served["name"] == "identity"
    with pytest.raises(TargetError, match="HTTP 401.*-H 'Authorization"):
        asyncio.run(open_close())
