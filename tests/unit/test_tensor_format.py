"""HTTP tensor formats from the server's extensions (TargetSpec.with_tensor_format), and what the
console says of failed requests: the server's own words (v2kit.codec.decode_error on recorded
bodies of MLServer 1.7.1 and KServe 0.21), each distinct one once, with the flag that may help."""

from __future__ import annotations

import numpy as np
import pytest

from perfkit.target import TargetSpec
from perfkit.wire.replies import MESSAGES_PER_KIND, TEXTS_PER_KIND, FailureLog, failure_line
from v2kit import codec as v2

# GET /v2 of each server, as they answered (Triton 2.51's list shortened)
REFERENCE = {"name": "perfkit-reference", "version": "0.1", "extensions": ["binary_tensor_data", "statistics"]}
TRITON = {"name": "triton", "version": "2.51.0", "extensions": ["classification", "binary_tensor_data", "statistics"]}
MLSERVER = {"name": "mlserver", "version": "1.7.1", "extensions": []}
KSERVE = {"name": "kserve", "version": "0.21.0", "extensions": ["model_repository_extension"]}


def _settled(server: dict[str, object], json_tensors: bool | None = None, json_outputs: bool | None = None,
             protocol: str = "http") -> tuple[tuple[bool | None, bool | None], str]:  # fmt: skip
    target = TargetSpec("h:1", protocol, json_tensors=json_tensors, json_outputs=json_outputs)
    settled, note = target.with_tensor_format(server)
    return (settled.json_tensors, settled.json_outputs), note


@pytest.mark.parametrize("server", [REFERENCE, TRITON], ids=["reference", "triton"])
def test_a_server_listing_binary_tensor_data_gets_binary_tensors_as_before(server: dict[str, object]) -> None:
    assert _settled(server) == ((False, False), "")


@pytest.mark.parametrize("server", [MLSERVER, KSERVE, {"name": "bare"}, {"extensions": None}])
def test_a_server_without_binary_tensor_data_gets_json_tensors_and_outputs_said_once(
    server: dict[str, object],
) -> None:
    formats, note = _settled(server)
    assert formats == (True, True)
    assert (
        "does not list the binary_tensor_data extension: JSON tensors (--input-tensor-format binary to force)" in note
    )
    if server is MLSERVER:
        assert note.startswith("mlserver 1.7.1 at h:1 does not list")


def test_a_chosen_format_wins_over_the_servers_extensions() -> None:
    assert _settled(MLSERVER, json_tensors=False, json_outputs=False) == ((False, False), "")
    assert _settled(REFERENCE, json_tensors=True, json_outputs=True) == ((True, True), "")
    # binary inputs forced; the outputs, not chosen, follow the server and are said
    formats, note = _settled(MLSERVER, json_tensors=False)
    assert formats == (False, True) and "JSON outputs (--output-tensor-format binary to force)" in note


def test_grpc_carries_raw_contents_whatever_the_extensions() -> None:
    assert _settled(MLSERVER, protocol="grpc") == ((False, False), "")


# --- the server's words -------------------------------------------------------------------------------

MLSERVER_BINARY_500 = b"""Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/starlette/_exception_handler.py", line 42, in wrapped_app
    await app(scope, receive, sender)
  File "/venv/lib/python3.11/site-packages/fastapi/encoders.py", line 59, in <lambda>
    bytes: lambda o: o.decode(),
                     ^^^^^^^^^^
UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80 in position 102: invalid start byte"""


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (MLSERVER_BINARY_500, "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80 in position 102: invalid start byte"),
        (b'{"error":"AttributeError : \'InferOutput\' object has no attribute \'set_numpy\'"}',
         "AttributeError : 'InferOutput' object has no attribute 'set_numpy'"),
        (b'{"detail":"Model addone not found"}', "Model addone not found"),
        (b'{"detail":[{"loc":["body","inputs"],"msg":"Field required"}]}',
         '[{"loc":["body","inputs"],"msg":"Field required"}]'),
        (b"Internal Server Error", "Internal Server Error"),
    ],
    ids=["mlserver-traceback", "kserve-error", "fastapi-detail", "fastapi-validation", "plain-text"],
)  # fmt: skip
def test_decode_error_finds_the_servers_words(body: bytes, words: str) -> None:
    assert v2.decode_error(body) == words


def test_each_distinct_text_is_kept_for_the_console_once_and_a_few_of_a_kind() -> None:
    log = FailureLog()
    for n in range(MESSAGES_PER_KIND + 5):
        log.note("HTTP 500", f"boom {n % (TEXTS_PER_KIND + 2)}")
        log.note("HTTP 500", "boom 0")
    log.note("connection reset", "ConnectionResetError: [Errno 104] Connection reset by peer")
    said = log.unsaid()
    assert said[:TEXTS_PER_KIND] == [("HTTP 500", f"boom {n}") for n in range(TEXTS_PER_KIND)]
    assert said[TEXTS_PER_KIND:] == [("connection reset", "ConnectionResetError: [Errno 104] Connection reset by peer")]
    log.note("HTTP 500", "boom 0")
    assert log.unsaid() == []  # said already
    assert not log.wanted("HTTP 500") and log.wanted("HTTP 503")


def _line(kind: str, text: str, protocol: str = "http", binary: bool = True) -> str:
    return failure_line(kind, text, protocol=protocol, binary_inputs=binary, binary_outputs=binary)


def test_a_failure_line_names_the_flag_that_may_help() -> None:
    line = _line("HTTP 500", v2.decode_error(MLSERVER_BINARY_500))
    assert line.startswith("HTTP 500: UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80")
    assert line.endswith("perfkit sent binary tensors (the binary_tensor_data extension), which the server may "
                         "not read: try --input-tensor-format json")  # fmt: skip
    assert "try --input-tensor-format json" in _line("connection reset", "ConnectionResetError: reset")
    assert _line("HTTP 500", "boom", binary=False) == "HTTP 500: boom"  # JSON was sent: the flag would not help
    assert _line("grpc INTERNAL", "boom", protocol="grpc") == "grpc INTERNAL: boom"
    assert "--output-tensor-format json" in _line("bad response", "malformed")
    assert "-H 'Authorization: Bearer TOKEN'" in _line("HTTP 401", "")
    assert len(_line("HTTP 500", "x" * 5000, binary=False)) < 450  # a whole traceback or echo is cut


def test_a_server_that_lists_binary_tensors_gets_no_format_hint() -> None:
    # Triton's 500 for a python model whose stub died: the tensors were read, the format is not why.
    text = "Stub process 'echo_0_0' is not healthy."
    for kind in ("HTTP 500", "bad response", "connection reset"):
        line = failure_line(kind, text, protocol="http", binary_inputs=True, binary_outputs=True, binary_listed=True)
        assert line == f"{kind}: {text}"


# --- outputs answered in JSON (HTTP) or in typed contents (gRPC), as validation_data reads them ------

KSERVE_JSON_ANSWER = (
    b'{"model_name":"addone","model_version":null,"id":"0","parameters":null,"outputs":[{"name":"OUTPUT0",'
    b'"shape":[1,2],"datatype":"FP32","parameters":null,"data":[2.0,3.0]}]}'
)


def test_kserve_json_outputs_with_null_fields_decode() -> None:
    (output,) = v2.decode_infer_response(KSERVE_JSON_ANSWER, None).outputs
    assert (output.name, output.datatype, output.data.tolist()) == ("OUTPUT0", "FP32", [[2.0, 3.0]])


def test_grpc_outputs_in_typed_contents_read_as_raw_bytes() -> None:
    from tritonclient.grpc import service_pb2 as pb

    from perfkit.wire.grpc.client import _raw_outputs

    want = np.array([[2.0, 3.0]], np.float32).tobytes()
    typed = pb.ModelInferResponse(model_name="addone")  # KServe's python server answers so
    output = typed.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 2])
    output.contents.fp32_contents.extend([2.0, 3.0])
    assert _raw_outputs(typed) == {"OUTPUT0": want}
    raw = pb.ModelInferResponse(model_name="addone", raw_output_contents=[want])  # MLServer, Triton
    raw.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 2])
    assert _raw_outputs(raw) == {"OUTPUT0": want}
