"""Every flag perf_analyzer lists is taken by `perfkit sweep`: as its own, read as its own (the
deprecated -t, -c, -d, -z, --data-directory), accepted with one note, or refused with the reason in
the sweep's usage, never argparse's "unrecognized arguments". perf_analyzer's flag list comes from a
copy of its --help (perf_analyzer 2.48, beside this file), so that this runs without it. Then what
the flags that map do: the load, the input data, JSON outputs, compressed gRPC messages and client
certificates."""

from __future__ import annotations

import asyncio
import gzip
import re
import ssl
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trustme
from tritonclient.grpc import service_pb2 as pb

from perfkit.cli import main, sweep
from perfkit.cli.sweep.perf_analyzer import PERF_ANALYZER_FLAGS, perf_analyzer_notes
from perfkit.errors import PerfkitError
from perfkit.load.inputs import build_requests, has_streams
from perfkit.load.validation import read_validation_data
from perfkit.sweep.spec import SweepSpec
from perfkit.target import TlsSpec
from perfkit.wire.grpc import channel as grpc_channel
from tests.unit.test_grpc_server import Servicer, start

HELP = Path(__file__).with_name("perf_analyzer_help.txt")


def help_flags() -> set[str]:
    """The flags perf_analyzer's --help names: each line's leading flag, and aliases in parentheses."""
    flags: set[str] = set()
    for line in HELP.read_text().splitlines():
        if lead := re.match(r"\s*(-{1,2}[a-zA-Z][\w-]*)", line):
            flags.add(lead.group(1))
        flags.update(re.findall(r"\((-[a-zA-Z])\)", line))
    return flags


def _sample(flag: str, tmp: Path) -> list[str]:
    """A command line that gives `flag` a value perf_analyzer would take, with what it needs beside."""
    pem = str(tmp / "x.pem")
    values = {
        "-m": ["m"], "-x": ["1"], "--bls-composing-models": ["a:1,b"], "--endpoint": ["/v2/x"], "-p": ["500"],
        "--measurement-interval": ["500"], "--measurement-mode": ["count_windows"],
        "--measurement-request-count": ["20"], "--concurrency-range": ["1:2"], "--request-parameter": ["k:1:int"],
        "--request-rate-range": ["5"], "--request-distribution": ["constant"], "--num-of-sequences": ["2"],
        "--binary-search": ["--concurrency-range", "1:4", "-l", "10"], "-l": ["10"], "--latency-threshold": ["10"], "-s": ["5"], "--stability-percentage": ["5"], "-r": ["3"],
        "--max-trials": ["3"], "--percentile": ["95"], "--request-count": ["10"], "-b": ["2"],
        "--input-data": ["zero"], "--shared-memory": ["system"], "--output-shared-memory-size": ["1024"],
        "--shape": ["X:1,2"], "--sequence-length": ["4"], "--sequence-length-variation": ["0"],
        "--sequence-id-range": ["1:9"], "--string-length": ["4"], "--string-data": ["ab"],
        "--input-tensor-format": ["json"], "--output-tensor-format": ["json"], "-u": ["h:1"], "-i": ["http"],
        "-f": [str(tmp / "o.csv")], "--profile-export-file": [str(tmp / "o.json")], "-H": ["A: b"],
        "--metrics-url": ["h:2", "--collect-metrics"], "--metrics-interval": ["500", "--collect-metrics"],
        "--service-kind": ["triton"], "--max-threads": ["4"], "--model-signature-name": ["serving_default"],
        "--triton-server-directory": ["/opt/tritonserver"], "--model-repository": ["/models"],
        "--trace-level": ["TIMESTAMPS"], "--trace-rate": ["100"], "--trace-count": ["-1"], "--log-frequency": ["0"],
        "-t": ["2"], "-c": ["4", "-d", "-l", "5"], "-d": ["-c", "4"], "--data-directory": [str(tmp)],
        "--request-intervals": [str(tmp / "intervals.txt")], "--periodic-concurrency-range": ["1:4:1"],
        "--request-period": ["5"], "--streaming": ["-i", "grpc"], "--grpc-compression-algorithm": ["gzip", "-i", "grpc"],
        "--ssl-grpc-use-ssl": ["-i", "grpc"], "--ssl-grpc-root-certifications-file": [pem, "-i", "grpc", "--ssl-grpc-use-ssl"],
        "--ssl-grpc-private-key-file": [pem, "--ssl-grpc-certificate-chain-file", pem, "-i", "grpc", "--ssl-grpc-use-ssl"],
        "--ssl-grpc-certificate-chain-file": [pem, "--ssl-grpc-private-key-file", pem, "-i", "grpc", "--ssl-grpc-use-ssl"],
        "--ssl-https-verify-peer": ["0"], "--ssl-https-verify-host": ["0"], "--ssl-https-ca-certificates-file": [pem],
        "--ssl-https-client-certificate-file": [pem], "--ssl-https-client-certificate-type": ["PEM"],
        "--ssl-https-private-key-file": [pem, "--ssl-https-client-certificate-file", pem],
        "--ssl-https-private-key-type": ["PEM"],
    }  # fmt: skip
    https = ["-u", "https://h:1"] if flag.startswith("--ssl-https") else []
    grpc = ["-u", "h:1"] if flag.startswith("--ssl-grpc") else []
    return [flag, *values.get(flag, []), *https, *grpc]


def test_every_flag_perf_analyzer_lists_is_in_the_table() -> None:
    flags = help_flags()
    assert len(flags) > 70 and {"-t", "--data-directory", "--trace-level", "--ssl-https-verify-host"} <= flags
    assert sorted(flags - set(PERF_ANALYZER_FLAGS)) == []
    assert {kind for kind, _ in PERF_ANALYZER_FLAGS.values()} == {"own", "mapped", "ignored", "refused"}


def test_every_flag_in_the_table_runs_or_is_refused_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.pem").write_text("")
    (tmp_path / "intervals.txt").write_text("1000\n")
    parser = sweep.COMMAND.parser()
    for flag, (kind, why) in PERF_ANALYZER_FLAGS.items():
        argv = _sample(flag, tmp_path)
        if flag == "--version":
            with pytest.raises(SystemExit) as done:
                parser.parse_args(argv)
            assert done.value.code == 0 and capsys.readouterr().out.startswith("perfkit "), flag
        elif kind == "refused":
            with pytest.raises(SystemExit) as done:
                main(["sweep", *argv])
            err = capsys.readouterr().err
            assert done.value.code == 2 and err.startswith("usage: perfkit sweep "), (flag, err)
            assert f"argument {flag}: not supported" in err and "unrecognized" not in err, (flag, err)
        else:
            args, unknown = parser.parse_known_args(argv)
            assert unknown == [], (flag, unknown)
            sweep.spec_from_args(args)  # the spec takes it
            notes = " ".join(perf_analyzer_notes(args))
            assert (flag in notes and why.split(":")[0] in notes) if kind == "ignored" else "ignored" not in notes, flag


# --------------------------------------------------------------------------------------------------
# What the deprecated flags are read as


def _spec(*flags: str) -> SweepSpec:
    return sweep.spec_from_args(sweep.COMMAND.parser().parse_args(list(flags)))


def _notes(*flags: str) -> list[str]:
    return perf_analyzer_notes(sweep.COMMAND.parser().parse_args(list(flags)))


def test_t_c_and_d_are_read_as_a_concurrency_range_as_perf_analyzer_reads_them() -> None:
    def levels(*flags: str) -> tuple[float, float, float]:
        load = _spec(*flags).load
        return load.start, load.end, load.step

    assert levels("-t", "4") == levels("--concurrency-range", "4")
    assert levels("-d", "-c", "8") == levels("--concurrency-range", "1:8:1")
    assert levels("-d", "-t", "2", "-c", "6") == levels("--concurrency-range", "2:6:1")
    assert levels("-d", "-l", "5") == levels("--concurrency-range", "1:0:1", "-l", "5")  # up to -l
    assert levels("-c", "8") == levels()  # without -d, perf_analyzer ignores -c
    assert _notes("-d", "-t", "2", "-c", "6") == [
        "note: -t, -c, -d read as --concurrency-range 2:6:1: deprecated in perf_analyzer too"
    ]
    assert _notes("-c", "8")[-1].startswith("note: -c ignored: ")
    for other in (["--concurrency-range", "2"], ["--request-rate-range", "5"]):
        with pytest.raises(PerfkitError, match=f"deprecated concurrency flags: give them or {other[0]}, not both"):
            _spec("-t", "4", *other)


def test_z_and_data_directory_are_read_as_input_data(tmp_path: Path) -> None:
    assert _spec("-z").inputs.input_data == "zero" == _spec("-z", "--input-data", "zero").inputs.input_data
    assert _spec("--data-directory", str(tmp_path)).inputs.input_data == str(tmp_path)
    assert _notes("-z") == ["note: -z read as --input-data zero: it is deprecated in perf_analyzer too"]
    for flags in (["-z", "--data-directory", str(tmp_path)], ["--data-directory", str(tmp_path), "--input-data", "random.json"]):
        with pytest.raises(PerfkitError, match="both say what to send: give one"):
            _spec(*flags)
    with pytest.raises(PerfkitError, match="not a directory"):
        _spec("--data-directory", str(tmp_path / "none"))


def test_a_data_directory_holds_one_file_per_input(tmp_path: Path) -> None:
    meta = {"name": "m", "inputs": [{"name": "X", "datatype": "INT32", "shape": [-1, 3]},
                                    {"name": "S", "datatype": "BYTES", "shape": [-1, 2]}], "outputs": []}  # fmt: skip
    (tmp_path / "X").write_bytes(np.array([1, 2, 3], "<i4").tobytes())
    (tmp_path / "S").write_text("ab\ncd\n")
    (request,) = build_requests(meta, {"max_batch_size": 4}, model="m", batch_size=2, input_data=str(tmp_path))
    tensors = {t.name: t for t in request.inputs}
    assert tensors["X"].shape == [2, 3] and tensors["X"].data.tolist() == [[1, 2, 3], [1, 2, 3]]
    assert tensors["S"].data.tolist() == [[b"ab", b"cd"], [b"ab", b"cd"]]
    assert not has_streams(str(tmp_path)) and read_validation_data(str(tmp_path), meta, streams=False) is None
    (tmp_path / "X").write_bytes(b"\0" * 8)  # two INT32s where the model takes three
    with pytest.raises(PerfkitError, match=f"--input-data {tmp_path}"):
        build_requests(meta, {"max_batch_size": 4}, model="m", input_data=str(tmp_path))
    (tmp_path / "S").unlink()
    with pytest.raises(PerfkitError, match="no file 'S' for input 'S'"):
        build_requests(meta, {"max_batch_size": 4}, model="m", input_data=str(tmp_path))


# --------------------------------------------------------------------------------------------------
# What the target flags do


def test_output_tensor_format_json_asks_http_for_json_outputs() -> None:
    assert _spec("--output-tensor-format", "json", "-u", "h:1").target.json_outputs
    assert not _spec("-u", "h:1").target.json_outputs
    with pytest.raises(PerfkitError, match="--output-tensor-format json applies to HTTP only"):
        _spec("--output-tensor-format", "json", "-i", "grpc", "-u", "h:1")
    from perfkit.wire.client import make_client

    client = make_client("h:1", "http", binary_outputs=False)
    from v2kit import codec as v2

    request = v2.InferRequest("m", inputs=[v2.InferTensor("X", "INT32", [1], np.array([1], "int32"))],
                              outputs=[v2.RequestedOutput("Y")])  # fmt: skip
    body = client.prepare(request).payload
    assert b'"binary_data": false' in body or b'"binary_data":false' in body, body


@pytest.mark.parametrize(("coding", "inflate"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_grpc_compression_compresses_each_request_message(coding: str, inflate: Any) -> None:
    assert _spec("--grpc-compression-algorithm", coding, "-i", "grpc", "-u", "h:1").target.grpc_compression == coding
    with pytest.raises(PerfkitError, match="--grpc-compression-algorithm applies to -i grpc only"):
        _spec("--grpc-compression-algorithm", coding, "-u", "h:1")
    message = pb.ModelInferRequest(model_name="m" * 300).SerializeToString()
    channel = grpc_channel.Channel("127.0.0.1", 1, compression=coding)
    call = channel.encode("/inference.GRPCInferenceService/ModelInfer", message)
    assert call.body[0] == 1 and inflate(call.body[5:]) == message and len(call.body) < len(message)
    assert b"grpc-encoding" in call.block and coding.encode() in call.block
    streamed = channel.stream_message(message)
    assert streamed[0] == 1 and inflate(streamed[5:]) == message
    plain = grpc_channel.Channel("127.0.0.1", 1)
    assert plain.encode("/p/M", message).body[:1] == b"\x00" and plain.stream_message(message)[5:] == message


def test_a_compressed_call_is_answered_by_the_server() -> None:
    async def main() -> tuple[int, str]:
        servicer = Servicer()
        servicer.release.set()
        server, port = await start(servicer)
        channel = grpc_channel.Channel("127.0.0.1", port, compression="gzip")
        message = pb.ModelInferRequest(model_name="m" * 300).SerializeToString()
        call = await channel.call(channel.encode("/inference.GRPCInferenceService/ModelInfer", message))
        await channel.close()
        await server.stop(1)
        return call.status, pb.ModelInferResponse.FromString(call.message).model_name

    with asyncio.Runner() as runner:
        assert runner.run(asyncio.wait_for(main(), 20)) == (0, "m" * 300)


# --------------------------------------------------------------------------------------------------
# TLS


def test_ssl_grpc_use_ssl_takes_true_after_it_but_refuses_false(capsys: pytest.CaptureFixture[str]) -> None:
    assert _spec("-i", "grpc", "-u", "h:1", "--ssl-grpc-use-ssl", "true").target.tls.grpc_use_ssl
    assert _spec("-i", "grpc", "-u", "h:1", "--ssl-grpc-use-ssl").target.tls.grpc_use_ssl
    with pytest.raises(SystemExit):
        main(["sweep", "-i", "grpc", "-u", "h:1", "--ssl-grpc-use-ssl", "false"])
    err = capsys.readouterr().err
    assert "usage: perfkit sweep" in err and "uses TLS even after 'false'" in err, err


def test_der_certificates_are_refused_with_the_conversion(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sweep", "-u", "https://h:1", "--ssl-https-client-certificate-type", "DER"])
    assert "openssl x509 -inform DER" in capsys.readouterr().err


def test_client_certificates_are_loaded_into_the_tls_contexts(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("client.example")
    chain, key = tmp_path / "chain.pem", tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(key))
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(chain), append=True)
    tls = TlsSpec(grpc_use_ssl=True, grpc_client_key=key, grpc_client_chain=chain, https_client_cert=chain,
                  https_client_key=key, https_verify_host=False)  # fmt: skip
    assert tls.grpc_client_certificate() == (key.read_bytes(), chain.read_bytes())
    https = tls.https_context()
    assert https.check_hostname is False and https.verify_mode == ssl.CERT_REQUIRED
    tls.grpc_context(None)  # loads the chain and key, or raises
    broken = TlsSpec(https_client_cert=key)  # a key is no certificate
    with pytest.raises(PerfkitError, match="--ssl-https-client-certificate-file .* cannot load"):
        broken.https_context()
    spec = _spec("-u", "https://h:1", "--ssl-https-client-certificate-file", str(chain),
                 "--ssl-https-private-key-file", str(key), "--ssl-https-verify-host", "1")  # fmt: skip
    assert (spec.target.tls.https_client_cert, spec.target.tls.https_client_key) == (chain, key)
    assert spec.target.tls.https_verify_host
    with pytest.raises(PerfkitError, match="go together: give both"):
        _spec("-i", "grpc", "-u", "h:1", "--ssl-grpc-use-ssl", "--ssl-grpc-private-key-file", str(key))
    with pytest.raises(PerfkitError, match="give -u https://"):
        _spec("-u", "h:1", "--ssl-https-verify-host", "0")


def test_trace_flags_are_accepted_with_one_note_saying_where_tracing_is_set() -> None:
    notes = _notes("--trace-level", "TIMESTAMPS", "--trace-level", "TENSORS", "--trace-rate", "10", "--log-frequency", "5")
    assert notes == [
        "note: --trace-level, --trace-rate, --log-frequency ignored: perfkit leaves the server's trace settings as "
        "they are: set them on the server (tritonserver --trace-config, or POST /v2/trace/setting)"
    ]
