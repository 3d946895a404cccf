"""The trace extension's settings and files (`core/tracing.py`): Triton's fallback and clearing
rules, its sampling, its words for bad values, and the trace JSON it writes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from reference_server.core import tracing
from reference_server.core.tracing import Tracing, startup_settings
from reference_server.errors import InternalError, InvalidArgument, ServerError, Unsupported


def traced(tmp_path: Path, *entries: str) -> Tracing:
    return Tracing(startup_settings((f"triton,file={tmp_path / 'trace.json'}", *entries)))


def test_start_up_settings_from_trace_config(tmp_path: Path) -> None:
    setting = startup_settings(["level=TIMESTAMPS", "level=TENSORS", "rate=5", "count=3", "triton,log-frequency=2",
                                f"triton,file={tmp_path}/t.json"])  # fmt: skip
    assert setting.as_dict() == {
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "5", "trace_count": "3", "log_frequency": "2",
        "trace_file": f"{tmp_path}/t.json", "trace_mode": "triton",
    }  # fmt: skip
    assert Tracing().settings()["trace_level"] == ["OFF"]
    assert Tracing().settings()["trace_rate"] == "1000"
    assert not Tracing().active


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("level", "option format is '<trace mode>,<setting>=<value>'"),
        (",level=OFF", "No trace mode specified"),
        ("jaeger,file=x", "invalid value for trace mode option: jaeger"),
        ("level=LOUD", "invalid value for trace level option: loud"),
        ("rate=often", "expected an integer, got often"),
        ("count=-2", "trace count must be -1 (no limit) or more"),
    ],
)
def test_bad_trace_config(entry: str, fragment: str) -> None:
    with pytest.raises(ServerError, match=None) as caught:
        startup_settings([entry])
    assert fragment in caught.value.message


def test_opentelemetry_is_refused_by_name() -> None:
    with pytest.raises(Unsupported, match="opentelemetry"):
        startup_settings(["mode=opentelemetry"])


def test_a_models_setting_falls_back_to_the_global_one_and_clears(tmp_path: Path) -> None:
    trace = traced(tmp_path, "level=TIMESTAMPS", "rate=1")
    trace.update("m", {"rate": 7})
    trace.update("", {"rate": 3, "count": 5})
    assert (trace.settings("m")["trace_rate"], trace.settings("m")["trace_count"]) == ("7", "5")
    trace.update("m", {"rate": None})  # cleared: the global value again, and no setting of its own left
    assert trace.settings("m") == trace.settings()
    trace.update("", {"level": tracing.TENSORS})
    trace.update("", {"level": None})  # a cleared global field returns to its start-up value
    assert trace.settings()["trace_level"] == ["TIMESTAMPS"]
    assert trace.settings()["trace_rate"] == "3"  # set before, and kept
    trace.update("", {"count": None})
    assert trace.settings()["trace_count"] == "-1"


def test_a_setting_without_a_file_cannot_trace() -> None:
    with pytest.raises(InvalidArgument, match="Attempting to set invalid trace setting :trace file name is not given"):
        Tracing().update("", {"level": tracing.TIMESTAMPS})
    off = Tracing()
    off.update("", {"level": tracing.OFF, "rate": 9})  # turning tracing off is always allowed
    assert off.settings()["trace_rate"] == "9"


def test_rate_and_count_decide_which_requests_are_traced(tmp_path: Path) -> None:
    trace = traced(tmp_path, "level=TIMESTAMPS", "rate=2", "count=2")
    assert trace.active
    taken = [trace.sample("m", 1, "") is not None for _ in range(6)]
    assert taken == [False, True, False, True, False, False]
    assert trace.settings()["trace_count"] == "0"  # Triton reports what is left
    assert not trace.active


def events(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def run_one(trace: Tracing, request_id: str = "") -> None:
    record = trace.sample("m", 1, request_id)
    assert record is not None
    record.start(False, 1000)
    record.record_success(500, 100, 10, 200, 20)
    record.answered(lambda response: None, False, "response")


def test_trace_json_as_triton_writes_it(tmp_path: Path) -> None:
    trace = traced(tmp_path, "level=TIMESTAMPS", "rate=1")
    run_one(trace, "r-1")
    run_one(trace)
    trace.close()
    written = events(tmp_path / "trace.json")
    assert written[0] == {"id": 1, "model_name": "m", "model_version": 1, "request_id": "r-1"}
    names = [e["timestamps"][0]["name"] for e in written[1:] if e["id"] == 1]
    assert names == [
        "HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]  # fmt: skip
    stamps = [e["timestamps"][0]["ns"] for e in written if e["id"] == 1 and "timestamps" in e]
    assert stamps == sorted(stamps)
    assert stamps[4:9] == [1100, 1110, 1310, 1330, 1500]
    assert {e["id"] for e in written} == {1, 2}
    assert "request_id" not in [e for e in written if e["id"] == 2][0]


def test_log_frequency_writes_indexed_files(tmp_path: Path) -> None:
    trace = traced(tmp_path, "level=TIMESTAMPS", "rate=1", "triton,log-frequency=2")
    for _ in range(3):
        run_one(trace)
    assert {e["id"] for e in events(tmp_path / "trace.json.0")} == {1, 2}
    assert not (tmp_path / "trace.json.1").exists()
    trace.close()  # what is held is written at shutdown, to the next index
    assert {e["id"] for e in events(tmp_path / "trace.json.1")} == {3}
    assert not (tmp_path / "trace.json").exists()


def test_a_replaced_setting_writes_what_it_held(tmp_path: Path) -> None:
    trace = traced(tmp_path, "level=TIMESTAMPS", "rate=1")
    run_one(trace)
    trace.update("", {"rate": 1})
    run_one(trace)
    trace.close()
    assert {e["id"] for e in events(tmp_path / "trace.json")} == {1, 2}


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ({"trace_file": "x"}, Unsupported, "trace file location can not be updated through network protocol"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, InvalidArgument, "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": "TIMESTAMPS"}, InternalError, "attempt to access JSON non-array as array"),
        ({"trace_rate": 5}, InternalError, "attempt to access JSON non-string as string"),
        ({"trace_rate": "abc"}, InvalidArgument, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_count": "-2"}, InvalidArgument, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        (
            {"trace_count": "99999999999"},
            InvalidArgument,
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 99999999999",
        ),
    ],
)
def test_http_updates_refused_in_tritons_words(body: dict[str, Any], error: type[ServerError], message: str) -> None:
    with pytest.raises(error) as caught:
        tracing.changes_from_json(body)
    assert caught.value.message == message


def test_http_updates_read_as_tritons_stoi() -> None:
    assert tracing.changes_from_json({"trace_rate": "12abc", "log_frequency": " 3", "bogus": 1}) == {
        "rate": 12,
        "log_frequency": 3,
    }
    assert tracing.changes_from_json({"trace_rate": "-3"}) == {"rate": 2**32 - 3}  # uint32, as Triton keeps it
    assert tracing.changes_from_json({"trace_level": ["BOGUS"]}) == {}
    assert tracing.changes_from_json({"trace_level": None, "trace_count": None}) == {"level": None, "count": None}
    assert tracing.changes_from_json([1]) == {}


def test_grpc_updates() -> None:
    assert tracing.changes_from_proto({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": []}) == {
        "level": 3,
        "rate": None,
    }
    with pytest.raises(InvalidArgument, match="expect only 1 value for 'trace_count'"):
        tracing.changes_from_proto({"trace_count": ["1", "2"]})
    with pytest.raises(InvalidArgument, match="Expecting value >= -1, got: -5"):
        tracing.changes_from_proto({"trace_count": ["-5"]})


def test_an_unwritable_trace_file_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trace = Tracing(startup_settings((f"triton,file={tmp_path}/missing/trace.json", "level=TIMESTAMPS", "rate=1")))
    with caplog.at_level(logging.ERROR):
        for _ in range(tracing._FLUSH_EVERY):
            run_one(trace)
        trace.close()
    assert "failed creating trace file" in caplog.text
    run_one(trace)  # after shutdown: nothing is opened again
    assert not (tmp_path / "missing").exists()
