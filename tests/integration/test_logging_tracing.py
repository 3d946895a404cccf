"""The logging and trace extensions through tritonclient's own calls, over HTTP and gRPC: the settings
each answers and changes, a python model's `pb_utils.Logger` lines in the log file as the settings
allow, and `--trace-config`'s trace file; and the same calls on real tritonserver 2.51, whose answers
must have the same keys and kinds of values, and whose refusals the same words.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.core import log_settings
from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config, running_triton

pytestmark = pytest.mark.integration

MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_info("info line")
        pb_utils.Logger.log_warn("warning line")
        pb_utils.Logger.log_error("error line")
        pb_utils.Logger.log_verbose("verbose line")
        pb_utils.Logger.log("leveled line", pb_utils.Logger.LogLevel.WARNING)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

CONFIG = """\
name: "logged"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(MODEL.splitlines(), 1) if f'"{text}"' in line)


def model_line(severity: str, text: str) -> re.Pattern[str]:
    """A line of Triton's default format that `pb_utils.Logger` wrote from model.py."""
    return re.compile(rf'^{severity}\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} \d+ model\.py:{line_of(text)}\] "{text}"$', re.M)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logging") / "models"
    (root / "logged" / "1").mkdir(parents=True)
    (root / "logged" / "config.pbtxt").write_text(CONFIG)
    (root / "logged" / "1" / "model.py").write_text(MODEL)
    return root


@pytest.fixture
def installed_log() -> Iterator[None]:
    """The root logger as the test found it, after the test installed the server's log on it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


@pytest.fixture
def server(repository: Path, tmp_path: Path, installed_log: None) -> Iterator[ReferenceServer]:
    config = loopback_config(repository, log_file=tmp_path / "server.log")
    with running_server(config) as running:
        log_settings.install(running.log_settings)
        yield running


def infer_http(url: str, request_id: str = "") -> None:
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    result = httpclient.InferenceServerClient(url).infer("logged", [tensor], request_id=request_id)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))


def infer_grpc(url: str, request_id: str = "") -> None:
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    grpcclient.InferenceServerClient(url).infer("logged", [tensor], request_id=request_id)


def test_model_log_lines_follow_the_settings(server: ReferenceServer, tmp_path: Path) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    log = tmp_path / "server.log"
    infer_http(server.http_url)
    first = log.read_text()
    for severity, text in (("I", "info line"), ("W", "warning line"), ("E", "error line"), ("W", "leveled line")):
        assert model_line(severity, text).search(first), first
    assert "verbose line" not in first

    # info off and verbose on, over gRPC: the next request logs no info line and a verbose one
    answer = grpc.update_log_settings({"log_info": False, "log_verbose_level": 1}, as_json=True)
    assert answer["settings"]["log_info"] == {"bool_param": False}
    infer_http(server.http_url)
    second = log.read_text()[len(first) :]
    assert "info line" not in second
    assert model_line("W", "warning line").search(second)
    assert model_line("I", "verbose line").search(second), second

    # ISO8601, over HTTP
    assert http.update_log_settings({"log_info": True, "log_verbose_level": 0, "log_format": "ISO8601"}) == {
        "log_file": str(log), "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
        "log_format": "ISO8601",
    }  # fmt: skip
    infer_http(server.http_url)
    third = log.read_text()[len(first) + len(second) :]
    iso = rf'^\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ model\.py:{line_of("info line")}\] "info line"$'
    assert re.search(iso, third, re.M), third


def test_settings_through_tritonclient(server: ReferenceServer, tmp_path: Path) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert set(http.get_server_metadata()["extensions"]) >= {"trace", "logging"}
    assert grpc.get_log_settings(as_json=True)["settings"] == {
        "log_file": {"string_param": str(tmp_path / "server.log")}, "log_info": {"bool_param": True},
        "log_warning": {"bool_param": True}, "log_error": {"bool_param": True},
        "log_verbose_level": {"uint32_param": 0}, "log_format": {"string_param": "default"},
    }  # fmt: skip
    assert http.get_trace_settings() == {
        "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0", "trace_file": "",
        "trace_mode": "triton",
    }  # fmt: skip
    # Turning tracing on needs a file, which only the command line gives.
    with pytest.raises(InferenceServerException, match="Attempting to set invalid trace setting"):
        grpc.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    # A model's own setting, and back to the global one when cleared.
    model = grpc.update_trace_settings(model_name="logged", settings={"trace_rate": "7"}, as_json=True)
    assert model["settings"]["trace_rate"] == {"value": ["7"]}
    assert http.get_trace_settings()["trace_rate"] == "1000"
    http.update_trace_settings(settings={"trace_count": "4"})
    assert http.get_trace_settings(model_name="logged")["trace_count"] == "4"  # not its own: the global one
    assert http.update_trace_settings(model_name="logged", settings={"trace_rate": None}) == http.get_trace_settings()
    with pytest.raises(InferenceServerException, match="Request for unknown model : nosuch"):
        grpc.get_trace_settings(model_name="nosuch")


def test_trace_config_writes_tritons_trace_json(repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    config = loopback_config(repository, trace_config=(f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1"))
    with running_server(config) as running:
        for n in range(3):
            infer_http(running.http_url, f"h{n}")
            infer_grpc(f"127.0.0.1:{running.grpc_port}", f"g{n}")
    traces: dict[int, dict[str, Any]] = {}
    for event in json.loads(trace_file.read_text()):
        trace = traces.setdefault(event["id"], {"stamps": []})
        if "timestamps" in event:
            trace["stamps"] += [(t["name"], t["ns"]) for t in event["timestamps"]]
        else:
            trace.update(event)
    assert sorted(t["request_id"] for t in traces.values()) == ["g0", "g1", "g2", "h0", "h1", "h2"]
    for trace in traces.values():
        assert (trace["model_name"], trace["model_version"]) == ("logged", 1)
        front = ("HTTP_RECV", "HTTP_SEND") if trace["request_id"][0] == "h" else ("GRPC_WAITREAD", "GRPC_SEND")
        names = [name for name, _ in trace["stamps"]]
        assert names == [
            f"{front[0]}_START", f"{front[0]}_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
            "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE",
            f"{front[1]}_START", f"{front[1]}_END",
        ]  # fmt: skip
        times = [ns for _, ns in trace["stamps"]]
        assert times == sorted(times), trace


def test_settings_live_in_the_core_with_frontend_workers(repository: Path) -> None:
    with running_server(loopback_config(repository, frontend_workers=2)) as running:
        httpclient.InferenceServerClient(running.http_url).update_log_settings({"log_warning": False})
        for _ in range(4):  # fresh connections, spread over the workers
            assert httpclient.InferenceServerClient(running.http_url).get_log_settings()["log_warning"] is False
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
            assert grpc.get_log_settings(as_json=True)["settings"]["log_warning"] == {"bool_param": False}
        running.log_settings.apply({"log_warning": True})


# --- against real tritonserver 2.51 --------------------------------------------------------------------


def shape(value: Any) -> Any:
    """The keys and kinds of an answer, without its values."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value[:1]]
    return type(value).__name__


def refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """The status and message of `call(*args, **kwargs)`, which must fail."""
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value.status()), caught.value.message()


BAD_LOG = [{"log_file": "x.log"}, {"log_format": "xml"}]
#: Values of the wrong kind, which tritonclient's gRPC client refuses before sending.
BAD_LOG_JSON = [{"log_info": "false"}, {"log_verbose_level": -1}, {"log_format": 1}]
BAD_TRACE = [
    {"trace_file": "x.json"}, {"trace_rate": "abc"}, {"trace_count": "-2"}, {"trace_count": "99999999999"},
    {"trace_level": ["OFF", "TIMESTAMPS"]},
]  # fmt: skip


@pytest.mark.peers
def test_answers_and_refusals_as_tritons(peers: Path, repository: Path, tmp_path: Path) -> None:
    entries = ("level=TIMESTAMPS", "rate=1")
    ours_config = loopback_config(repository, trace_config=(f"triton,file={tmp_path / 'ours.json'}", *entries))
    triton_args = [f"--trace-config=triton,file={tmp_path / 'triton.json'}", *(f"--trace-config={e}" for e in entries)]
    with (
        running_triton(peers, repository, extra_args=triton_args, auto_complete=False) as triton,
        running_server(ours_config) as ours,
    ):
        answers: dict[str, list[Any]] = {}
        for name, (http_url, grpc_url) in {
            "triton": (triton.http_url, triton.grpc_url),
            "ours": (ours.http_url, f"127.0.0.1:{ours.grpc_port}"),
        }.items():
            http = httpclient.InferenceServerClient(http_url)
            grpc = grpcclient.InferenceServerClient(grpc_url)
            got = answers[name] = [
                shape(http.get_log_settings()),
                shape(grpc.get_log_settings(as_json=True)),
                shape(http.update_log_settings({"log_verbose_level": 0})),
                shape(grpc.update_log_settings({"log_info": True}, as_json=True)),
                http.get_trace_settings()["trace_level"],
                shape(http.get_trace_settings(model_name="logged")),
                shape(grpc.get_trace_settings(as_json=True)),
                http.update_trace_settings(model_name="logged", settings={"trace_rate": "5"})["trace_rate"],
                http.get_trace_settings()["trace_rate"],
                grpc.update_trace_settings(model_name="logged", settings={"trace_rate": None}, as_json=True),
            ]
            got += [refusal(http.update_log_settings, bad) for bad in BAD_LOG + BAD_LOG_JSON]
            got += [refusal(grpc.update_log_settings, bad) for bad in BAD_LOG]
            got += [refusal(http.update_trace_settings, settings=bad) for bad in BAD_TRACE]
            got += [refusal(grpc.update_trace_settings, settings=bad) for bad in BAD_TRACE]
            got.append(refusal(http.get_trace_settings, model_name="nosuch"))
        # The trace file's name differs, and so its value; everything else must agree.
        for answer in (answers["triton"][9], answers["ours"][9]):
            answer["settings"].pop("trace_file")
        assert answers["ours"] == answers["triton"]
        infer_http(triton.http_url)
        # Triton's stub sends its log lines from a thread of their own: they may follow the answer.
        deadline = time.monotonic() + 30
        while not model_line("W", "leveled line").search(log := triton.log_path.read_text()):
            assert time.monotonic() < deadline, log
            time.sleep(0.05)
        assert model_line("I", "info line").search(log)
